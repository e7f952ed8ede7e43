package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/image"
)

type bench struct {
	cfg   config
	dir   string
	blobs string // warren's blob store (a directory store under its data dir)
	img   *content
	env   *published
	c     *client.Client

	// per-start results, one value per round, by mode
	res    map[string][]sample
	gunzip time.Duration // gzip -dc of the tarball to nowhere, once
}

// sample is one measured start (or, for warm starts, a round's median).
type sample struct {
	d       time.Duration
	written int64         // write_bytes of the process(es) doing it
	du      int64         // blocks it left allocated
	flush   time.Duration // a sync right after it, untimed in d
}

const (
	modeCold    = "warren cold"
	modeLazy    = "warren lazy"
	modeColdEnv = "warren cold-env"
	modeWarm    = "warren warm"
	modeTar     = "tar -xzf"
	modeGo      = "Go gzip+tar"
)

var modes = []string{modeCold, modeLazy, modeColdEnv, modeWarm, modeTar, modeGo}

func (b *bench) starts(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	b.res = map[string][]sample{}
	fmt.Printf("\n(a) per sandbox start: %d rounds, mode order rotated each round\n", b.cfg.rounds)
	for r := 0; r < b.cfg.rounds; r++ {
		for i := range modes {
			m := modes[(i+r)%len(modes)]
			s, err := b.start(ctx, exe, r, m)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r, m, err)
			}
			b.res[m] = append(b.res[m], s)
		}
		fmt.Printf("  round %d: cold %s, lazy %s, cold-env %s, warm %s, tar %s, go %s\n", r+1,
			dur(b.res[modeCold][r].d), dur(b.res[modeLazy][r].d), dur(b.res[modeColdEnv][r].d), dur(b.res[modeWarm][r].d),
			dur(b.res[modeTar][r].d), dur(b.res[modeGo][r].d))
	}
	// Where the peer's time goes: decompression alone, once.
	cmd := exec.CommandContext(ctx, "gzip", "-dc", b.img.tarball)
	t := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("gzip -dc: %w", err)
	}
	b.gunzip = time.Since(t)
	b.printStarts()
	return nil
}

// start measures one mode once (warm: b.cfg.warm times, the median kept)
// in a fresh directory, and removes what it made.
func (b *bench) start(ctx context.Context, exe string, round int, mode string) (sample, error) {
	root := filepath.Join(b.dir, "starts", fmt.Sprintf("r%d-%s", round, strings.NewReplacer(" ", "-", "+", "").Replace(mode)))
	if err := os.MkdirAll(root, 0o755); err != nil {
		return sample{}, err
	}
	defer func() {
		if unmountUnder(root) == nil { // never delete through a mount
			os.RemoveAll(root)
		}
		unix.Sync() // the next start does not pay for this one's writeback
	}()
	cacheDir, mountsDir := filepath.Join(root, "cache"), filepath.Join(root, "layers")
	node := job{Op: "warren", Blobs: b.blobs, Cache: cacheDir, Mounts: mountsDir, Digests: b.env.digests}
	if mode == modeLazy {
		node.Lazy = filepath.Join(root, "lazy")
	}

	// The state the node is in before the start, made untimed.
	var pre []string
	switch mode {
	case modeColdEnv:
		pre = []string{b.env.digests[0], b.env.digests[2]} // base and toolkit
	case modeWarm:
		pre = b.env.digests
	}
	if len(pre) > 0 {
		bs, err := blob.NewDir(b.blobs)
		if err != nil {
			return sample{}, err
		}
		cache, mounts := image.NewCache(cacheDir, bs), image.NewMounts(mountsDir)
		for _, d := range pre {
			l, err := cache.Fetch(ctx, d)
			if err != nil {
				return sample{}, err
			}
			if _, err := mounts.Acquire(ctx, l); err != nil {
				return sample{}, err
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "sandboxes"), 0o755); err != nil {
		return sample{}, err
	}
	unix.Sync()

	n := 1
	if mode == modeWarm {
		n = b.cfg.warm
	}
	var ss []sample
	for i := 0; i < n; i++ {
		du0, err := diskUsage(root)
		if err != nil {
			return sample{}, err
		}
		var s sample
		dest := filepath.Join(root, "sandboxes", fmt.Sprint(i))
		switch mode {
		case modeTar:
			if err := os.Mkdir(dest, 0o755); err != nil {
				return sample{}, err
			}
			cmd := exec.CommandContext(ctx, "tar", "--numeric-owner", "-xzf", b.img.tarball, "-C", dest)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			t := time.Now()
			err := cmd.Run()
			s.d = time.Since(t)
			if err != nil {
				return sample{}, fmt.Errorf("tar -xzf: %v: %s", err, out.String())
			}
			s.written = oublock(cmd.ProcessState)
		case modeGo:
			j := job{Op: "gotar", Tarball: b.img.tarball, Dest: dest}
			if s, err = runJob(ctx, exe, j); err != nil {
				return sample{}, err
			}
		default:
			j := node
			j.Sandbox = dest
			if s, err = runJob(ctx, exe, j); err != nil {
				return sample{}, err
			}
		}
		t := time.Now()
		unix.Sync()
		s.flush = time.Since(t)
		du1, err := diskUsage(root)
		if err != nil {
			return sample{}, err
		}
		s.du = du1 - du0
		ss = append(ss, s)
	}
	return medianSample(ss), nil
}

// runJob runs j in a child process of this program and returns its own
// timing with the child's write_bytes.
func runJob(ctx context.Context, exe string, j job) (sample, error) {
	arg, err := json.Marshal(j)
	if err != nil {
		return sample{}, err
	}
	cmd := exec.CommandContext(ctx, exe, "-worker", string(arg))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	runErr := cmd.Run()
	var res result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return sample{}, fmt.Errorf("worker %s: %v (%v): %q", j.Op, err, runErr, out.String())
	}
	if res.Err != "" {
		return sample{}, fmt.Errorf("worker %s: %s", j.Op, res.Err)
	}
	if runErr != nil {
		return sample{}, fmt.Errorf("worker %s: %w", j.Op, runErr)
	}
	return sample{d: time.Duration(res.NS), written: oublock(cmd.ProcessState)}, nil
}

// oublock is a finished process's write_bytes, its reaped children's
// included: Linux reports task I/O accounting's write_bytes in 512-byte
// units as ru_oublock.
func oublock(ps *os.ProcessState) int64 {
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Oublock * 512
	}
	return -1
}

// ioWritten is the write_bytes of this process and its reaped children.
func ioWritten() int64 {
	var self, kids unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &self)
	unix.Getrusage(unix.RUSAGE_CHILDREN, &kids)
	return (self.Oublock + kids.Oublock) * 512
}

func medianSample(ss []sample) sample {
	pick := func(f func(sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return sample{
		d:       time.Duration(pick(func(s sample) float64 { return float64(s.d) })),
		written: int64(pick(func(s sample) float64 { return float64(s.written) })),
		du:      int64(pick(func(s sample) float64 { return float64(s.du) })),
		flush:   time.Duration(pick(func(s sample) float64 { return float64(s.flush) })),
	}
}

func (b *bench) printStarts() {
	fmt.Printf("\n%-17s %26s %26s %26s %22s\n", "", "time to ready root", "bytes written", "left on disk (du)", "sync right after")
	for _, m := range modes {
		ss := b.res[m]
		fmt.Printf("  %-15s %26s %26s %26s %22s\n", m,
			spread(ss, func(s sample) float64 { return float64(s.d) }, fmtDur),
			spread(ss, func(s sample) float64 { return float64(s.written) }, fmtBytes),
			spread(ss, func(s sample) float64 { return float64(s.du) }, fmtBytes),
			spread(ss, func(s sample) float64 { return float64(s.flush) }, fmtDur))
	}
	dOf := func(m string) float64 { return median(b.res[m], func(s sample) float64 { return float64(s.d) }) }
	peer := modeTar
	if dOf(modeGo) < dOf(modeTar) {
		peer = modeGo
	}
	fmt.Printf("\n  peer = %s (the faster extraction, by median); gzip -dc of the tarball alone took %s\n", peer, dur(b.gunzip))
	p := b.res[peer]
	for _, m := range []string{modeWarm, modeColdEnv, modeCold, modeLazy} {
		w := b.res[m]
		fmt.Printf("  %-15s %7s faster   %7s less written   %7s less left on disk\n", m,
			ratio(p, w, func(s sample) float64 { return float64(s.d) }),
			ratio(p, w, func(s sample) float64 { return float64(s.written) }),
			ratio(p, w, func(s sample) float64 { return float64(s.du) }))
	}
	fmt.Printf("  targets (issue 3): >= 10x faster per start, >= 5.5x less written; (issue 17) lazy cold >= 20x faster\n")
	fmt.Printf("  (warren lazy: a cold node that loads layers on demand: the root is ready once the manifests and the\n   EROFS metadata the mounts read are fetched; file data comes on first read, which bench/lazy measures)\n")
	// DSec: a base image is used a median of 3 times. With the base and
	// toolkit shared across environments, an environment's first start on
	// a node is cold-env and the next ones warm, if they land there.
	avg := func(f func(sample) float64) float64 {
		return (median(b.res[modeColdEnv], f) + 2*median(b.res[modeWarm], f)) / 3
	}
	fd := func(s sample) float64 { return float64(s.d) }
	fw := func(s sample) float64 { return float64(s.written) }
	fmt.Printf("  fanout 3 (1 cold-env + 2 warm starts, averaged): %s and %s per start: %.1fx faster, %.1fx less written\n",
		fmtDur(avg(fd)), fmtBytes(avg(fw)), median(p, fd)/avg(fd), median(p, fw)/avg(fw))
}

// apiCreates times full sandbox creates through the REST API on the same
// environment: the first (the daemon's node has none of its layers) and
// then warm ones.
func (b *bench) apiCreates(ctx context.Context) error {
	var ids []string
	defer func() {
		for _, id := range ids {
			b.c.DeleteSandbox(context.WithoutCancel(ctx), id)
		}
	}()
	create := func() (sample, error) {
		unix.Sync()
		w0, t := ioWritten(), time.Now()
		sb, err := b.c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: b.env.env,
			Resources: api.Resources{CPU: 0.1, Memory: 64 << 20}})
		s := sample{d: time.Since(t), written: ioWritten() - w0}
		if err != nil {
			return s, err
		}
		ids = append(ids, sb.ID)
		return s, nil
	}
	cold, err := create()
	if err != nil {
		return fmt.Errorf("API create: %w", err)
	}
	var warm []sample
	for i := 0; i < b.cfg.apiWarm; i++ {
		s, err := create()
		if err != nil {
			return fmt.Errorf("API create: %w", err)
		}
		warm = append(warm, s)
	}
	fd := func(s sample) float64 { return float64(s.d) }
	fw := func(s sample) float64 { return float64(s.written) }
	fmt.Printf("\n(b) full sandbox create through the API (%s; REST -> agent -> container backend -> runc), whole process's write_bytes\n", b.env.env)
	fmt.Printf("  first (layers fetched)  %s  %s written\n", fmtDur(fd(cold)), fmtBytes(fw(cold)))
	fmt.Printf("  warm (n=%d)              %s  %s written\n", len(warm), spread(warm, fd, fmtDur), spread(warm, fw, fmtBytes))
	for _, m := range []string{modeTar, modeGo} {
		fmt.Printf("  vs %-12s extraction alone: warm create %.1fx faster, first create %.1fx faster\n", m,
			median(b.res[m], fd)/median(warm, fd), median(b.res[m], fd)/fd(cold))
	}
	return nil
}

// median and spread over samples of f.
func median(ss []sample, f func(sample) float64) float64 {
	v := values(ss, f)
	return v[len(v)/2]
}

func values(ss []sample, f func(sample) float64) []float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	sort.Float64s(v)
	return v
}

// spread prints "median (min-max)".
func spread(ss []sample, f func(sample) float64, format func(float64) string) string {
	v := values(ss, f)
	return fmt.Sprintf("%s (%s-%s)", format(v[len(v)/2]), format(v[0]), format(v[len(v)-1]))
}

// ratio is median(peer)/median(w), or "inf" when w's is zero.
func ratio(peer, w []sample, f func(sample) float64) string {
	num, den := median(peer, f), median(w, f)
	if den <= 0 {
		return "inf"
	}
	r := num / den
	if r >= 100 {
		return fmt.Sprintf("%.0fx", r)
	}
	return fmt.Sprintf("%.1fx", r)
}

func dur(d time.Duration) string { return fmtDur(float64(d)) }

func fmtDur(ns float64) string {
	d := time.Duration(ns)
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
}

func fmtBytes(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fGB", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.0fMB", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0fKB", n/1e3)
	default:
		return fmt.Sprintf("%.0fB", n)
	}
}

func mb(n int64) string { return fmtBytes(float64(n)) }
