// Command layers measures what layered EROFS environments save, against
// the plain-runtime way, in one run over one ~500 MB image:
//
//	sudo go run ./bench/layers -rounds 5
//
// (a) Per sandbox start, the time to a ready root filesystem and the bytes
// it writes to disk. warren's path: the environment's EROFS layers (base,
// workspace, toolkit) fetched from the blob store into the node cache,
// mounted once per node, and composed with a fresh overlayfs upper dir —
// cold (nothing on the node), cold-env (the base and toolkit, shared by
// many environments, already on the node; the workspace is new) and warm
// (everything cached and mounted: a later start of the same environment);
// and lazy (a cold node that loads layers on demand, package lazy: the
// root is ready once the manifests and the EROFS metadata its mounts read
// are fetched; file data comes on first read, which bench/lazy measures).
// The peer: extracting a tar.gz of the same files into a fresh directory,
// as a runtime that unpacks its image per sandbox does, with GNU tar and
// with Go (compress/gzip and warren's rootfs.WriteTar); the faster is the
// peer the ratios use.
//
// (b) Full sandbox creates through the REST API (container backend, runc)
// on the same environment, cold once and then warm, for scale.
//
// (c) Upgrading one toolkit across -envs environments: layered (publish
// harness@8 once, then one new environment version each that re-points
// to it) against rebuilding each environment's full image (measured for
// -rebuild images and extrapolated).
//
// Each start runs in its own child process (a worker re-exec of this
// program, or tar), so its bytes written are the kernel's write_bytes
// accounting of that process and its children (getrusage ru_oublock x 512):
// data dirtied in the page cache, counted whether or not it reaches the
// disk before it is deleted. Filesystem metadata (inodes, directories,
// journal) is not in it, so a second figure, the blocks the start left
// allocated (du), is printed beside it.
//
// By default everything (warren's data dir, the node cache, the sandboxes'
// dirs, the extractions, the sources) lives on a fresh 12 GiB ext4 made
// for the run on a loop device over a sparse file (-fs loop): a node's
// data disk with mkfs.ext4's defaults, untouched by earlier runs or other
// work on the host. -fs host works on -dir's filesystem as it is instead.
//
// It starts `warren up` in-process on a temporary data dir, and removes
// everything it made (mounts, sandboxes, the loop device, files) when it
// ends, also on error or interrupt (SIGINT, SIGTERM).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/daemon"
)

type config struct {
	rounds, warm, apiWarm, envs, rebuild int
	rootfs, script, dir, fs              string
	sizeMB                               int64
}

func main() {
	var cfg config
	worker := flag.String("worker", "", "internal: run one measured start described by this JSON, print its result")
	flag.IntVar(&cfg.rounds, "rounds", 5, "rounds of per-start measurements (report median and spread)")
	flag.IntVar(&cfg.warm, "warm", 10, "warm starts per round")
	flag.IntVar(&cfg.apiWarm, "api-warm", 5, "warm full sandbox creates through the API")
	flag.IntVar(&cfg.envs, "envs", 100, "environments the toolkit upgrade reaches")
	flag.IntVar(&cfg.rebuild, "rebuild", 3, "full images actually rebuilt for the non-layered upgrade (the rest is extrapolated)")
	flag.StringVar(&cfg.rootfs, "rootfs", "", "a debian-python rootfs built earlier by scripts/build-debian-python (default: build one in this run)")
	flag.StringVar(&cfg.script, "script", "scripts/build-debian-python", "the debian-python build script, when -rootfs is not given")
	flag.Int64Var(&cfg.sizeMB, "size", 500, "minimum image size in MB: synthetic files top it up if the host's filler directories fall short")
	flag.StringVar(&cfg.dir, "dir", "", "where the temporary dir goes (default: the system temp dir); must be a disk filesystem")
	flag.StringVar(&cfg.fs, "fs", "loop", `where the run works: "loop", a fresh 12 GiB ext4 on a loop device over a file in -dir; or "host", -dir's own filesystem as it is`)
	flag.Parse()
	if *worker != "" {
		os.Exit(runWorker(*worker))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench/layers:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (mounts, debootstrap, runc)")
	}
	if cfg.rounds < 1 || cfg.warm < 1 || cfg.envs < 1 || cfg.rebuild < 1 {
		return fmt.Errorf("-rounds, -warm, -envs and -rebuild must be at least 1")
	}
	dir, err := os.MkdirTemp(cfg.dir, "warren-bench-layers-")
	if err != nil {
		return err
	}
	dir, _ = filepath.Abs(dir)
	work := dir
	dataDir := filepath.Join(work, "warren")
	// Cleanup runs last, whatever happened: sandboxes, the daemon, then
	// every mount under dir, and only then the files.
	var stopDaemon func()
	var c *client.Client
	defer func() {
		if c != nil {
			deleteSandboxes(c)
		}
		if stopDaemon != nil {
			stopDaemon()
		}
		if cerr := cleanup(dir, dataDir); cerr != nil {
			fmt.Fprintln(os.Stderr, "bench/layers: cleanup:", cerr)
			if err == nil {
				err = cerr
			}
		}
	}()
	began := time.Now()
	fmt.Printf("bench/layers: %d rounds, %d warm starts per round, %d environments, %d full rebuilds, %s\n",
		cfg.rounds, cfg.warm, cfg.envs, cfg.rebuild, began.UTC().Format(time.RFC3339))
	switch cfg.fs {
	case "loop":
		if work, err = scratchFS(ctx, dir, 12<<30); err != nil {
			return err
		}
		dataDir = filepath.Join(work, "warren")
		fmt.Printf("working on a fresh ext4 (mkfs.ext4 defaults, journal) on a direct-I/O loop device over %s\n", filepath.Join(dir, "disk.img"))
	case "host":
		fmt.Printf("working in %s on the host's filesystem as it is\n", dir)
	default:
		return fmt.Errorf("-fs %q: want loop or host", cfg.fs)
	}

	img, err := prepareContent(ctx, cfg, work)
	if err != nil {
		return err
	}

	if err := benchup.FindHelpers(); err != nil { // warren-enter and co. for the container backend
		return err
	}
	dctx, cancel := context.WithCancel(ctx)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Up(dctx, daemon.UpConfig{
			DataDir: dataDir,
			Listen:  "127.0.0.1:0",
			Log:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
			Ready:   func(addr string) { ready <- addr },
		})
	}()
	stopDaemon = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			fmt.Fprintln(os.Stderr, "bench/layers: warren up did not stop within 20s")
		}
	}
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		stopDaemon = nil
		return fmt.Errorf("warren up: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	tok, err := os.ReadFile(filepath.Join(dataDir, daemon.AdminTokenFile))
	if err != nil {
		return err
	}
	c = client.New("http://"+addr, strings.TrimSpace(string(tok)))

	env, err := publish(ctx, c, img, cfg.envs)
	if err != nil {
		return err
	}
	img.print(env)

	b := &bench{cfg: cfg, dir: work, blobs: filepath.Join(dataDir, "blobs"), img: img, env: env, c: c}
	if err := b.starts(ctx); err != nil {
		return err
	}
	if err := b.apiCreates(ctx); err != nil {
		return err
	}
	if err := b.upgrade(ctx); err != nil {
		return err
	}
	fmt.Printf("\nwhole run %s\n", time.Since(began).Round(time.Second))
	return nil
}
