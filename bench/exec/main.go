// Command exec measures what an exec costs an agent's tool call: the round
// trip of `true` (and, with -python, `python3 -c pass`) through warren's
// API into a running container sandbox, against peers that run the same
// command in the same sandbox in the same run:
//
//	runc exec   `runc exec` on warren's own container (what warren ran
//	            before warren-enter)
//	nsenter -a  entering the sandbox's namespaces from the host (the floor
//	            of any exec that joins a running sandbox)
//	host        a plain fork+exec on the host (no sandbox at all)
//
// Sequentially (one caller) and with -c concurrent callers, rounds rotated
// so no peer always runs first, median and spread over the rounds, and the
// ratios to nsenter (issue 13's target: warren's p50 within 1.5x of it).
//
//	sudo go run ./bench/exec [-n 200] [-c 8] [-rounds 3] [-python DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/client"
)

func main() {
	n := flag.Int("n", 200, "calls per peer, round and mode")
	conc := flag.Int("c", 8, "concurrent callers in the concurrent mode")
	rounds := flag.Int("rounds", 3, "rounds (median and spread)")
	python := flag.String("python", "", "a rootfs with python3 (e.g. /var/cache/warren/images/debian-python-12): also measure `python3 -c pass`")
	flag.Parse()
	if err := run(*n, *conc, *rounds, *python); err != nil {
		fmt.Fprintln(os.Stderr, "bench/exec:", err)
		os.Exit(1)
	}
}

// peer runs one call of the command and returns when it is over.
type peer struct {
	name string
	call func(ctx context.Context) error
}

type result struct{ perSec, p50, p99 float64 }

func run(n, conc, rounds int, python string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (runc, nsenter, mounts)")
	}
	dir, err := benchup.TempDir("warren-bench-exec-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dataDir := filepath.Join(dir, "warren")
	c, err := benchup.InProcess(ctx, dataDir, false, true)
	if err != nil {
		return err
	}

	commands := []struct {
		name, image string
		argv        []string
	}{{"true", "busybox", []string{"true"}}}
	if python != "" {
		if err := importRootfs(ctx, c, python, "bench-python"); err != nil {
			return err
		}
		commands = append(commands, struct {
			name, image string
			argv        []string
		}{"python3 -c pass", "bench-python", []string{"python3", "-c", "pass"}})
	}
	fmt.Printf("bench/exec: n=%d per peer, round and mode, %d concurrent callers, %d rounds, %s\n", n, conc, rounds, time.Now().UTC().Format(time.RFC3339))
	for _, cmd := range commands {
		// As many cores as the host has: nsenter joins no cgroup, so a
		// sandbox's CPU limit (one core by default) would bind warren and
		// runc exec alone under concurrent calls.
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: cmd.image,
			Resources: api.Resources{CPU: float64(runtime.NumCPU())}})
		if err != nil {
			return err
		}
		peers, err := peersFor(c, dataDir, sb.ID, cmd.argv)
		if err != nil {
			return err
		}
		for _, mode := range []struct {
			name string
			conc int
		}{{"seq", 1}, {fmt.Sprintf("c%d", conc), conc}} {
			got := map[string][]result{}
			for r := 0; r < rounds; r++ {
				for i := range peers {
					p := peers[(i+r)%len(peers)]
					res, err := measure(ctx, p, n, mode.conc)
					if err != nil {
						return fmt.Errorf("%s: %w", p.name, err)
					}
					got[p.name] = append(got[p.name], res)
				}
			}
			report(cmd.name, mode.name, peers, got)
		}
		c.DeleteSandbox(ctx, sb.ID)
	}
	return nil
}

// peersFor are the ways to run argv in sandbox id.
func peersFor(c *client.Client, dataDir, id string, argv []string) ([]peer, error) {
	runcRoot := filepath.Join(dataDir, "node", "runc")
	out, err := exec.Command("runc", "--root", runcRoot, "state", id).Output()
	if err != nil {
		return nil, fmt.Errorf("runc state: %w", err)
	}
	pid := ""
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), `"pid": `); ok {
			pid = strings.TrimSuffix(v, ",")
		}
	}
	if pid == "" {
		return nil, fmt.Errorf("no pid in runc state: %s", out)
	}
	host := argv
	if p, err := exec.LookPath(argv[0]); err == nil {
		host = append([]string{p}, argv[1:]...)
	}
	runProc := func(name string, args ...string) func(context.Context) error {
		return func(ctx context.Context) error {
			cmd := exec.CommandContext(ctx, name, args...)
			cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
			return cmd.Run()
		}
	}
	return []peer{
		{"warren", func(ctx context.Context) error {
			r, err := c.Exec(ctx, id, api.ExecRequest{Argv: argv})
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", r.ExitCode, r.Stderr)
			}
			return err
		}},
		{"runc exec", runProc("runc", append([]string{"--root", runcRoot, "exec", id}, argv...)...)},
		{"nsenter -a", runProc("nsenter", append([]string{"-t", pid, "-a"}, argv...)...)},
		{"host", runProc(host[0], host[1:]...)},
	}, nil
}

// measure makes n calls of p from conc callers and returns calls/s, p50
// and p99 in milliseconds.
func measure(ctx context.Context, p peer, n, conc int) (result, error) {
	lat := make([]float64, n)
	var next int
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := p.call(ctx); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				lat[i] = float64(time.Since(t0).Microseconds()) / 1000
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return result{}, firstErr
	}
	wall := time.Since(start).Seconds()
	sort.Float64s(lat)
	return result{perSec: float64(n) / wall, p50: lat[n/2], p99: lat[n*99/100]}, nil
}

func report(command, mode string, peers []peer, got map[string][]result) {
	fmt.Printf("\n%s, %s%28s%22s%22s\n", command, mode, "calls/s", "p50", "p99")
	for _, p := range peers {
		rs := got[p.name]
		fmt.Printf("  %-12s %22s %22s %22s\n", p.name,
			medSpread(rs, func(r result) float64 { return r.perSec }, "%.0f"),
			medSpread(rs, func(r result) float64 { return r.p50 }, "%.2fms"),
			medSpread(rs, func(r result) float64 { return r.p99 }, "%.2fms"))
	}
	// Ratios per round, then their median: the machine drifts between
	// rounds, a peer's round-mates share its weather.
	for _, p := range []string{"warren", "runc exec"} {
		var p50s, rates []float64
		for i, r := range got[p] {
			base := got["nsenter -a"][i]
			p50s = append(p50s, r.p50/base.p50)
			rates = append(rates, r.perSec/base.perSec)
		}
		fmt.Printf("  %-12s / nsenter -a: p50 %.1fx (%.1f-%.1f), calls/s %.2fx\n", p,
			median(p50s), minOf(p50s), maxOf(p50s), median(rates))
	}
}

func medSpread(rs []result, f func(result) float64, format string) string {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, f(r))
	}
	return fmt.Sprintf(format+" ("+format+"-"+format+")", median(xs), minOf(xs), maxOf(xs))
}

// median of xs; of an even count, the mean of the middle two.
func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// importRootfs builds a base layer of dir and an environment name@1 from
// it through the API, as `warren layer build` and `warren env create` do.
func importRootfs(ctx context.Context, c *client.Client, dir, name string) error {
	if _, err := c.BuildLayerFromPath(ctx, client.LayerSpec{Name: name, Version: "1", Kind: api.LayerBase}, dir); err != nil {
		return fmt.Errorf("layer from %s: %w", dir, err)
	}
	_, err := c.CreateEnvironment(ctx, api.CreateEnvironmentRequest{Name: name, Version: "1", Base: name + "@1"})
	return err
}
