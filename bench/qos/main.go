// Command qos measures how well best-effort sandboxes stay out of
// latency-sensitive ones' way (issue 18; DSec's chess experiment), in one
// run:
//
//   - Latency sandboxes (-latency, default one per core) each run a fixed
//     chess search, stockfish's bench over its 50 default positions at a
//     fixed depth with one thread, and the time each search takes is one
//     move's latency (stockfish times it itself, with the wall clock).
//   - Loader sandboxes keep -load of the node's CPU busy: each a busy loop
//     held to its share of a core by its CPU limit (cfs quota), as agents'
//     builds and test runs are.
//
// Three phases, the same searches in each: alone (the baseline), with the
// loaders as latency sandboxes (no QoS), and with the loaders as
// best-effort sandboxes (QoS: SCHED_IDLE, an idle cgroup); the loaded
// phases alternate in order by round. Reported: each loaded phase's
// latency inflation against the baseline (per-move p50 and mean, and the
// whole search), median over rounds with the spread. Target: <= 10% with
// QoS (DSec: 17.3%, and 45.2% without).
//
// Needs root, runc and stockfish (Debian's: /usr/games/stockfish); the
// sandboxes' environment is built from the host's stockfish, its shared
// libraries and busybox.
//
//	sudo go run ./bench/qos -rounds 3
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/bench/internal/stats"
	"github.com/warrenhq/warren/client"
)

type config struct {
	latency int     // latency sandboxes
	load    float64 // the loaders' share of the node's CPU
	loaders int
	depth   int
	rounds  int
	keep    bool
}

func main() {
	var cfg config
	flag.IntVar(&cfg.latency, "latency", runtime.NumCPU(), "latency sandboxes, each one search thread")
	flag.Float64Var(&cfg.load, "load", 0.5, "the share of the node's CPU the loaders keep busy")
	flag.IntVar(&cfg.loaders, "loaders", 2*runtime.NumCPU(), "loader sandboxes sharing that load")
	flag.IntVar(&cfg.depth, "depth", 14, "search depth of each move")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds (each runs every phase)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the data directory")
	flag.Parse()
	if err := run(context.Background(), cfg); err != nil {
		log.Fatalf("bench/qos: %v", err)
	}
}

// phase is one configuration of the node: which loaders run, and how.
type phase struct {
	name string
	load bool   // loaders running
	qos  string // their class
}

var (
	baseline = phase{"alone", false, ""}
	noQoS    = phase{"loaded, no QoS", true, api.QoSLatency}
	withQoS  = phase{"loaded, QoS", true, api.QoSBestEffort}
)

// result is one phase's searches: every move's time, and the whole
// search's (the slowest sandbox's).
type result struct {
	moves []time.Duration
	total time.Duration
}

func run(ctx context.Context, cfg config) error {
	sf, err := exec.LookPath("stockfish")
	if err != nil {
		if sf, err = exec.LookPath("/usr/games/stockfish"); err != nil {
			return fmt.Errorf("stockfish not found (apt-get install stockfish)")
		}
	}
	dir, err := benchup.TempDir("bench-qos-")
	if err != nil {
		return err
	}
	if !cfg.keep {
		defer os.RemoveAll(dir)
	}
	bin, err := benchup.Build(ctx, dir)
	if err != nil {
		return err
	}
	rootfs := filepath.Join(dir, "chess-1")
	if err := chessRootfs(rootfs, sf); err != nil {
		return err
	}
	d, err := benchup.StartProc(ctx, bin, filepath.Join(dir, "data"))
	if err != nil {
		return err
	}
	defer d.Stop()
	c := d.Client
	ref, err := benchup.Env(ctx, c, rootfs)
	if err != nil {
		return err
	}
	nodes, err := c.ListNodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].QoS == nil {
		return fmt.Errorf("node: %+v, %v", nodes, err)
	}
	perLoader := cfg.load * float64(runtime.NumCPU()) / float64(cfg.loaders)
	fmt.Printf("bench/qos: %d latency sandboxes (stockfish bench, depth %d, 1 thread), %d loaders at %.2f cores each (%.0f%% of %d cores), %d rounds, %s\n",
		cfg.latency, cfg.depth, cfg.loaders, perLoader, 100*cfg.load, runtime.NumCPU(), cfg.rounds, time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("node: best-effort cgroups yield by %s; core scheduling: %s\n", nodes[0].QoS.Group, nodes[0].QoS.CoreScheduling)

	lat := make([]string, cfg.latency)
	defer func() {
		for _, id := range lat {
			if id != "" {
				c.DeleteSandbox(context.Background(), id)
			}
		}
	}()
	for i := range lat {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: ref, Resources: api.Resources{CPU: 1, Memory: 256 << 20}})
		if err != nil {
			return err
		}
		lat[i] = sb.ID
	}
	res := map[string][]*result{}
	for r := 0; r < cfg.rounds; r++ {
		order := []phase{baseline, noQoS, withQoS}
		if r%2 == 1 {
			order = []phase{baseline, withQoS, noQoS}
		}
		for _, ph := range order {
			out, err := measure(ctx, c, cfg, ref, lat, ph, perLoader)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, ph.name, err)
			}
			res[ph.name] = append(res[ph.name], out)
			fmt.Printf("  round %d %-15s moves %d, p50 %v, mean %v, p99 %v, search %v\n", r+1, ph.name, len(out.moves),
				stats.Pct(out.moves, 50), stats.Mean(out.moves).Round(100*time.Microsecond), stats.Pct(out.moves, 99), out.total.Round(time.Millisecond))
		}
	}
	fmt.Println("\nlatency inflation against the baseline (median over rounds [min..max]; target <= 10% with QoS, DSec 17.3%)")
	for _, ph := range []phase{noQoS, withQoS} {
		for _, f := range []struct {
			name string
			val  func(*result) float64
		}{
			{"per-move p50", func(r *result) float64 { return float64(stats.Pct(r.moves, 50)) }},
			{"per-move mean", func(r *result) float64 { return float64(stats.Mean(r.moves)) }},
			{"whole search", func(r *result) float64 { return float64(r.total) }},
		} {
			var xs []float64
			for i := range res[ph.name] {
				xs = append(xs, 100*(f.val(res[ph.name][i])/f.val(res[baseline.name][i])-1))
			}
			med, lo, hi := stats.Spread(xs)
			fmt.Printf("  %-15s %-14s %+7.1f%% [%+.1f..%+.1f]\n", ph.name, f.name, med, lo, hi)
		}
	}
	return nil
}

// measure runs one phase: the loaders it asks for, then every latency
// sandbox's search at once; the loaders are deleted after.
func measure(ctx context.Context, c *client.Client, cfg config, ref string, lat []string, ph phase, perLoader float64) (*result, error) {
	var loaders []string
	defer func() {
		for _, id := range loaders {
			c.DeleteSandbox(context.Background(), id)
		}
	}()
	if ph.load {
		for i := 0; i < cfg.loaders; i++ {
			sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: ref, QoS: ph.qos,
				Resources: api.Resources{CPU: perLoader, Memory: 64 << 20}})
			if err != nil {
				return nil, err
			}
			loaders = append(loaders, sb.ID)
			// A busy loop in the background, held to perLoader cores by
			// the sandbox's CPU limit.
			if r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "(while :; do :; done) > /dev/null 2>&1 &"}); err != nil || r.ExitCode != 0 {
				return nil, fmt.Errorf("start loader: %v %+v", err, r)
			}
		}
		time.Sleep(2 * time.Second) // the load settles
	}
	out := &result{}
	var mu sync.Mutex
	errs := make(chan error, len(lat))
	start := time.Now()
	var wg sync.WaitGroup
	for _, id := range lat {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Exec(ctx, id, api.ExecRequest{
				Argv:    []string{"/usr/games/stockfish", "bench", "16", "1", strconv.Itoa(cfg.depth), "default", "depth"},
				Timeout: api.Duration(30 * time.Minute), MaxOutput: 16 << 20})
			if err != nil || r.ExitCode != 0 {
				errs <- fmt.Errorf("stockfish bench in %s: %v %+v", id, err, r)
				return
			}
			moves, err := parseBench(r.Stdout + r.Stderr)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			out.moves = append(out.moves, moves...)
			out.total = max(out.total, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return out, nil
}

// parseBench returns each position's search time from stockfish bench's
// output: the "time" of the last info line before each bestmove.
func parseBench(out string) ([]time.Duration, error) {
	var moves []time.Duration
	last := -1
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == "info" {
			for i := 0; i+1 < len(f); i++ {
				if f[i] == "time" {
					if ms, err := strconv.Atoi(f[i+1]); err == nil {
						last = ms
					}
				}
			}
		}
		if len(f) > 0 && f[0] == "bestmove" && last >= 0 {
			moves = append(moves, time.Duration(last)*time.Millisecond)
			last = -1
		}
	}
	if len(moves) < 10 {
		return nil, fmt.Errorf("stockfish bench: %d moves timed in its output (%.200q)", len(moves), out)
	}
	return moves, nil
}

// chessRootfs makes a root filesystem at dir with stockfish, the shared
// libraries it links (as ldd lists them, at the same paths) and a static
// busybox as /bin/sh.
func chessRootfs(dir, stockfish string) error {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox not found (apt-get install busybox-static)")
	}
	files := map[string]string{"/usr/games/stockfish": stockfish, "/bin/busybox": busybox}
	out, err := exec.Command("ldd", stockfish).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %v", stockfish, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(l) {
			if strings.HasPrefix(f, "/") {
				files[f] = f
			}
		}
	}
	for dst, src := range files {
		real, err := filepath.EvalSymlinks(src)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(real)
		if err != nil {
			return err
		}
		p := filepath.Join(dir, dst)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o755); err != nil {
			return err
		}
	}
	for _, name := range []string{"sh", "cat", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", name)); err != nil {
			return err
		}
	}
	for _, d := range []string{"tmp", "proc", "dev", "sys", "etc"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	return nil
}
