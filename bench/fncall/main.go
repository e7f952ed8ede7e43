// Command fncall measures a trivial job run once per call in a fresh
// sandbox: warren's FnCall (POST /v1/fn/run against a running `warren up`)
// against the bare process and three per-call sandboxes, all in one run on
// the same machine. Results and how to read them: docs/BENCHMARKS.md.
//
//	sudo go run ./bench/fncall                 # -rounds 3 -dur 5s -warm 1s -conc 1,8,64
//	sudo go run ./bench/fncall -quick          # a smoke run, 1-2 minutes (podman up to c8)
//	sudo go run ./bench/fncall -url http://127.0.0.1:17443 -token-file DIR/admin-token \
//	    -warren-c-runtime c-bin -jobs python,c,c-compile
//
// Jobs: "python" is print(1) in /box/main.py, run with the interpreter
// flags of warren's python3 runtime (-python-args auto; `-I -S` without
// warren); "c" is a prepared hello-world binary, /box/hello (dynamically
// linked, compiled once before timing with the image's gcc); "c-compile"
// (warren only) sends hello.c to warren's c runtime. Every local peer runs
// the same program from the same root: a read-only overlay of a small /box
// layer over a snapshot of the Debian runtime image (debian-python-12,
// debian-gcc-12 from scripts/build-runtime-images). Peers:
//
//   - bare: the program itself, chrooted into that root (Go's
//     SysProcAttr.Chroot, so no extra exec), nothing else.
//   - bwrap: `bwrap --unshare-all --ro-bind ROOT / --proc --dev --tmpfs
//     /tmp` per call.
//   - runc: `runc run` per call, one OCI bundle per job prepared once
//     (runc's default spec: fresh pid, net, ipc, uts and mount namespaces,
//     read-only root, a tmpfs /tmp), a new container id per call.
//   - podman: `podman run --rm --network none --rootfs ROOT` per call
//     (with --ulimit values this machine allows; see newPodman).
//   - warren: POST /v1/fn/run over plain net/http; skipped with a message
//     when -url does not answer. The c job needs a runtime without a
//     compile step (-warren-c-runtime), which gets the binary as a file.
//
// For every job, concurrency and round, each peer (in an order rotated
// every round) runs c workers that call back to back: a warm-up (-warm,
// and until one call per worker has ended, so the workers are out of
// step), then a window (-dur, stretched until max(-min-calls, c) calls
// ended in it); the calls that end inside the window give throughput, p50
// and p99. Every call's stdout is checked ("1\n", "hello\n"); an error or
// a wrong answer counts as failed and is left out of the latencies.
//
// CPU per call is counted over the whole cell (warm-up and drain
// included) two ways. "cgroup": this process moves into a cpuacct cgroup
// of its own, below which every local peer's processes are charged
// wherever they go (runc's and podman's container cgroups are put below
// it), plus, for warren, the daemon and its containers' cgroup; peers run
// one at a time, so it is the peer's CPU and this driver's. "host": the
// whole machine's busy time (/proc/stat), which also counts everything
// else running on this shared machine. "others' cores" is the difference
// per second of the cell: how busy the machine was with other work while
// the peer ran, to read the spread by.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	rounds       int
	minCalls     int
	podmanMax    int
	dur, warm    time.Duration
	conc         []int
	peers, jobs  []string
	pyRootfs     string
	cRootfs      string
	url          string
	tokenFile    string
	warrenPID    int
	warrenCgroup string
	warrenCRun   string
	bURL, bToken string // a second warren (peer warren-b), for A/B runs
	warrenWait   time.Duration
	pythonArgs   string
	keep         bool
}

func main() {
	var cfg config
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds (report median and spread)")
	flag.DurationVar(&cfg.dur, "dur", 5*time.Second, "measured window per peer, job and concurrency")
	flag.IntVar(&cfg.minCalls, "min-calls", 20, "stretch a window until this many calls (and at least one per worker) ended in it")
	flag.DurationVar(&cfg.warm, "warm", time.Second, "warm-up before each window (and until one call per worker ended)")
	concList := flag.String("conc", "1,8,64", "concurrencies (workers calling back to back)")
	peerList := flag.String("peers", "bare,bwrap,runc,podman,warren", "peers to run")
	jobList := flag.String("jobs", "python,c", "jobs to run (python, c; c-compile is warren only)")
	flag.IntVar(&cfg.podmanMax, "podman-max-conc", 0, "run podman only up to this concurrency (0: all; each podman cell at c64 takes about a minute here)")
	quick := flag.Bool("quick", false, "short run (-rounds 2 -dur 500ms -warm 200ms -min-calls 5 -podman-max-conc 8): about 2 minutes")
	flag.StringVar(&cfg.pyRootfs, "python-rootfs", "/var/cache/warren/images/debian-python-12", "rootfs of the python job (scripts/build-runtime-images)")
	flag.StringVar(&cfg.cRootfs, "c-rootfs", "/var/cache/warren/images/debian-gcc-12", "rootfs of the c job and its compiler; if absent, -python-rootfs and the host's gcc")
	flag.StringVar(&cfg.url, "url", "http://127.0.0.1:7443", "a running `warren up` (the warren peer)")
	flag.StringVar(&cfg.tokenFile, "token-file", "/var/lib/warren/admin-token", "its admin token")
	flag.IntVar(&cfg.warrenPID, "warren-pid", 0, "pid of the warren daemon, for its CPU (default: whoever listens on -url's port)")
	flag.StringVar(&cfg.warrenCgroup, "warren-cgroup", "", "cgroup (cpuacct hierarchy) of warren's FnCall containers, for their CPU (default /warren/<node>/fn)")
	flag.StringVar(&cfg.warrenCRun, "warren-c-runtime", "c", "warren runtime for the c job: one without a compile step, given the binary as the file it runs")
	flag.StringVar(&cfg.bURL, "b-url", "", "a second `warren up` measured as peer warren-b (add it to -peers), against warren round by round: an A/B of two builds or settings")
	flag.StringVar(&cfg.bToken, "b-token-file", "", "the second warren's admin token")
	flag.DurationVar(&cfg.warrenWait, "warren-wait", 5*time.Minute, "how long to wait for warren's runtimes to become available")
	flag.StringVar(&cfg.pythonArgs, "python-args", "auto", `python3's flags in the python job ("auto": those of warren's python3 runtime if the warren peer runs, else "-I -S")`)
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary dir")
	flag.Parse()
	if *quick {
		cfg.rounds, cfg.dur, cfg.warm, cfg.minCalls, cfg.podmanMax = 2, 500*time.Millisecond, 200*time.Millisecond, 5, 8
	}
	var err error
	if cfg.conc, err = ints(*concList); err != nil {
		fmt.Fprintln(os.Stderr, "bench/fncall: -conc:", err)
		os.Exit(2)
	}
	cfg.peers, cfg.jobs = strings.Split(*peerList, ","), strings.Split(*jobList, ",")
	// The first interrupt stops new calls; the calls in flight finish (a
	// killed `runc run` or `podman run` leaves a container and its cgroups
	// behind) and everything is cleaned up. A second one kills.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		signal.Reset(os.Interrupt, syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, "bench/fncall: interrupted; finishing the calls in flight, then cleaning up (again to kill)")
		cancel()
	}()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench/fncall:", err)
		os.Exit(1)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// setPythonArgs sets the python job's interpreter flags: given, or
// ("auto") those of warren's python3 runtime, or -I -S.
func setPythonArgs(jobs []*job, given string, w *peer) {
	args := strings.Fields(given)
	switch {
	case given != "auto":
	case w != nil && w.pythonArgs != nil:
		args = w.pythonArgs
	default:
		args = []string{"-I", "-S"}
	}
	for _, j := range jobs {
		if j.name == "python" {
			j.argv = append(append([]string{"/usr/bin/python3"}, args...), "/box/main.py")
			j.about = fmt.Sprintf("`%s` (print(1)), %s", strings.Join(j.argv, " "), j.image)
		}
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, cfg config) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (chroot, mounts, runc, podman)")
	}
	t0 := time.Now()
	dir, err := os.MkdirTemp("", "warren-bench-fncall-")
	if err != nil {
		return err
	}
	var mounts []string
	defer func() {
		for i := len(mounts) - 1; i >= 0; i-- {
			syscall.Unmount(mounts[i], syscall.MNT_DETACH)
		}
		if !cfg.keep {
			os.RemoveAll(dir)
		}
	}()

	g, err := newCPUGroup()
	if err != nil {
		return fmt.Errorf("cgroup for CPU accounting: %w", err)
	}
	defer g.close()
	jobs, jm, err := prepareJobs(ctx, cfg, dir)
	mounts = jm
	if err != nil {
		return err
	}
	// Warren first: its python3 runtime's flags become every peer's
	// (runc writes them into its bundle when it is made).
	built := map[string]*peer{}
	build := func(name string) error {
		p, err := newPeer(ctx, name, cfg, dir, jobs, g)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if p.skip != "" {
			fmt.Printf("peer %s skipped: %s\n", name, p.skip)
			return nil
		}
		built[name] = p
		return nil
	}
	if contains(cfg.peers, "warren") {
		if err := build("warren"); err != nil {
			return err
		}
	}
	setPythonArgs(jobs, cfg.pythonArgs, built["warren"])
	for _, name := range cfg.peers {
		if name != "warren" {
			if err := build(name); err != nil {
				return err
			}
		}
	}
	for _, p := range built {
		if p.close != nil {
			defer p.close()
		}
	}
	var peers []*peer
	for _, name := range cfg.peers {
		if p := built[name]; p != nil {
			peers = append(peers, p)
		}
	}
	if len(peers) == 0 || peers[0].name != "bare" {
		return errors.New("the bare peer must run (and first in -peers): every ratio is against it")
	}
	// One untimed call of each job by each peer, so that a peer that cannot
	// run a job here says why before any figure is taken, and is left out
	// of that job (the bare peer must run them all).
	var ran []*job
	for _, j := range jobs {
		n := 0
		for _, p := range peers {
			if !p.runs(j) {
				continue
			}
			out, err := p.call(context.WithoutCancel(ctx), j)
			if err == nil && out != j.want {
				err = fmt.Errorf("stdout %q, want %q", out, j.want)
			}
			if err != nil && p.name == "bare" && !j.warrenOnly {
				return fmt.Errorf("first call of %s by bare: %w", j.name, err)
			}
			if err != nil {
				fmt.Printf("peer %s: job %s left out, its first call failed: %v\n", p.name, j.name, err)
				if p.not == nil {
					p.not = map[string]string{}
				}
				p.not[j.name] = err.Error()
				continue
			}
			n++
		}
		if n == 0 {
			fmt.Printf("job %s skipped: no peer here runs it\n", j.name)
			continue
		}
		ran = append(ran, j)
	}
	jobs = ran

	fmt.Printf("\nbench/fncall: %d rounds; per peer, job and concurrency a %s window, stretched to max(%d, concurrency) calls, after %s of warm-up and at least one call per worker; %s\n",
		cfg.rounds, cfg.dur, cfg.minCalls, cfg.warm, time.Now().UTC().Format(time.RFC3339))
	for _, j := range jobs {
		fmt.Printf("job %-9s %s\n", j.name, j.about)
	}
	for _, p := range peers {
		fmt.Printf("peer %-7s %s\n", p.name, p.about)
	}
	if cfg.podmanMax > 0 {
		fmt.Printf("podman runs only up to concurrency %d (-podman-max-conc)\n", cfg.podmanMax)
	}

	res := map[string][]sample{} // job/conc/peer -> one per round
	key := func(j *job, c int, p *peer) string { return fmt.Sprintf("%s/%d/%s", j.name, c, p.name) }
	for r := 0; r < cfg.rounds; r++ {
		for _, j := range jobs {
			for _, c := range cfg.conc {
				// Rotate who goes first so drift favours nobody.
				for i := range peers {
					p := peers[(i+r)%len(peers)]
					if !p.runs(j) || (p.name == "podman" && cfg.podmanMax > 0 && c > cfg.podmanMax) {
						continue
					}
					if ctx.Err() != nil {
						return ctx.Err()
					}
					s := drive(ctx, p, j, c, cfg.warm, cfg.dur, cfg.minCalls, g)
					res[key(j, c, p)] = append(res[key(j, c, p)], s)
					fmt.Fprintf(os.Stderr, "round %d %-9s c%-3d %-7s %7.1f calls/s p50 %6.1fms p99 %7.1fms  %4d calls in %5.2fs  failed %d  others %.1f cores\n",
						r+1, j.name, c, p.name, s.rate, ms(s.p50), ms(s.p99), s.n, s.window.Seconds(), s.failed, s.others)
				}
			}
		}
	}

	rate := func(s sample) float64 { return s.rate }
	p50 := func(s sample) float64 { return ms(s.p50) }
	p99 := func(s sample) float64 { return ms(s.p99) }
	cpuGroup := func(s sample) float64 { return ms(s.cpuGroup) }
	cpuHost := func(s sample) float64 { return ms(s.cpuHost) }
	others := func(s sample) float64 { return s.others }
	for _, j := range jobs {
		for _, c := range cfg.conc {
			fmt.Printf("\n%-9s c%-4d %-5s %20s %20s %20s %7s %20s %20s %16s\n", j.name, c, "", "calls/s", "p50", "p99", "failed",
				"cpu/call cgroup", "cpu/call host", "others' cores")
			var firstErrs []string
			for _, p := range peers {
				ss := res[key(j, c, p)]
				if len(ss) == 0 {
					continue
				}
				failed := 0
				for _, s := range ss {
					failed += s.failed
					if s.firstErr != "" && len(firstErrs) < 4 {
						firstErrs = append(firstErrs, p.name+": "+s.firstErr)
					}
				}
				fmt.Printf("     %-17s %20s %20s %20s %7d %20s %20s %16s\n", p.name, spread(ss, rate, "%.1f"),
					spread(ss, p50, "%.1fms"), spread(ss, p99, "%.1fms"), failed,
					spread(ss, cpuGroup, "%.1fms"), spread(ss, cpuHost, "%.1fms"), spread(ss, others, "%.1f"))
			}
			bare := res[key(j, c, peers[0])]
			for _, p := range peers[1:] {
				ss := res[key(j, c, p)]
				if len(ss) == 0 || len(bare) == 0 {
					continue
				}
				// Each round's figure against the bare peer's in the same
				// round, whose machine state it shared: the median of
				// those, and their spread.
				line := fmt.Sprintf("     %-17s throughput %s   p50 %s   p99 %s   cpu/call %s",
					p.name+"/bare", paired(ss, bare, rate), paired(ss, bare, p50), paired(ss, bare, p99), paired(ss, bare, cpuGroup))
				if p.name == "warren" {
					line += "   (targets: throughput >= 0.8x, p50 <= 1.3x)"
				}
				fmt.Println(line)
			}
			if wa, wb := built["warren"], built["warren-b"]; wa != nil && wb != nil && len(res[key(j, c, wa)]) > 0 && len(res[key(j, c, wb)]) > 0 {
				a, b := res[key(j, c, wa)], res[key(j, c, wb)]
				fmt.Printf("     %-17s throughput %s   p50 %s   p99 %s   cpu/call %s\n", "warren-b/warren",
					paired(b, a, rate), paired(b, a, p50), paired(b, a, p99), paired(b, a, cpuGroup))
			}
			for _, e := range firstErrs {
				fmt.Printf("     error: %s\n", e)
			}
		}
	}
	fmt.Printf("\nwhole run %s\n", time.Since(t0).Round(time.Second))
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func values(ss []sample, f func(sample) float64) []float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	sort.Float64s(v)
	return v
}

func median(ss []sample, f func(sample) float64) float64 {
	v := values(ss, f)
	return v[len(v)/2]
}

// paired prints the median and spread of ss's figures over base's, round
// by round ("0.81x (0.78-0.84)"); with a round missing on either side, the
// ratio of the medians.
func paired(ss, base []sample, f func(sample) float64) string {
	if len(ss) != len(base) {
		return fmt.Sprintf("%.2fx", median(ss, f)/median(base, f))
	}
	r := make([]float64, len(ss))
	for i := range ss {
		r[i] = f(ss[i]) / f(base[i])
	}
	sort.Float64s(r)
	if len(r) == 1 {
		return fmt.Sprintf("%.2fx", r[0])
	}
	return fmt.Sprintf("%.2fx (%.2f-%.2f)", r[len(r)/2], r[0], r[len(r)-1])
}

// spread prints "median (min-max)".
func spread(ss []sample, f func(sample) float64, format string) string {
	v := values(ss, f)
	return fmt.Sprintf(format+" ("+format+"-"+format+")", v[len(v)/2], v[0], v[len(v)-1])
}
