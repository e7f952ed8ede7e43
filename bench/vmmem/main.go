// Command vmmem measures the host memory N microVM sandboxes of one
// environment hold once each has read every file of its layer, with the
// layers on virtio-blk (every guest caches its own copy) and on
// virtio-pmem mounted with DAX (`warren agent --vm-dax`: the guests read
// the host's page cache of the layer in place), in the same run.
//
//	sudo go run ./bench/vmmem -n 8 -mem 256 -rounds 2
//
// Per round and variant (the order rotated every round) it starts `warren
// up` in this process on a data dir of its own (no FnCall;
// MachineConfig.DAX for the dax variants), makes the environment
// (debian-python@12 from the root filesystem scripts/build-runtime-images
// leaves in /var/cache/warren/images; -image), and boots one microVM and
// removes it (the pmem copy of the layer, QEMU's and the kernel's files).
// Then it drops the host's page cache (sync; echo 3 >
// /proc/sys/vm/drop_caches) so that every variant starts cold and equal,
// takes a baseline of /proc/meminfo, and samples every -interval until
// the end: host used (MemTotal - MemAvailable), host used with the page
// cache (MemTotal - MemFree), and the PSS of the run's QEMU processes
// (smaps_rollup). It creates -n microVMs (-mem MiB each; the guest gets
// 128 MiB more), has all of them read every file of their root filesystem
// at once (-read), waits -settle, reads one guest's /proc/meminfo, and
// removes them. The figures are the peaks over the samples less the
// baseline, and each dax variant against blk (DSec's target: at least
// -40% peak).
//
// Variants: blk (virtio-blk) and dax (virtio-pmem with DAX, --vm-dax:
// the layer's pmem copy rebuilt by the node with every file's data in
// whole blocks, which the guest maps in place), on the node's default
// guest kernel (warren's own where scripts/build-guest-kernel built it);
// with -debian also blk/debian and dax/debian, the same on Debian's
// generic kernel (microvm.DebianKernel), for what the kernel alone saves.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/bench/internal/hostmem"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/backend/microvm"
	"github.com/warrenhq/warren/internal/daemon"
)

// defaultRead reads every regular file of the sandbox's root filesystem
// (the overlay: -xdev keeps out /proc, /sys and /dev).
const defaultRead = "find / -xdev -type f -exec cat {} + > /dev/null 2>&1; true"

func main() {
	var cfg config
	flag.IntVar(&cfg.n, "n", 8, "microVMs per variant")
	mem := flag.Int("mem", 256, "memory of each sandbox, MiB (its guest gets 128 MiB more)")
	flag.IntVar(&cfg.rounds, "rounds", 2, "rounds (each: both variants; median and spread)")
	flag.StringVar(&cfg.image, "image", benchup.DebianPython, "root filesystem of the environment; \"busybox\" for busybox@1")
	flag.StringVar(&cfg.read, "read", defaultRead, "what each guest runs to read its files")
	flag.IntVar(&cfg.conc, "c", 2, "creates at a time")
	flag.DurationVar(&cfg.interval, "interval", 500*time.Millisecond, "sampling interval")
	flag.DurationVar(&cfg.settle, "settle", 5*time.Second, "wait after the reads, and after dropping the page cache")
	keep := flag.Bool("keep", false, "keep the temporary data dirs")
	flag.BoolVar(&cfg.debian, "debian", false, "also run both variants on Debian's generic guest kernel")
	flag.Parse()
	cfg.mem = int64(*mem) << 20
	if err := run(cfg, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "bench/vmmem:", err)
		os.Exit(1)
	}
}

type config struct {
	n, rounds, conc  int
	mem              int64
	image, read      string
	interval, settle time.Duration
	debian           bool
}

// result is one variant's figures in one round; memory in bytes, peaks
// less the baseline.
type result struct {
	used, usedCache, pss int64 // peaks
	pssAnon, pssFile     int64 // in the sample of the PSS peak
	// after the reads and -settle
	afterUsed, afterUsedCache, afterPSS int64
	layer                               int64 // the environment's EROFS size
	boot, read                          time.Duration
	readEach                            []time.Duration
	guest                               map[string]int64
	split                               hostmem.QEMUSplit // after the reads, all QEMUs
	dax                                 bool              // QEMU had virtio-pmem devices
	others                              int               // QEMU processes of others seen
}

func run(cfg config, keep bool) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (QEMU's cgroups, mounts, drop_caches)")
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	dir, err := benchup.TempDir("warren-bench-vmmem-")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(dir)
	}
	if _, err := benchup.GuestAgent(dir); err != nil {
		return err
	}
	fmt.Printf("bench/vmmem: %d microVMs per variant (%d MiB sandbox, %d MiB guest), env from %s, %d rounds, %s\n",
		cfg.n, cfg.mem>>20, cfg.mem>>20+128, cfg.image, cfg.rounds, time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("each guest runs: %s\n", cfg.read)
	variants := []kind{blk, dax}
	if cfg.debian {
		variants = append(variants, blk+onDebian, dax+onDebian)
	}
	results := map[kind][]result{}
	for r := 0; r < cfg.rounds; r++ {
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			// Short: QEMU's unix sockets live below it (at most 107 bytes).
			res, err := variant(ctx, cfg, filepath.Join(dir, fmt.Sprintf("%d%d", r+1, (i+r)%len(variants))), v)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, v, err)
			}
			results[v] = append(results[v], res)
			fmt.Printf("round %d %-10s peak used +%s, used+cache +%s, QEMU PSS %s (anon %s, file %s); after the reads: used +%s, PSS %s; boots %s, reads %s (slowest %s)\n",
				r+1, v, hostmem.MiB(res.used), hostmem.MiB(res.usedCache), hostmem.MiB(res.pss), hostmem.MiB(res.pssAnon), hostmem.MiB(res.pssFile),
				hostmem.MiB(res.afterUsed), hostmem.MiB(res.afterPSS), res.boot.Round(time.Millisecond), res.read.Round(time.Millisecond), pct(res.readEach, 100).Round(time.Millisecond))
			if res.others > 0 {
				fmt.Printf("  warning: %d QEMU process(es) of others ran on the host meanwhile: the used figures move with them (PSS does not)\n", res.others)
			}
		}
	}
	report(cfg, variants, results)
	return nil
}

// kind is a variant: how the guests get their layer.
type kind string

const (
	blk = kind("blk") // virtio-blk (the default)
	dax = kind("dax") // virtio-pmem with DAX (--vm-dax)
	// onDebian ends the name of a variant on Debian's guest kernel.
	onDebian = "/debian"
)

// isDAX says whether variant v has its layers on virtio-pmem with DAX.
func (v kind) isDAX() bool { return strings.HasPrefix(string(v), string(dax)) }

// variant runs one `warren up` (of kind v) on data, measures, and leaves
// nothing of it behind.
func variant(ctx context.Context, cfg config, data string, v kind) (res result, err error) {
	if err := os.MkdirAll(data, 0o711); err != nil {
		return res, err
	}
	upCtx, stopUp := context.WithCancel(ctx)
	ucfg := daemon.UpConfig{DataDir: data, Listen: "127.0.0.1:0", ImageCache: filepath.Join(data, "no-images"), StopSandboxes: true,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	ucfg.Fn.Disabled = true
	ucfg.Machines.DAX = v.isDAX()
	if strings.HasSuffix(string(v), onDebian) {
		ucfg.Machines.Kernel = microvm.DebianKernel
	}
	c, wait, err := benchup.Start(upCtx, ucfg)
	defer func() {
		stopUp()
		if wait != nil {
			if werr := wait(); werr != nil && err == nil {
				err = werr
			}
		}
		for _, did := range benchup.Reap(data) {
			fmt.Fprintln(os.Stderr, "bench/vmmem: cleanup:", did)
		}
	}()
	if err != nil {
		return res, err
	}
	accel, why, err := benchup.Accel(ctx, c, "microvm")
	if err != nil {
		return res, err
	}
	fmt.Printf("%s: accelerator %s (%s)\n", v, accel, why)
	env, err := benchup.Env(ctx, c, cfg.image)
	if err != nil {
		return res, err
	}
	if img, err := c.GetImage(ctx, env); err == nil {
		res.layer = img.Size
	}
	// Warm-up: one microVM booted and removed (the pmem copy of the layer
	// for dax); whether its QEMU got the layer on virtio-pmem.
	sb, err := create(ctx, c, env, cfg.mem)
	if err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	for _, pid := range benchup.QEMUUnder(data) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		res.dax = strings.Contains(string(b), "virtio-pmem")
	}
	if err := c.DeleteSandbox(ctx, sb); err != nil {
		return res, err
	}
	if res.dax != v.isDAX() {
		return res, fmt.Errorf("asked for DAX %v, but QEMU's devices say %v (does the guest kernel have virtio_pmem and nd_pmem?)", v.isDAX(), res.dax)
	}

	hostmem.Settle(30 * time.Second) // what the warm-up's removal frees
	if err := hostmem.DropCaches(); err != nil {
		return res, fmt.Errorf("drop the page cache: %w", err)
	}
	time.Sleep(cfg.settle)
	base, err := hostmem.Read()
	if err != nil {
		return res, err
	}
	othersAt := func() int { return len(qemuOthers(data)) }
	res.others = othersAt()
	sampler := hostmem.StartSampler(cfg.interval, func() []int { return benchup.QEMUUnder(data) })
	samples := []hostmem.Sample(nil)
	defer func() {
		if samples == nil {
			sampler.Stop()
		}
	}()

	start := time.Now()
	ids, err := createAll(ctx, c, env, cfg)
	defer func() {
		for _, id := range ids {
			if id != "" {
				c.DeleteSandbox(context.Background(), id)
			}
		}
	}()
	if err != nil {
		return res, err
	}
	res.boot = time.Since(start)
	res.others = max(res.others, othersAt())

	start = time.Now()
	res.readEach = make([]time.Duration, len(ids))
	errs := make(chan error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			r, err := c.Exec(ctx, id, api.ExecRequest{Cmd: cfg.read, Timeout: api.Duration(time.Hour)})
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", r.ExitCode, r.Stderr)
			}
			if err != nil {
				errs <- fmt.Errorf("read in %s: %w", id, err)
			}
			res.readEach[i] = time.Since(t)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return res, err
	}
	res.read = time.Since(start)
	time.Sleep(cfg.settle)
	after, err := hostmem.Read()
	if err != nil {
		return res, err
	}
	qemus := benchup.QEMUUnder(data)
	afterPSS := hostmem.SumRollups(qemus)
	if len(qemus) > 0 {
		ram, tcg := benchup.QEMUSizes(qemus[0])
		res.split = hostmem.SplitQEMU(qemus, ram, tcg)
	}
	if r, err := c.Exec(ctx, ids[0], api.ExecRequest{Argv: []string{"cat", "/proc/meminfo"}}); err == nil && r.ExitCode == 0 {
		res.guest = hostmem.Parse(r.Stdout)
	}
	samples = sampler.Stop()
	res.others = max(res.others, othersAt())

	res.used, _ = hostmem.Peak(samples, func(s hostmem.Sample) int64 { return s.Host.Used() })
	res.used -= base.Used()
	res.usedCache, _ = hostmem.Peak(samples, func(s hostmem.Sample) int64 { return s.Host.UsedWithCache() })
	res.usedCache -= base.UsedWithCache()
	var at hostmem.Sample
	res.pss, at = hostmem.Peak(samples, func(s hostmem.Sample) int64 { return s.PSS.PSS })
	res.pssAnon, res.pssFile = at.PSS.PSSAnon, at.PSS.PSSFile
	res.afterUsed, res.afterUsedCache, res.afterPSS = after.Used()-base.Used(), after.UsedWithCache()-base.UsedWithCache(), afterPSS.PSS
	return res, nil
}

// qemuOthers lists the QEMU processes on the host that are not this
// variant's.
func qemuOthers(data string) []int {
	mine := map[int]bool{}
	for _, pid := range benchup.QEMUUnder(data) {
		mine[pid] = true
	}
	var pids []int
	for _, pid := range benchup.QEMUUnder("") {
		if !mine[pid] {
			pids = append(pids, pid)
		}
	}
	return pids
}

func create(ctx context.Context, c *client.Client, env string, mem int64) (string, error) {
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Backend: "microvm", Image: env, TTL: api.Duration(2 * time.Hour),
		Resources: api.Resources{CPU: 1, Memory: api.Quantity(mem)}})
	if err != nil {
		return "", err
	}
	return sb.ID, nil
}

// createAll creates cfg.n microVMs, cfg.conc at a time; the ids of those
// made are returned even on error.
func createAll(ctx context.Context, c *client.Client, env string, cfg config) ([]string, error) {
	ids := make([]string, cfg.n)
	errs := make(chan error, cfg.n)
	sem := make(chan struct{}, max(1, cfg.conc))
	var wg sync.WaitGroup
	for i := range cfg.n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			id, err := create(ctx, c, env, cfg.mem)
			if err != nil {
				errs <- err
				return
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return ids, fmt.Errorf("create: %w", err)
	}
	return ids, nil
}

func report(cfg config, variants []kind, results map[kind][]result) {
	blkR := results[blk]
	fmt.Printf("\nhost memory for %d microVMs after each read its layer (%s EROFS), peak over the run less the baseline after drop_caches:\n",
		cfg.n, hostmem.MiB(blkR[0].layer))
	fmt.Printf("  %-10s %26s %26s %26s %26s %26s\n", "", "peak used", "peak used+cache", "peak QEMU PSS", "after: used", "after: QEMU PSS")
	for _, v := range variants {
		rs := results[v]
		fmt.Printf("  %-10s %26s %26s %26s %26s %26s\n", v,
			spread(rs, func(r result) int64 { return r.used }), spread(rs, func(r result) int64 { return r.usedCache }),
			spread(rs, func(r result) int64 { return r.pss }), spread(rs, func(r result) int64 { return r.afterUsed }),
			spread(rs, func(r result) int64 { return r.afterPSS }))
	}
	fmt.Printf("  against blk on the same kernel, and blk/debian against blk (per round: median (min-max); DSec target <= -40%% peak):\n")
	for _, v := range variants[1:] {
		rs := results[v]
		base := blkR // blk/debian against blk: what the kernel alone does
		if v.isDAX() {
			base = results[blk+kind(strings.TrimPrefix(string(v), string(dax)))]
		}
		red := func(f func(result) int64) string {
			var x []float64
			for i := range min(len(base), len(rs)) {
				x = append(x, 100*(float64(f(rs[i]))/float64(f(base[i]))-1))
			}
			return spreadOf(x, "%+.0f%%")
		}
		fmt.Printf("    %-10s peak used %s   peak used+cache %s   peak QEMU PSS %s   after: used %s, PSS %s\n", v,
			red(func(r result) int64 { return r.used }), red(func(r result) int64 { return r.usedCache }), red(func(r result) int64 { return r.pss }),
			red(func(r result) int64 { return r.afterUsed }), red(func(r result) int64 { return r.afterPSS }))
	}
	per := func(rs []result, f func(result) int64) string {
		return spread(rs, func(r result) int64 { return f(r) / int64(cfg.n) })
	}
	fmt.Printf("  per microVM, peak QEMU PSS (anon: guest RAM touched, TCG's translation cache, QEMU's heap; file: QEMU's files, the initramfs, with DAX the layer's shared pages split between the QEMUs):\n")
	for _, v := range variants {
		rs := results[v]
		fmt.Printf("    %-10s %s (anon %s, file %s)\n", v, per(rs, func(r result) int64 { return r.pss }),
			per(rs, func(r result) int64 { return r.pssAnon }), per(rs, func(r result) int64 { return r.pssFile }))
	}
	fmt.Printf("  per microVM after the reads, QEMU PSS by mapping (last round): guest RAM touched / TCG's translation cache / the layer's pmem mapping / the rest of QEMU:\n")
	for _, v := range variants {
		sp := results[v][len(results[v])-1].split
		n := int64(cfg.n)
		fmt.Printf("    %-10s %s / %s / %s / %s\n", v, hostmem.MiB(sp.GuestRAM/n), hostmem.MiB(sp.TCG/n), hostmem.MiB(sp.Layers/n), hostmem.MiB(sp.Rest/n))
	}
	for _, v := range variants {
		rs := results[v]
		g := rs[len(rs)-1].guest
		if g == nil {
			continue
		}
		fmt.Printf("  a %-10s guest after its read (/proc/meminfo): MemTotal %s, used (MemTotal-MemFree) %s: page cache %s (shmem %s), anon %s, slab %s\n",
			v, hostmem.MiB(g["MemTotal"]), hostmem.MiB(g["MemTotal"]-g["MemFree"]), hostmem.MiB(g["Cached"]+g["Buffers"]),
			hostmem.MiB(g["Shmem"]), hostmem.MiB(g["AnonPages"]), hostmem.MiB(g["Slab"]))
	}
	for _, v := range variants {
		rs := results[v]
		fmt.Printf("  %-10s boots of %d (%d at a time) %s, reads all at once %s\n", v, cfg.n, cfg.conc,
			spreadD(rs, func(r result) time.Duration { return r.boot }), spreadD(rs, func(r result) time.Duration { return r.read }))
	}
	fmt.Printf("  used = MemTotal - MemAvailable (page cache the host can drop excluded); used+cache = MemTotal - MemFree; PSS = sum of the QEMU processes' smaps_rollup Pss\n")
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

func spread(rs []result, f func(result) int64) string {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = float64(f(r)) / (1 << 20)
	}
	return spreadOf(v, "%.0fMiB")
}

func spreadD(rs []result, f func(result) time.Duration) string {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r).Seconds()
	}
	return spreadOf(v, "%.1fs")
}

func spreadOf(v []float64, format string) string {
	if len(v) == 0 {
		return "-"
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	med := fmt.Sprintf(format, s[len(s)/2])
	if len(s) == 1 {
		return med
	}
	return med + " (" + fmt.Sprintf(format, s[0]) + "-" + fmt.Sprintf(format, s[len(s)-1]) + ")"
}
