// Command microvm measures microVM sandboxes (one QEMU per sandbox,
// internal/backend/microvm) against container sandboxes of the same
// environment, through warren's full path, in the same run: the time from
// create to a first exec's answer, the host memory an idle sandbox holds,
// and an exec's round trip.
//
//	sudo go run ./bench/microvm -n 8 -execs 100 -rounds 3
//
// It starts `warren up` in this process (no FnCall) and makes the
// environment: debian-python@12 from the root filesystem
// scripts/build-runtime-images leaves in /var/cache/warren/images (-image;
// "busybox" for busybox@1). Then per round and peer (microvm, container;
// the order rotated every round):
//
//   - create-to-first-exec: -n sandboxes one after another (-cpu cores,
//     -mem MiB each), each created and then asked to run `true`, timed
//     together;
//   - idle memory: after -idle with all -n running and idle, host memory
//     used (MemTotal - MemAvailable) against a reading before the
//     creates (once what the previous peer freed has settled); the PSS
//     (smaps_rollup) of the sandboxes' host processes (a microVM's QEMU;
//     a container's processes in its cgroup); and the memory charged to
//     their host cgroups: each summed and divided by -n. For microVMs,
//     the QEMUs' PSS by mapping (guest RAM, TCG's translation cache, the
//     rest) and one guest's own /proc/meminfo say where it goes;
//   - exec round trip: -execs sequential `true` in one of them.
//
// The sandboxes are then removed, untimed; at the end (or on a failure or
// a signal) warren up ends its sandboxes and benchup.Reap removes any
// QEMU, cgroup or mount of the run that is left. The accelerator the
// microVMs ran on is printed: under TCG (QEMU's emulator, where /dev/kvm
// cannot boot a stock kernel) the figures are a record, not a target.
// Used moves with anything else on the host: the output warns when other
// QEMU processes ran during a round.
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
	"syscall"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/bench/internal/hostmem"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/daemon"
)

func main() {
	n := flag.Int("n", 8, "sandboxes per peer and round (timed creates; idle together for the memory figure)")
	execs := flag.Int("execs", 100, "sequential execs of `true` per peer and round")
	rounds := flag.Int("rounds", 3, "rounds (median and spread)")
	img := flag.String("image", "", "root filesystem of the environment (default "+benchup.DebianPython+" if present, else busybox); \"busybox\" for busybox@1")
	mem := flag.Int("mem", 256, "memory of each sandbox, MiB (a microVM's guest gets 128 MiB more)")
	cpu := flag.Float64("cpu", 1, "CPU of each sandbox, cores")
	idle := flag.Duration("idle", 5*time.Second, "how long the sandboxes idle before their memory is read")
	keep := flag.Bool("keep", false, "keep the temporary data dir")
	flag.Parse()
	if *img == "" {
		*img = "busybox"
		if _, err := os.Stat(benchup.DebianPython); err == nil {
			*img = benchup.DebianPython
		}
	}
	cfg := config{n: *n, execs: *execs, rounds: *rounds, image: *img, mem: int64(*mem) << 20, cpu: *cpu, idle: *idle}
	if err := run(cfg, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "bench/microvm:", err)
		os.Exit(1)
	}
}

type config struct {
	n, execs, rounds int
	image            string
	mem              int64
	cpu              float64
	idle             time.Duration
}

// result is one peer's figures in one round.
type result struct {
	firstExec []time.Duration // create + first exec, each
	used      int64           // idle host memory per sandbox (bytes)
	charged   int64           // charged to its host cgroup, per sandbox
	pss       hostmem.Rollup  // of the sandboxes' host processes, per sandbox
	procs     int             // host processes the PSS is of
	exec      []time.Duration
	guest     map[string]int64  // one microVM's /proc/meminfo
	split     hostmem.QEMUSplit // microvm: where the QEMUs' PSS is, per sandbox
	others    int               // QEMU processes of other users of the host, at most
}

func run(cfg config, keep bool) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (QEMU's cgroups, mounts)")
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	dir, err := benchup.TempDir("warren-bench-microvm-")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(dir)
	}
	if _, err := benchup.GuestAgent(dir); err != nil {
		return err
	}
	data := filepath.Join(dir, "w") // short: QEMU's unix sockets live below it (at most 107 bytes)
	upCtx, stopUp := context.WithCancel(ctx)
	ucfg := daemon.UpConfig{DataDir: data, Listen: "127.0.0.1:0", ImageCache: filepath.Join(dir, "no-images"), StopSandboxes: true,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	ucfg.Fn.Disabled = true
	c, wait, err := benchup.Start(upCtx, ucfg)
	// Whatever happens, nothing of this run stays: warren up ends its
	// sandboxes, and Reap removes what it could not.
	defer func() {
		stopUp()
		if wait != nil {
			if werr := wait(); werr != nil {
				fmt.Fprintln(os.Stderr, "bench/microvm:", werr)
			}
		}
		for _, did := range benchup.Reap(data) {
			fmt.Fprintln(os.Stderr, "bench/microvm: cleanup:", did)
		}
	}()
	if err != nil {
		return err
	}
	accel, why, err := benchup.Accel(ctx, c, "microvm")
	if err != nil {
		return err
	}
	start := time.Now()
	env, err := benchup.Env(ctx, c, cfg.image)
	if err != nil {
		return err
	}
	if env != "busybox" {
		fmt.Printf("environment %s from %s in %s\n", env, cfg.image, time.Since(start).Round(time.Millisecond))
	}
	node := benchup.NodeID(data)
	peers := []peer{
		{name: "microvm", backend: "microvm", procs: func(ids []string) []int { return benchup.QEMUUnder(data) },
			cgroups: func(ids []string) []string { return memoryCgroups(benchup.QEMUUnder(data)) }},
		{name: "container", backend: "container", procs: func(ids []string) []int { return cgroupProcs(node, ids) },
			cgroups: func(ids []string) []string {
				var cgs []string
				for _, id := range ids {
					cgs = append(cgs, "/warren/"+node+"/"+id)
				}
				return cgs
			}},
	}
	fmt.Printf("bench/microvm: env %s, n=%d per peer and round (%.3g CPU, %d MiB each), %d execs, %d rounds, %s\n",
		env, cfg.n, cfg.cpu, cfg.mem>>20, cfg.execs, cfg.rounds, time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("accelerator: %s (%s)%s\n", accel, why, map[bool]string{true: ": QEMU emulates the CPU; these figures are a record, not a target"}[accel == "tcg"])
	fmt.Printf("peers: microvm = REST API -> agent -> microvm backend (QEMU %s, guest kernel + warren-guest, layers on virtio-blk);\n"+
		"       container = the same path to the container backend (runc, EROFS + overlay)\n", accel)

	// One untimed create of each first: the layer's mount, the page cache
	// of QEMU, the kernel and the initramfs.
	for _, p := range peers {
		if _, _, err := firstExecs(ctx, c, p, env, cfg, 1, true); err != nil {
			return fmt.Errorf("%s: warm-up: %w", p.name, err)
		}
	}
	results := map[string][]result{}
	for r := 0; r < cfg.rounds; r++ {
		for i := range peers {
			p := peers[(i+r)%len(peers)]
			res, err := measure(ctx, c, data, p, env, cfg)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", p.name, r+1, err)
			}
			results[p.name] = append(results[p.name], res)
			fmt.Printf("round %d %-9s create->exec p50 %s, idle per sandbox %.1f MiB used, %.1f MiB PSS (anon %.1f, file %.1f), %.1f MiB charged, exec p50 %s\n", r+1, p.name,
				pct(res.firstExec, 50).Round(time.Millisecond), mib(res.used), mib(res.pss.PSS), mib(res.pss.PSSAnon), mib(res.pss.PSSFile), mib(res.charged),
				pct(res.exec, 50).Round(10*time.Microsecond))
			if res.others > 0 {
				fmt.Printf("  warning: %d QEMU process(es) of others ran on the host during this round: its used figure moves with them\n", res.others)
			}
		}
	}
	report(results, cfg)
	return nil
}

type peer struct {
	name, backend string
	// procs lists the host processes of sandboxes ids; cgroups their
	// host memory cgroups.
	procs   func(ids []string) []int
	cgroups func(ids []string) []string
}

// measure is one round of peer p.
func measure(ctx context.Context, c *client.Client, data string, p peer, env string, cfg config) (result, error) {
	var res result
	hostmem.Settle(30 * time.Second) // what the previous peer's removals free
	othersBefore := len(otherQEMUs(data))
	before, err := hostmem.Read()
	if err != nil {
		return res, err
	}
	ids, times, err := firstExecs(ctx, c, p, env, cfg, cfg.n, false)
	res.firstExec = times
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
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(cfg.idle):
	}
	after, err := hostmem.Read()
	if err != nil {
		return res, err
	}
	procs := p.procs(ids)
	res.procs = len(procs)
	sum := hostmem.SumRollups(procs)
	res.pss = hostmem.Rollup{PSS: sum.PSS / int64(cfg.n), PSSAnon: sum.PSSAnon / int64(cfg.n), PSSFile: sum.PSSFile / int64(cfg.n)}
	res.used = (after.Used() - before.Used()) / int64(cfg.n)
	for _, cg := range p.cgroups(ids) {
		res.charged += charged(cg)
	}
	res.charged /= int64(cfg.n)
	res.others = max(othersBefore, len(otherQEMUs(data)))
	if p.backend == "microvm" && len(procs) > 0 {
		ram, tcg := benchup.QEMUSizes(procs[0])
		sp := hostmem.SplitQEMU(procs, ram, tcg)
		res.split = hostmem.QEMUSplit{GuestRAM: sp.GuestRAM / int64(cfg.n), TCG: sp.TCG / int64(cfg.n), Rest: (sp.Rest + sp.Layers) / int64(cfg.n)}
		r, err := c.Exec(ctx, ids[0], api.ExecRequest{Argv: []string{"cat", "/proc/meminfo"}})
		if err == nil && r.ExitCode == 0 {
			res.guest = hostmem.Parse(r.Stdout)
		}
	}
	for range cfg.execs {
		t := time.Now()
		r, err := c.Exec(ctx, ids[0], api.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			return res, fmt.Errorf("exec: %w", err)
		}
		if r.ExitCode != 0 {
			return res, fmt.Errorf("exec true: exit %d: %s", r.ExitCode, r.Stderr)
		}
		res.exec = append(res.exec, time.Since(t))
	}
	return res, nil
}

// firstExecs creates n sandboxes of p one after another, each followed by
// an exec of `true`, and returns their ids and the time of each create
// and first exec together; with remove, it removes each at once.
func firstExecs(ctx context.Context, c *client.Client, p peer, env string, cfg config, n int, remove bool) (ids []string, times []time.Duration, err error) {
	for range n {
		t := time.Now()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Backend: p.backend, Image: env, TTL: api.Duration(time.Hour),
			Resources: api.Resources{CPU: cfg.cpu, Memory: api.Quantity(cfg.mem)}})
		if err != nil {
			return ids, times, fmt.Errorf("create: %w", err)
		}
		ids = append(ids, sb.ID)
		r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			return ids, times, fmt.Errorf("first exec: %w", err)
		}
		if r.ExitCode != 0 {
			return ids, times, fmt.Errorf("first exec: exit %d: %s", r.ExitCode, r.Stderr)
		}
		times = append(times, time.Since(t))
		if remove {
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
				return ids, times, err
			}
			ids = ids[:len(ids)-1]
		}
	}
	return ids, times, nil
}

// cgroupProcs lists the processes in the cgroups of container sandboxes
// ids (the memory hierarchy on v1, the unified one on v2).
func cgroupProcs(node string, ids []string) []int {
	l, err := cgroup.Host()
	if err != nil {
		return nil
	}
	var pids []int
	for _, id := range ids {
		rel := "/warren/" + node + "/" + id
		d := cgroup.Dir{Path: filepath.Join(l.Unified, rel), V2: true}
		if p, ok := l.V1Dir("memory", rel); ok {
			d = cgroup.Dir{Path: p}
		}
		ps, _ := d.TreeProcs()
		pids = append(pids, ps...)
	}
	return pids
}

// memoryCgroups are the memory cgroups of pids (the memory hierarchy's
// on v1, the unified one's on v2), as /proc/PID/cgroup names them.
func memoryCgroups(pids []int) []string {
	var cgs []string
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			continue
		}
		var v1, v2 string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) != 3 {
				continue
			}
			if f[0] == "0" && f[1] == "" {
				v2 = f[2]
			}
			for _, c := range strings.Split(f[1], ",") {
				if c == "memory" {
					v1 = f[2]
				}
			}
		}
		if v1 != "" {
			cgs = append(cgs, v1)
		} else if v2 != "" {
			cgs = append(cgs, v2)
		}
	}
	return cgs
}

// charged is benchup.Charged, 0 if unreadable.
func charged(rel string) int64 {
	v, _ := benchup.Charged(rel)
	return v
}

func report(results map[string][]result, cfg config) {
	vm, ct := results["microvm"], results["container"]
	fmt.Printf("\n%-13s %24s %24s %20s %20s %20s %22s %22s\n", "", "create->first exec p50", "p99", "idle used/sandbox", "PSS/sandbox", "charged/sandbox", "exec p50", "p99")
	for _, name := range []string{"microvm", "container"} {
		rs := results[name]
		fmt.Printf("  %-11s %24s %24s %20s %20s %20s %22s %22s\n", name,
			spread(rs, func(r result) float64 { return ms(pct(r.firstExec, 50)) }, "%.0fms"),
			spread(rs, func(r result) float64 { return ms(pct(r.firstExec, 99)) }, "%.0fms"),
			spread(rs, func(r result) float64 { return mib(r.used) }, "%.1fMiB"),
			spread(rs, func(r result) float64 { return mib(r.pss.PSS) }, "%.2fMiB"),
			spread(rs, func(r result) float64 { return mib(r.charged) }, "%.2fMiB"),
			spread(rs, func(r result) float64 { return ms(pct(r.exec, 50)) }, "%.2fms"),
			spread(rs, func(r result) float64 { return ms(pct(r.exec, 99)) }, "%.2fms"))
	}
	ratio := func(f func(result) float64) string {
		var v []float64
		for i := range min(len(vm), len(ct)) {
			if f(ct[i]) <= 0 {
				return "- (the container's is below what the host's noise resolves)"
			}
			v = append(v, f(vm[i])/f(ct[i]))
		}
		return spreadOf(v, "%.0fx")
	}
	fmt.Printf("  microvm / container (per round: median (min-max)):\n")
	fmt.Printf("    create->first exec  p50 %s  p99 %s\n",
		ratio(func(r result) float64 { return ms(pct(r.firstExec, 50)) }), ratio(func(r result) float64 { return ms(pct(r.firstExec, 99)) }))
	fmt.Printf("    idle memory         used %s  PSS %s  charged %s\n",
		ratio(func(r result) float64 { return float64(r.used) }), ratio(func(r result) float64 { return float64(r.pss.PSS) }),
		ratio(func(r result) float64 { return float64(r.charged) }))
	fmt.Printf("    exec round trip     p50 %s  p99 %s\n",
		ratio(func(r result) float64 { return ms(pct(r.exec, 50)) }), ratio(func(r result) float64 { return ms(pct(r.exec, 99)) }))
	fmt.Printf("  used = host MemTotal - MemAvailable after %s idle minus before the creates, / %d (moves with anything else on the host);\n"+
		"  PSS = smaps_rollup Pss of the sandboxes' host processes (microvm: its QEMU; container: its cgroup's), / %d;\n"+
		"  charged = memory charged to the sandboxes' host cgroups (microvm: its QEMU's; container: /warren/NODE/ID), page cache included, / %d\n",
		cfg.idle, cfg.n, cfg.n, cfg.n)
	if len(vm) > 0 && len(ct) > 0 {
		fmt.Printf("  host processes counted: microvm %d, container %d (last round)\n", vm[len(vm)-1].procs, ct[len(ct)-1].procs)
		last := vm[len(vm)-1]
		fmt.Printf("  a microVM's PSS (last round): %.1f MiB: its guest's RAM (%d MiB) %.1f MiB touched, TCG's translation cache %.1f MiB, the rest of QEMU %.1f MiB (anon %.1f, file %.1f in all)\n",
			mib(last.pss.PSS), (cfg.mem+128<<20)>>20, mib(last.split.GuestRAM), mib(last.split.TCG), mib(last.split.Rest), mib(last.pss.PSSAnon), mib(last.pss.PSSFile))
		if g := last.guest; g != nil {
			fmt.Printf("  its guest's own view (/proc/meminfo, idle): MemTotal %.1f, used (MemTotal-MemFree) %.1f: page cache %.1f (shmem %.1f), anon %.1f, slab %.1f, page tables %.1f, kernel stacks %.1f MiB\n",
				mib(g["MemTotal"]), mib(g["MemTotal"]-g["MemFree"]), mib(g["Cached"]+g["Buffers"]), mib(g["Shmem"]), mib(g["AnonPages"]),
				mib(g["Slab"]), mib(g["PageTables"]), mib(g["KernelStack"]))
		}
	}
}

// otherQEMUs lists the QEMU processes on the host that are not this
// run's (other work on a shared machine, which moves MemAvailable).
func otherQEMUs(data string) []int {
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

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

// spread prints "median (min-max)" of f over rs.
func spread(rs []result, f func(result) float64, format string) string {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return spreadOf(v, format)
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
	return med + " (" + strings.TrimSpace(fmt.Sprintf(format, s[0])) + "-" + strings.TrimSpace(fmt.Sprintf(format, s[len(s)-1])) + ")"
}
