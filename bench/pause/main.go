// Command pause measures pausing a trainer's sandboxes and resuming them
// on their next call, through warren's full path, against a freeze without
// reclaim (what `docker pause` does: `runc pause`), in the same run.
//
//	go build -o /tmp/bench-pause ./bench/pause && sudo /tmp/bench-pause -n 500 -mb 20
//
// It starts `warren up` in this process, creates -n idle busybox sandboxes
// in one project (0.01 CPU each), and has each hold -mb MiB of memory that
// only swap can take (a file in its /dev/shm: tmpfs, swap-backed like
// anonymous memory). Then, per round:
//
//   - peer runc (first, the memory resident): `runc pause` of each (freeze
//     only), the same memory figures, then `runc resume` and the same
//     exec, one at a time.
//   - warren: one `project pause` of them all (its time), host memory
//     used before and after (/proc/meminfo: MemTotal - MemAvailable), the
//     memory charged to each sandbox before and after its pause (the
//     pause's own report); then each resumed by a first exec (`true`),
//     one at a time, its latency taken; an exec on a running sandbox is
//     the baseline. Then every sandbox reads its memory back in.
//
// A host without swap gets a zram device for the run (as `warren agent
// --swap zram:SIZE` would), removed at the end. Targets (issue 15): a
// paused sandbox's memory <= 10% of its running size; resume-on-exec p50
// <= 50 ms, p99 <= 200 ms; pausing 500 in < 10 s.
package main

import (
	"bufio"
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
	"github.com/warrenhq/warren/internal/daemon"
	"github.com/warrenhq/warren/internal/swap"
)

func main() {
	n := flag.Int("n", 500, "sandboxes")
	mb := flag.Int("mb", 20, "MiB each sandbox holds")
	rounds := flag.Int("rounds", 1, "rounds (pause and resume all, per peer)")
	keep := flag.Bool("keep", false, "keep the temporary data dir")
	flag.Parse()
	if err := run(*n, *mb, *rounds, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "bench/pause:", err)
		os.Exit(1)
	}
}

type round struct {
	pause                  time.Duration
	hostBefore, hostAfter  int64   // host memory used (bytes)
	sbBefore, sbAfter      float64 // median memory charged per sandbox (bytes)
	resume                 []time.Duration
	baseline               []time.Duration
	pausedN, failedPausing int
}

func run(n, mb, rounds int, keep bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if devs, _ := swap.Devices(); len(devs) == 0 {
		size := max(int64(n)*int64(mb)<<20*5/4, 1<<30)
		dev, err := swap.Zram(size)
		if err != nil {
			return fmt.Errorf("this host has no swap, and a zram device for the run failed: %w", err)
		}
		defer swap.Off(dev)
		fmt.Printf("swap: %s of %.1f GiB (zram) for the run\n", dev, float64(size)/(1<<30))
	} else {
		fmt.Printf("swap: %s\n", swap.Describe())
	}
	dir, err := benchup.TempDir("bench-pause-")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(dir)
	}
	cfg := daemon.UpConfig{DataDir: dir, Listen: "127.0.0.1:0", ImageCache: filepath.Join(dir, "no-images"),
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	cfg.Fn.Disabled = true
	cfg.Limits.Sandboxes = max(1000, n+10)
	c, err := benchup.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if _, err := c.CreateProject(ctx, api.CreateProjectRequest{Path: "bench"}); err != nil {
		return err
	}
	fmt.Printf("bench/pause: %d sandboxes holding %d MiB each, %d round(s)\n", n, mb, rounds)
	start := time.Now()
	ids, err := createAll(ctx, c, n, mb)
	if err != nil {
		return err
	}
	fmt.Printf("created and filled %d sandboxes in %s\n", len(ids), time.Since(start).Round(time.Millisecond))
	runcRoot := filepath.Join(dir, "node", "runc")
	var warren, peer []round
	for r := 0; r < rounds; r++ {
		// The peer first, while the sandboxes' memory is resident; then
		// everything touched back in before warren's pause (pages a
		// resume leaves in swap until used).
		p, err := runcRound(ctx, c, runcRoot, ids)
		if err != nil {
			return err
		}
		peer = append(peer, p)
		if r > 0 {
			if err := touchAll(ctx, c, ids); err != nil {
				return err
			}
		}
		w, err := warrenRound(ctx, c, ids)
		if err != nil {
			return err
		}
		warren = append(warren, w)
		if err := touchAll(ctx, c, ids); err != nil {
			return err
		}
		fmt.Printf("round %d done\n", r+1)
	}
	report("warren (freeze + reclaim)", warren, mb)
	report("peer runc pause (freeze only)", peer, mb)
	for _, id := range ids {
		c.DeleteSandbox(ctx, id)
	}
	return nil
}

// createAll makes n sandboxes, 8 at a time, each holding mb MiB in tmpfs.
func createAll(ctx context.Context, c *client.Client, n, mb int) ([]string, error) {
	ids := make([]string, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox", Project: "bench", TTL: api.Duration(4 * time.Hour),
				Resources: api.Resources{CPU: 0.01, Memory: api.Quantity(int64(mb+12) << 20)}})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = sb.ID
			r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: fmt.Sprintf("dd if=/dev/zero of=/dev/shm/hog bs=1M count=%d 2>/dev/null", mb)})
			if err != nil || r.ExitCode != 0 {
				errs <- fmt.Errorf("fill %s: %v %+v", sb.ID, err, r)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}
	return ids, nil
}

func warrenRound(ctx context.Context, c *client.Client, ids []string) (round, error) {
	var r round
	r.baseline = execAll(ctx, c, ids[:min(len(ids), 100)])
	settle()
	r.hostBefore = hostUsed()
	start := time.Now()
	res, err := c.PauseSandboxes(ctx, api.PauseSelector{Project: "bench"})
	if err != nil {
		return r, err
	}
	r.pause = time.Since(start)
	for _, nc := range res.Nodes {
		r.pausedN += nc.Done
		r.failedPausing += nc.Failed
	}
	settle()
	r.hostAfter = hostUsed()
	var before, after []float64
	for _, id := range ids {
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			return r, err
		}
		if sb.Pause != nil {
			before, after = append(before, float64(sb.Pause.MemoryBefore)), append(after, float64(sb.Pause.MemoryAfter))
		}
	}
	r.sbBefore, r.sbAfter = median(before), median(after)
	r.resume = execAll(ctx, c, ids)
	return r, nil
}

func runcRound(ctx context.Context, c *client.Client, root string, ids []string) (round, error) {
	var r round
	r.baseline = execAll(ctx, c, ids[:min(len(ids), 100)])
	settle()
	r.hostBefore = hostUsed()
	start := time.Now()
	for _, id := range ids {
		if out, err := exec.CommandContext(ctx, "runc", "--root", root, "pause", id).CombinedOutput(); err != nil {
			r.failedPausing++
			if r.failedPausing == 1 {
				fmt.Fprintf(os.Stderr, "runc pause %s: %v: %s\n", id, err, out)
			}
			continue
		}
		r.pausedN++
	}
	r.pause = time.Since(start)
	settle()
	r.hostAfter = hostUsed()
	for _, id := range ids {
		t := time.Now()
		exec.CommandContext(ctx, "runc", "--root", root, "resume", id).Run()
		if _, err := c.Exec(ctx, id, api.ExecRequest{Argv: []string{"true"}}); err != nil {
			return r, fmt.Errorf("exec after runc resume: %w", err)
		}
		r.resume = append(r.resume, time.Since(t))
	}
	return r, nil
}

// touchAll reads each sandbox's memory back in.
func touchAll(ctx context.Context, c *client.Client, ids []string) error {
	for _, id := range ids {
		if r, err := c.Exec(ctx, id, api.ExecRequest{Cmd: "cat /dev/shm/hog > /dev/null"}); err != nil || r.ExitCode != 0 {
			return fmt.Errorf("touch %s: %v %+v", id, err, r)
		}
	}
	return nil
}

// execAll runs `true` in each sandbox, one at a time, and times each.
func execAll(ctx context.Context, c *client.Client, ids []string) []time.Duration {
	var ds []time.Duration
	for _, id := range ids {
		t := time.Now()
		if _, err := c.Exec(ctx, id, api.ExecRequest{Argv: []string{"true"}}); err != nil {
			fmt.Fprintf(os.Stderr, "exec in %s: %v\n", id, err)
			continue
		}
		ds = append(ds, time.Since(t))
	}
	return ds
}

func report(name string, rs []round, mb int) {
	fmt.Printf("\n== %s\n", name)
	for i, r := range rs {
		freed := r.hostBefore - r.hostAfter
		fmt.Printf("round %d: paused %d (%d failed) in %s; host memory used %.2f -> %.2f GiB (freed %.2f GiB)\n",
			i+1, r.pausedN, r.failedPausing, r.pause.Round(time.Millisecond), gib(r.hostBefore), gib(r.hostAfter), gib(freed))
		if r.sbBefore > 0 {
			fmt.Printf("         per sandbox (median): %.1f -> %.1f MiB charged (%.1f%% left)\n", r.sbBefore/(1<<20), r.sbAfter/(1<<20), 100*r.sbAfter/r.sbBefore)
		}
		fmt.Printf("         resume on exec: p50 %s  p99 %s  max %s | exec on a running sandbox: p50 %s  p99 %s\n",
			pct(r.resume, 50), pct(r.resume, 99), pct(r.resume, 100), pct(r.baseline, 50), pct(r.baseline, 99))
	}
}

// settle lets reclaim and accounting catch up before host memory is read.
func settle() { time.Sleep(2 * time.Second) }

// hostUsed is MemTotal - MemAvailable (bytes).
func hostUsed() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	var total, avail int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fs[1], 10, 64)
		switch fs[0] {
		case "MemTotal:":
			total = v << 10
		case "MemAvailable:":
			avail = v << 10
		}
	}
	return total - avail
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func pct(ds []time.Duration, p int) string {
	if len(ds) == 0 {
		return "-"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := min(len(s)-1, len(s)*p/100)
	return s[i].Round(10 * time.Microsecond).String()
}
