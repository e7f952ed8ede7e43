// Command ksm measures what memory merging saves (issue 18: KSM opt-in
// per project): the memory of a population of sandboxes of one
// environment, with their project merging memory and without, in one
// run.
//
// Each round runs both modes, in alternating order, each on a fresh
// `warren up` (the same build): in the merging mode the root project
// has memory_merge on (a single-tenant node). -n busybox sandboxes are
// created, each runs payload (./payload), which maps -mb MB of anonymous
// memory filled as sandboxes of one environment would be (the same
// content page for page) but for -unique percent of its pages, and then
// nothing calls them. Every second for -run the bench reads the memory
// charged to the node's sandboxes (its cgroup) and integrates it.
// Reported per mode: the integral (GB x s) and the memory at the end;
// and the reductions, median over rounds with the spread.
//
// KSM scans -pages-to-scan pages per 20 ms wake (the kernel's default,
// 100, is 20 MB/s: minutes for a node's worth); the bench sets it for
// the run and puts the host's KSM settings back after.
//
//	sudo go run ./bench/ksm -n 20 -mb 64 -unique 10 -run 90s -rounds 2
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/bench/internal/stats"
)

type config struct {
	n, mb, unique int
	run           time.Duration
	rounds        int
	pagesToScan   int
}

const ksm = "/sys/kernel/mm/ksm"

func main() {
	var cfg config
	flag.IntVar(&cfg.n, "n", 20, "sandboxes")
	flag.IntVar(&cfg.mb, "mb", 64, "MB of anonymous memory each fills")
	flag.IntVar(&cfg.unique, "unique", 10, "percent of each one's pages that are its own")
	flag.DurationVar(&cfg.run, "run", 90*time.Second, "how long memory is integrated, from the last payload start")
	flag.IntVar(&cfg.rounds, "rounds", 2, "rounds (each runs both modes)")
	flag.IntVar(&cfg.pagesToScan, "pages-to-scan", 1000, "KSM's pages_to_scan for the run")
	flag.Parse()
	if err := run(context.Background(), cfg); err != nil {
		log.Fatalf("bench/ksm: %v", err)
	}
}

type result struct {
	integral float64 // GB x s
	end      int64   // bytes charged at the end
	saved    int64   // KSM's pages_sharing at the end, in bytes
}

func run(ctx context.Context, cfg config) error {
	dir, err := benchup.TempDir("bench-ksm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := benchup.Build(ctx, dir)
	if err != nil {
		return err
	}
	payload := filepath.Join(dir, "payload")
	build := exec.CommandContext(ctx, "go", "build", "-o", payload, "./bench/ksm/payload")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build payload: %v: %s", err, out)
	}
	restore, err := tuneKSM(cfg.pagesToScan)
	if err != nil {
		return err
	}
	defer restore()
	fmt.Printf("bench/ksm: %d sandboxes x %d MB (%d%% unique), memory integrated over %v, pages_to_scan %d, %d rounds, %s\n",
		cfg.n, cfg.mb, cfg.unique, cfg.run, cfg.pagesToScan, cfg.rounds, time.Now().UTC().Format(time.RFC3339))
	modes := map[bool]string{true: "merge", false: "no merge"}
	res := map[string][]*result{}
	for r := 0; r < cfg.rounds; r++ {
		for _, on := range []bool{r%2 == 0, r%2 != 0} {
			out, err := measure(ctx, cfg, bin, payload, filepath.Join(dir, fmt.Sprintf("r%d-%v", r, on)), on)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, modes[on], err)
			}
			res[modes[on]] = append(res[modes[on]], out)
			fmt.Printf("  round %d %-8s integral %.1f GB*s, at the end %d MB charged, KSM sharing %d MB\n",
				r+1, modes[on], out.integral, out.end>>20, out.saved>>20)
		}
	}
	var integ, end []float64
	for i := range res["merge"] {
		m, n := res["merge"][i], res["no merge"][i]
		integ = append(integ, 100*(1-m.integral/n.integral))
		end = append(end, 100*(1-float64(m.end)/float64(n.end)))
	}
	med, lo, hi := stats.Spread(integ)
	fmt.Printf("\nwith memory merging, %% less (median over rounds [min..max])\n  time-integrated memory %.1f%% [%.1f..%.1f]\n", med, lo, hi)
	med, lo, hi = stats.Spread(end)
	fmt.Printf("  memory at the end      %.1f%% [%.1f..%.1f]\n", med, lo, hi)
	return nil
}

// tuneKSM sets pages_to_scan and returns what puts the host's settings
// back (run too: the merging node turns it on).
func tuneKSM(pages int) (func(), error) {
	old := map[string]string{}
	for _, f := range []string{"run", "pages_to_scan"} {
		b, err := os.ReadFile(filepath.Join(ksm, f))
		if err != nil {
			return nil, fmt.Errorf("this host has no KSM: %w", err)
		}
		old[f] = strings.TrimSpace(string(b))
	}
	if err := os.WriteFile(filepath.Join(ksm, "pages_to_scan"), []byte(strconv.Itoa(pages)), 0); err != nil {
		return nil, err
	}
	return func() {
		for f, v := range old {
			os.WriteFile(filepath.Join(ksm, f), []byte(v), 0)
		}
	}, nil
}

// measure runs one mode on a fresh node.
func measure(ctx context.Context, cfg config, bin, payload, dataDir string, merge bool) (*result, error) {
	args := []string{}
	if !merge {
		args = append(args, "--no-memory-merge")
	}
	d, err := benchup.StartProc(ctx, bin, dataDir, args...)
	if err != nil {
		return nil, err
	}
	defer d.Stop()
	c := d.Client
	if _, err := c.UpdateProject(ctx, "/", api.UpdateProjectRequest{MemoryMerge: &merge}); err != nil {
		return nil, fmt.Errorf("root project memory_merge: %w", err)
	}
	defer benchup.DeleteAll(c)
	req := api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{CPU: 0.1, Memory: api.Quantity(cfg.mb+64) << 20}}
	err = benchup.Populate(ctx, c, cfg.n, 4, req, func(i int, sb *api.Sandbox) error {
		if merge && sb.MemoryMergeGroup == "" {
			return fmt.Errorf("sandbox %s does not merge (the node's memory_merge: see warren node ls -o json)", sb.ID)
		}
		if err := c.CopyTo(ctx, sb.ID, payload, "/payload"); err != nil {
			return err
		}
		cmd := fmt.Sprintf("chmod +x /payload && (/payload %d %d %d > /dev/null 2>&1 &)", cfg.mb, cfg.unique, i+1)
		if r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: cmd}); err != nil || r.ExitCode != 0 {
			return fmt.Errorf("payload in %s: %v %+v", sb.ID, err, r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m, err := benchup.Integrate(benchup.NodeID(dataDir), cfg.run)
	if err != nil {
		return nil, err
	}
	out := &result{integral: m.Integral, end: m.End}
	if b, err := os.ReadFile(filepath.Join(ksm, "pages_sharing")); err == nil {
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		out.saved = n * int64(os.Getpagesize())
	}
	return out, nil
}
