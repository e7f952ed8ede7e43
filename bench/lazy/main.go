// Command lazy measures layers loaded on demand against layers
// downloaded whole before the first start, in one run, on a burst of
// sandboxes from many environments against a remote blob store:
//
//	sudo go run ./bench/lazy -n 64 -envs 20 -env-mb 200 -rounds 2
//
// The store is S3 (SeaweedFS's weed) in a network namespace of the run's
// own, behind a veth link limited by tc tbf to -rate each way (default
// 1 Gbit/s: a node's share of a busy fleet's store). This kernel has no
// netem, so no latency is added to the link's: each fetch waits on the
// store's own request handling (weed's S3 gateway, filer and volume
// server, a few ms; the chunk cache's mean fetch time is printed). Over
// that store the
// run publishes a base layer (debian-python, from
// scripts/build-runtime-images) and -envs environments, each the base
// plus a workspace layer of -env-mb MB of files of random bytes (4 KiB to
// 4 MiB), through the API, with the link unlimited.
//
// Then, for each mode in turn (eager, lazy; the order alternates by
// round), a fresh `warren up` (`--lazy-layers` for lazy) on the same data
// dir with an empty node cache and the host's page cache dropped: -n
// sandboxes created at once (-conc at a time), sandbox i from environment
// i mod -envs (a fanout of n/envs, DSec's median is 3), each running, as
// its first exec, `true`, and then its task: python3 reading -read
// percent of its image's bytes (-shared of it the environment's hot set,
// read by each of its tasks, as rollouts of one task read the same
// sources; the rest its own). Reported per mode: the whole burst's time
// (first create to last task done), each sandbox's time to first exec
// (from the burst's start, as a trainer that asked for all of them at
// once waits: p50, p99) and task time,
// the bytes the node received from the store (the link's counter), and
// the bytes the agent wrote to local disk (the write_bytes of warren up
// and of its layer server, warren lazyd, and what the layer caches hold
// after).
//
// The binary measured is built from this checkout (./cmd/warren) and runs
// in a process of its own; everything the run made (namespace, link,
// sandboxes, mounts, files) is removed when it ends, also on error or
// interrupt.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/internal/image"
)

type config struct {
	n, envs, conc, rounds int
	envMB                 int64
	read, shared          float64
	rate, base            string
	cache                 string
}

func main() {
	var cfg config
	flag.IntVar(&cfg.n, "n", 64, "sandboxes in the burst")
	flag.IntVar(&cfg.envs, "envs", 20, "distinct environments")
	flag.Int64Var(&cfg.envMB, "env-mb", 200, "workspace MB per environment (on top of the shared base)")
	flag.Float64Var(&cfg.read, "read", 7, "percent of its image's bytes each task reads")
	flag.Float64Var(&cfg.shared, "shared", 0.75, "the fraction of a task's reads that every task of its environment reads too")
	flag.IntVar(&cfg.conc, "conc", 16, "creates in flight at once")
	flag.IntVar(&cfg.rounds, "rounds", 1, "rounds (each runs both modes)")
	flag.StringVar(&cfg.rate, "rate", "1gbit", "the store link's bandwidth each way (tc units)")
	flag.StringVar(&cfg.base, "base", benchup.DebianPython, "the base layer's root filesystem (needs python3)")
	flag.StringVar(&cfg.cache, "chunk-cache", "16Gi", "the lazy node's chunk cache")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench/lazy:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (network namespaces, mounts, runc)")
	}
	if cfg.n < 1 || cfg.envs < 1 || cfg.conc < 1 || cfg.rounds < 1 || cfg.read <= 0 || cfg.read > 100 {
		return fmt.Errorf("-n, -envs, -conc and -rounds must be at least 1, -read within (0, 100]")
	}
	if _, err := os.Stat(filepath.Join(cfg.base, "usr/bin/python3")); err != nil {
		return fmt.Errorf("base %s has no python3 (run scripts/build-runtime-images, or give -base): %v", cfg.base, err)
	}
	dir, err := benchup.TempDir("warren-bench-lazy-")
	if err != nil {
		return err
	}
	dataDir := filepath.Join(dir, "warren")
	var d *benchup.Daemon
	var store *netStore
	defer func() {
		if d != nil {
			deleteAll(d)
			d.Stop()
		}
		unmountUnder(dataDir)
		if store != nil {
			store.close()
		}
		os.RemoveAll(dir)
	}()
	fmt.Printf("bench/lazy: %d sandboxes from %d environments (base + %d MB each), tasks read %.0f%%, store link %s each way, %d rounds, %s\n",
		cfg.n, cfg.envs, cfg.envMB, cfg.read, cfg.rate, cfg.rounds, time.Now().UTC().Format(time.RFC3339))

	bin, err := benchup.Build(ctx, dir)
	if err != nil {
		return err
	}
	if store, err = startNetStore(ctx, dir); err != nil {
		return err
	}
	blobs := "--blobs=" + store.spec()
	fmt.Printf("store: S3 (weed) at %s in netns %s, link %s\n", store.srv.Endpoint, store.ns, store.hostIf)

	t := time.Now()
	if d, err = benchup.StartProc(ctx, bin, dataDir, blobs); err != nil {
		return err
	}
	envs, err := publish(ctx, d.Client, dir, cfg.base, cfg.envs, cfg.envMB)
	if err != nil {
		return err
	}
	var total int64
	for _, e := range envs {
		total += e.bytes
	}
	fmt.Printf("published in %s: %d environments, %s of files in all (base counted once per environment: %s)\n",
		dur(time.Since(t)), len(envs), mb(total-int64(len(envs)-1)*(envs[0].bytes-sumFiles(envs[0]))), mb(total))
	d.Stop()
	d = nil

	res := map[string][]*result{}
	for r := range cfg.rounds {
		modes := []string{"eager", "lazy"}
		if r%2 == 1 {
			modes[0], modes[1] = modes[1], modes[0]
		}
		for _, m := range modes {
			if err := coldNode(dataDir); err != nil {
				return err
			}
			args := []string{blobs}
			if m == "lazy" {
				args = append(args, "--lazy-layers", "--chunk-cache", cfg.cache)
			}
			if d, err = benchup.StartProc(ctx, bin, dataDir, args...); err != nil {
				return err
			}
			if err := store.shape(ctx, cfg.rate); err != nil {
				return err
			}
			out, err := burst(ctx, cfg, d, dataDir, store, envs, m)
			store.shape(ctx, "")
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, m, err)
			}
			out.cacheDisk = diskUsage(filepath.Join(dataDir, "node", "cache")) + diskUsage(filepath.Join(dataDir, "node", "lazy", "chunks"))
			deleteAll(d)
			d.Stop()
			d = nil
			res[m] = append(res[m], out)
			fmt.Printf("  round %d %-5s %s\n", r+1, m, out)
		}
	}
	report(res)
	return nil
}

func sumFiles(e *env) (n int64) {
	for _, f := range e.files {
		n += f.size
	}
	return n
}

// coldNode empties the node's layer caches (a node that has never run
// these environments) and drops the host's page cache, so both modes
// read the store and the disk cold.
func coldNode(dataDir string) error {
	if err := unmountUnder(dataDir); err != nil {
		return err
	}
	for _, d := range []string{"cache", "lazy", "layers"} {
		if err := os.RemoveAll(filepath.Join(dataDir, "node", d)); err != nil {
			return err
		}
	}
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

// unmountUnder detaches every mount under dir, deepest first.
func unmountUnder(dir string) error {
	ms, err := image.MountsUnder(dir)
	if err != nil {
		return err
	}
	sort.Sort(sort.Reverse(sort.StringSlice(ms)))
	for _, m := range ms {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			return fmt.Errorf("unmount %s: %w", m, err)
		}
	}
	return nil
}

func diskUsage(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

func dur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(100 * time.Microsecond).String()
	}
}

func join(ss ...string) string { return strings.Join(ss, ", ") }
