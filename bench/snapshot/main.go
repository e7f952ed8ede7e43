// Command snapshot measures snapshots and forks through warren's full
// path (REST API -> node agent -> container backend -> blob store), in one
// run, against the peers they replace:
//
//	sudo go run ./bench/snapshot -rounds 3
//	sudo go run ./bench/snapshot -rounds 3 -sizes 10,100 -forks 1,8,32
//
// Two warrens run in this process: one whose data directory is on this
// host's filesystem (ext4 here: a snapshot copies the sandbox's writable
// layer while it is frozen) and one on a fresh btrfs filesystem (a loop
// image) with a default disk limit, where every sandbox's writable layer
// is a subvolume and the copy is a btrfs snapshot of it.
//
// For each filesystem, each round:
//
//   - snapshot: a sandbox writes N MB (-sizes; half in 16 KiB files, half
//     in four large ones, random bytes), then a snapshot of it is taken;
//     reported: the freeze window, the pack (EROFS build and blob store),
//     the whole call as the client saw it; peer "tar": what `docker
//     commit` does to the same writes (tar of the upper directory,
//     extracted into a fresh directory: docker pauses the container that
//     long);
//   - restore: a sandbox created from the snapshot until its first exec
//     has answered, against the same from busybox (the plain environment
//     the snapshot is on);
//   - fork: -forks branches of a sandbox until every branch has run a
//     command (`true`), 16 at a time.
//
// Peer criu (process state) is not measured yet; each run says whether
// CRIU works on the host, and why not (package criu: Debian 12's criu
// 3.17 cannot start on kernels since 6.13). warren takes no process
// snapshots yet.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/criu"
	"github.com/warrenhq/warren/internal/daemon"
	"github.com/warrenhq/warren/internal/node"
)

func main() {
	rounds := flag.Int("rounds", 3, "rounds (report median and spread)")
	sizes := flag.String("sizes", "10,100,1000", "MB of changes to snapshot, comma-separated")
	forks := flag.String("forks", "1,8,32,100", "fork widths, comma-separated")
	keep := flag.Bool("keep", false, "keep the temporary data dirs")
	flag.Parse()
	if v, err := criu.Probe(context.Background()); err != nil {
		fmt.Printf("peer criu: not measured: %v\n", err)
	} else {
		fmt.Printf("peer criu %s: works here, but this benchmark does not measure it yet\n", v)
	}
	if err := run(*rounds, ints(*sizes), ints(*forks), *keep); err != nil {
		fmt.Fprintln(os.Stderr, "bench/snapshot:", err)
		os.Exit(1)
	}
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "bench/snapshot: bad number %q\n", f)
			os.Exit(2)
		}
		out = append(out, n)
	}
	return out
}

// peer is one warren under measurement.
type peer struct {
	name    string
	c       *client.Client
	dataDir string
}

func run(rounds int, sizes, forks []int, keep bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, err := benchup.TempDir("bench-snapshot-")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(base)
	}
	maxMB := 0
	for _, s := range sizes {
		maxMB = max(maxMB, s)
	}
	btrfs := filepath.Join(base, "btrfs")
	umount, err := btrfsLoop(filepath.Join(base, "btrfs.img"), btrfs, int64(maxMB)*6<<20+4<<30)
	if err != nil {
		return err
	}
	defer umount()

	var peers []*peer
	for _, p := range []struct {
		name, dir string
		disk      int64
	}{
		{"ext4-copy", filepath.Join(base, "ext4"), 0},
		{"btrfs", filepath.Join(btrfs, "data"), int64(maxMB)*2<<20 + 256<<20},
	} {
		cfg := daemon.UpConfig{DataDir: p.dir, Listen: "127.0.0.1:0", DefaultDisk: p.disk,
			Limits: node.Limits{CPU: 512, Sandboxes: 1000},
			Log:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
		cfg.Fn.Disabled, cfg.ImageCache = true, filepath.Join(p.dir, "no-images")
		c, err := benchup.Run(ctx, cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		peers = append(peers, &peer{name: p.name, c: c, dataDir: p.dir})
	}
	fmt.Printf("bench/snapshot: %d rounds, changes %v MB, forks %v; filesystems: %s (this host's), btrfs (loop image)\n",
		rounds, sizes, forks, fsType(base))

	res := results{}
	for r := 0; r < rounds; r++ {
		for _, p := range peers {
			for _, mb := range sizes {
				if err := p.snapshotRound(ctx, res, mb); err != nil {
					return fmt.Errorf("%s snapshot %d MB: %w", p.name, mb, err)
				}
			}
			if err := p.restoreRound(ctx, res); err != nil {
				return fmt.Errorf("%s restore: %w", p.name, err)
			}
			for _, n := range forks {
				if err := p.forkRound(ctx, res, n); err != nil {
					return fmt.Errorf("%s fork %d: %w", p.name, n, err)
				}
			}
		}
		fmt.Printf("round %d done\n", r+1)
	}
	res.print(peers, sizes, forks)
	return nil
}

// results[key] are one figure's samples in milliseconds.
type results map[string][]float64

func (r results) add(key string, d float64) { r[key] = append(r[key], d) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// small is the sandboxes' size: forks of 100 fit a 2-core node.
var small = api.Resources{CPU: 0.05, Memory: 64 << 20}

// snapshotRound writes mb MB in a sandbox and snapshots it; the peer
// "tar" copies the same upper directory as docker commit would.
func (p *peer) snapshotRound(ctx context.Context, res results, mb int) error {
	// The writer gets the host's cores: only the snapshot is measured.
	sb, err := p.c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{CPU: 2, Memory: 512 << 20}})
	if err != nil {
		return err
	}
	defer p.c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
	half := mb << 19 // bytes
	script := fmt.Sprintf(`set -e; mkdir -p /work/small /work/large
n=0; while [ $n -lt %d ]; do head -c 16384 /dev/urandom > /work/small/f$n; n=$((n+1)); done
for i in 1 2 3 4; do head -c %d /dev/urandom > /work/large/l$i; done`, half/16384, half/4)
	if r, err := p.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: script, Timeout: api.Duration(10 * time.Minute)}); err != nil {
		return err
	} else if r.ExitCode != 0 {
		return fmt.Errorf("writing %d MB: exit %d: %s", mb, r.ExitCode, r.Stderr)
	}
	start := time.Now()
	snap, err := p.c.Snapshot(ctx, sb.ID, api.SnapshotRequest{})
	if err != nil {
		return err
	}
	wall := time.Since(start)
	key := fmt.Sprintf("%s/snapshot %d MB", p.name, mb)
	res.add(key+" freeze", snap.Stats.FreezeMS)
	res.add(key+" pack", snap.Stats.PackMS)
	res.add(key+" call", ms(wall))
	res.add(key+" method:"+snap.Stats.Method, 0)

	upper := filepath.Join(p.dataDir, "node", "container", "sandboxes", sb.ID, "rw", "upper")
	dst, err := os.MkdirTemp(p.dataDir, "tar-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dst)
	start = time.Now()
	cmd := exec.CommandContext(ctx, "sh", "-c", `tar -C "$1" -cf - . | tar -C "$2" -xf -`, "sh", upper, dst)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("tar peer: %v: %s", err, out)
	}
	res.add(key+" tar", ms(time.Since(start)))
	return nil
}

// restoreRound: create from a snapshot until the first exec answers,
// against the same from busybox.
func (p *peer) restoreRound(ctx context.Context, res results) error {
	src, err := p.c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox", Resources: small})
	if err != nil {
		return err
	}
	defer p.c.DeleteSandbox(context.WithoutCancel(ctx), src.ID)
	if _, err := p.c.Exec(ctx, src.ID, api.ExecRequest{Cmd: "mkdir -p /work && echo state > /work/s"}); err != nil {
		return err
	}
	snap, err := p.c.Snapshot(ctx, src.ID, api.SnapshotRequest{})
	if err != nil {
		return err
	}
	for _, img := range []string{snap.Ref, "busybox"} {
		for range 5 {
			start := time.Now()
			sb, err := p.c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: img, Resources: small})
			if err != nil {
				return err
			}
			if _, err := p.c.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"true"}}); err != nil {
				return err
			}
			d := time.Since(start)
			key := p.name + "/restore from snapshot"
			if img == "busybox" {
				key = p.name + "/create from busybox"
			}
			res.add(key, ms(d))
			if err := p.c.DeleteSandbox(ctx, sb.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// forkRound forks n branches and runs `true` in each, 16 at a time.
func (p *peer) forkRound(ctx context.Context, res results, n int) error {
	src, err := p.c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox", Resources: small})
	if err != nil {
		return err
	}
	defer p.c.DeleteSandbox(context.WithoutCancel(ctx), src.ID)
	if _, err := p.c.Exec(ctx, src.ID, api.ExecRequest{Cmd: "mkdir -p /work && echo step-k > /work/s"}); err != nil {
		return err
	}
	start := time.Now()
	f, err := p.c.Fork(ctx, src.ID, api.ForkRequest{Count: n, AllOrNone: true})
	if err != nil {
		return err
	}
	forked := time.Since(start)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	for _, sb := range f.Sandboxes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := p.c.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"true"}}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	all := time.Since(start)
	close(errs)
	for err := range errs {
		return err
	}
	res.add(fmt.Sprintf("%s/fork %d created", p.name, n), ms(forked))
	res.add(fmt.Sprintf("%s/fork %d every branch ran", p.name, n), ms(all))
	for _, sb := range f.Sandboxes {
		p.c.DeleteSandbox(ctx, sb.ID)
	}
	return nil
}

func (r results) print(peers []*peer, sizes, forks []int) {
	stat := func(v []float64) string {
		if len(v) == 0 {
			return "-"
		}
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return fmt.Sprintf("%8.1f ms (%.1f-%.1f)", s[len(s)/2], s[0], s[len(s)-1])
	}
	med := func(v []float64) float64 {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return s[len(s)/2]
	}
	for _, p := range peers {
		fmt.Printf("\n== %s (median, min-max over rounds)\n", p.name)
		for _, mb := range sizes {
			k := fmt.Sprintf("%s/snapshot %d MB", p.name, mb)
			method := "?"
			for key := range r {
				if m, ok := strings.CutPrefix(key, k+" method:"); ok {
					method = m
				}
			}
			fmt.Printf("snapshot %5d MB: freeze %s [%s]  pack %s  call %s  | peer tar %s (%.1fx the freeze)\n", mb,
				stat(r[k+" freeze"]), method, stat(r[k+" pack"]), stat(r[k+" call"]), stat(r[k+" tar"]),
				med(r[k+" tar"])/max(med(r[k+" freeze"]), 0.001))
		}
		rs, cb := r[p.name+"/restore from snapshot"], r[p.name+"/create from busybox"]
		fmt.Printf("restore to first exec: %s  | create from busybox %s: %.2fx\n", stat(rs), stat(cb), med(rs)/med(cb))
		for _, n := range forks {
			k := fmt.Sprintf("%s/fork %d", p.name, n)
			fmt.Printf("fork %3d: created %s  every branch ran a command %s\n", n, stat(r[k+" created"]), stat(r[k+" every branch ran"]))
		}
	}
}

// btrfsLoop makes a btrfs filesystem of size bytes in a sparse file at
// img and mounts it at mnt.
func btrfsLoop(img, mnt string, size int64) (func(), error) {
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return nil, err
	}
	if err := os.Truncate(img, size); err != nil {
		return nil, err
	}
	if out, err := exec.Command("mkfs.btrfs", "-q", img).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mkfs.btrfs: %v: %s", err, out)
	}
	if err := os.Mkdir(mnt, 0o711); err != nil {
		return nil, err
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mount btrfs: %v: %s", err, out)
	}
	if err := os.Chmod(mnt, 0o711); err != nil {
		return nil, err
	}
	return func() {
		for range 50 {
			if exec.Command("umount", "-R", mnt).Run() == nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		exec.Command("umount", "-R", "-l", mnt).Run()
	}, nil
}

func fsType(dir string) string {
	out, err := exec.Command("stat", "-f", "-c", "%T", dir).Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}
