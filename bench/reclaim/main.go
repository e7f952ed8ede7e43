// Command reclaim measures what idle reclaim saves (issue 18): the
// time-integrated memory of a population of idle sandboxes over a fixed
// run, with the node reclaiming idle sandboxes' memory and without, in
// one run.
//
// Each round runs both modes, in alternating order, each on a fresh
// `warren up` (the same build) with --reclaim-idle set (-idle) or off:
// -n busybox sandboxes are created, each touches -mb MB once (writes a
// file, as a checkout or a build leaves behind: page cache charged to the
// sandbox) and starts a process that sleeps, and then nothing calls them.
// Every second for -run, the bench reads the memory charged to the node's
// sandboxes (its cgroup, /warren/<node>) and integrates it. Reported: the
// integral (GB x s) per mode, and the reduction, median over rounds with
// the spread. Target: >= 30% (DSec, DAMON plus balloon free-page
// reporting: 21.2%).
//
// What reclaim can take here: the page cache always; anonymous memory only
// where the node swaps (warren up --swap zram:SIZE), which this run does
// not set up.
//
//	sudo go run ./bench/reclaim -n 50 -mb 20 -run 2m -rounds 2
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/bench/internal/stats"
)

type config struct {
	n      int
	mb     int
	run    time.Duration
	idle   time.Duration
	rounds int
}

func main() {
	var cfg config
	flag.IntVar(&cfg.n, "n", 50, "idle sandboxes")
	flag.IntVar(&cfg.mb, "mb", 20, "MB each touches once")
	flag.DurationVar(&cfg.run, "run", 2*time.Minute, "how long memory is integrated, from the last create")
	flag.DurationVar(&cfg.idle, "idle", 15*time.Second, "the reclaiming node's --reclaim-idle")
	flag.IntVar(&cfg.rounds, "rounds", 2, "rounds (each runs both modes)")
	flag.Parse()
	if err := run(context.Background(), cfg); err != nil {
		log.Fatalf("bench/reclaim: %v", err)
	}
}

// result is one mode's run.
type result struct {
	integral float64 // GB x s
	peak     int64
	end      int64 // bytes charged at the end
	reclaim  *api.NodeReclaim
}

func run(ctx context.Context, cfg config) error {
	dir, err := benchup.TempDir("bench-reclaim-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := benchup.Build(ctx, dir)
	if err != nil {
		return err
	}
	fmt.Printf("bench/reclaim: %d idle sandboxes touching %d MB each, memory integrated over %v, reclaim after %v idle, %d rounds, %s\n",
		cfg.n, cfg.mb, cfg.run, cfg.idle, cfg.rounds, time.Now().UTC().Format(time.RFC3339))
	modes := map[bool]string{true: "reclaim", false: "no reclaim"}
	res := map[string][]*result{}
	for r := 0; r < cfg.rounds; r++ {
		for _, on := range []bool{r%2 == 0, r%2 != 0} {
			out, err := measure(ctx, cfg, bin, filepath.Join(dir, fmt.Sprintf("r%d-%v", r, on)), on)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, modes[on], err)
			}
			res[modes[on]] = append(res[modes[on]], out)
			fmt.Printf("  round %d %-10s integral %.1f GB*s, peak %d MB, at the end %d MB", r+1, modes[on], out.integral, out.peak>>20, out.end>>20)
			if out.reclaim != nil && on {
				fmt.Printf(" (%s: %d reclaims, %d MB freed)", out.reclaim.Mechanism, out.reclaim.Sandboxes, int64(out.reclaim.Bytes)>>20)
			}
			fmt.Println()
		}
	}
	var xs []float64
	for i := range res["reclaim"] {
		xs = append(xs, 100*(1-res["reclaim"][i].integral/res["no reclaim"][i].integral))
	}
	med, lo, hi := stats.Spread(xs)
	fmt.Printf("\ntime-integrated memory, %% less with reclaim (median over rounds [min..max]; target >= 30%%, DSec 21.2%%)\n  %.1f%% [%.1f..%.1f]\n",
		med, lo, hi)
	return nil
}

// measure runs one mode on a fresh node.
func measure(ctx context.Context, cfg config, bin, dataDir string, reclaim bool) (*result, error) {
	idle := cfg.idle
	if !reclaim {
		idle = -time.Second
	}
	d, err := benchup.StartProc(ctx, bin, dataDir, "--reclaim-idle", idle.String())
	if err != nil {
		return nil, err
	}
	defer d.Stop()
	c := d.Client
	defer benchup.DeleteAll(c)
	req := api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{CPU: 0.1, Memory: api.Quantity(cfg.mb+32) << 20}}
	err = benchup.Populate(ctx, c, cfg.n, 8, req, func(_ int, sb *api.Sandbox) error {
		cmd := fmt.Sprintf("dd if=/dev/urandom of=/data.bin bs=1M count=%d 2>/dev/null && (sleep 100000 > /dev/null 2>&1 &)", cfg.mb)
		if r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: cmd}); err != nil || r.ExitCode != 0 {
			return fmt.Errorf("touch in %s: %v %+v", sb.ID, err, r)
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
	out := &result{integral: m.Integral, peak: m.Peak, end: m.End}
	if nodes, err := c.ListNodes(ctx); err == nil && len(nodes) == 1 && nodes[0].InUse != nil {
		out.reclaim = nodes[0].InUse.Reclaim
	}
	return out, nil
}
