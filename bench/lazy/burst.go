package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/bench/internal/hostcpu"
	"github.com/warrenhq/warren/bench/internal/stats"
	"github.com/warrenhq/warren/client"
)

// result is one mode's burst.
type result struct {
	burst     time.Duration   // first create to last task done
	first     []time.Duration // per sandbox: burst start to first exec returned
	task      []time.Duration // per sandbox: the task's exec
	read      int64           // bytes the tasks read, summed
	distinct  int64           // bytes of distinct files the tasks read
	received  int64           // bytes over the store link
	written   int64           // the agent process's write_bytes
	cacheDisk int64           // what the node's layer caches hold after
	cpuBusy   float64         // the host's CPU busy during the burst, 0..1
	layer     *api.LayerCacheStats
}

func (r *result) String() string {
	s := fmt.Sprintf("burst %s (host CPU %.0f%% busy, link %.0f MB/s), first exec p50 %s p99 %s, task p50 %s, received %s, written %s, cache on disk %s",
		dur(r.burst), 100*r.cpuBusy, float64(r.received)/1e6/r.burst.Seconds(), dur(stats.Pct(r.first, 50)), dur(stats.Pct(r.first, 99)), dur(stats.Pct(r.task, 50)), mb(r.received), mb(r.written), mb(r.cacheDisk))
	if r.layer != nil {
		s += fmt.Sprintf(" (chunk cache: %d fetches, mean %s, %d hits, %d misses)", r.layer.Fetches,
			dur(time.Duration(r.layer.FetchMs)*time.Millisecond/time.Duration(max(r.layer.Fetches, 1))), r.layer.Hits, r.layer.Misses)
	}
	return s
}

const task = `import sys
n = 0
for p in sys.argv[1:]:
    with open(p, 'rb') as f:
        n += len(f.read())
print(n)`

func burst(ctx context.Context, cfg config, d *benchup.Daemon, dataDir string, store *netStore, envs []*env, mode string) (*result, error) {
	c := d.Client
	rx0, err := store.received()
	if err != nil {
		return nil, err
	}
	w0, err := agentWrites(d, dataDir)
	if err != nil {
		return nil, err
	}
	out := &result{first: make([]time.Duration, cfg.n), task: make([]time.Duration, cfg.n)}
	busy0, total0, err := hostcpu.Times()
	if err != nil {
		return nil, err
	}
	errs := make(chan error, cfg.n)
	sem := make(chan struct{}, cfg.conc)
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]bool{}
	start := time.Now()
	for i := range cfg.n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := envs[i%len(envs)]
			files, want := e.taskFiles(cfg.read, cfg.shared, uint64(i))
			mu.Lock()
			for _, f := range files {
				if !seen[e.ref+f] {
					seen[e.ref+f] = true
					out.distinct += e.size(f)
				}
			}
			mu.Unlock()
			sem <- struct{}{} // creates in flight; the execs run as they come
			sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: e.ref,
				Resources: api.Resources{CPU: 0.1, Memory: 256 << 20}, TTL: api.Duration(time.Hour)})
			<-sem
			if err != nil {
				errs <- fmt.Errorf("create from %s: %w", e.ref, err)
				return
			}
			if r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
				errs <- fmt.Errorf("first exec in %s: %v %+v", sb.ID, err, r)
				return
			}
			out.first[i] = time.Since(start)
			t := time.Now()
			r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Argv: append([]string{"python3", "-c", task}, files...), Timeout: api.Duration(10 * time.Minute)})
			if err != nil || r.ExitCode != 0 {
				errs <- fmt.Errorf("task in %s: %v %+v", sb.ID, err, r)
				return
			}
			out.task[i] = time.Since(t)
			if got, _ := strconv.ParseInt(strings.TrimSpace(r.Stdout), 10, 64); got != want {
				errs <- fmt.Errorf("task in %s read %d bytes, want %d", sb.ID, got, want)
				return
			}
			mu.Lock()
			out.read += want
			mu.Unlock()
		}()
	}
	wg.Wait()
	out.burst = time.Since(start)
	if busy1, total1, err := hostcpu.Times(); err == nil && total1 > total0 {
		out.cpuBusy = float64(busy1-busy0) / float64(total1-total0)
	}
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	rx1, err := store.received()
	if err != nil {
		return nil, err
	}
	out.received = rx1 - rx0
	w1, err := agentWrites(d, dataDir)
	if err != nil {
		return nil, err
	}
	out.written = w1 - w0
	nodes, err := c.ListNodes(ctx)
	if err == nil && len(nodes) == 1 {
		out.layer = nodes[0].LayerCache
	}
	return out, nil
}

// agentWrites is what the node agent has written to disk: warren up's
// process and, on a lazy node, its layer server's (warren lazyd, a
// process of its own that writes the chunk cache).
func agentWrites(d *benchup.Daemon, dataDir string) (int64, error) {
	n, err := writeBytes(d.Cmd.Process.Pid)
	if err != nil {
		return 0, err
	}
	if b, err := os.ReadFile(filepath.Join(dataDir, "node", "lazy", "server.pid")); err == nil {
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return 0, fmt.Errorf("lazyd pid file: %v", err)
		}
		m, err := writeBytes(pid)
		if err != nil {
			return 0, fmt.Errorf("lazyd: %w", err)
		}
		n += m
	}
	return n, nil
}

// writeBytes is the bytes process pid has caused to be written to disk
// (its /proc/<pid>/io write_bytes).
func writeBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "write_bytes: "); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/io: no write_bytes", pid)
}

// deleteAll deletes every sandbox of d.
func deleteAll(d *benchup.Daemon) {
	ctx := context.Background()
	sbs, err := d.Client.ListSandboxes(ctx, client.ListOptions{})
	if err != nil {
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, sb := range sbs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			d.Client.DeleteSandbox(ctx, sb.ID)
		}()
	}
	wg.Wait()
}

// report prints lazy against eager per round and the medians.
func report(res map[string][]*result) {
	type fig struct {
		name string
		val  func(e, l *result) float64
	}
	figs := []fig{
		{"burst time, eager/lazy (x faster)", func(e, l *result) float64 { return e.burst.Seconds() / l.burst.Seconds() }},
		{"first exec p50, eager/lazy", func(e, l *result) float64 { return stats.Pct(e.first, 50).Seconds() / stats.Pct(l.first, 50).Seconds() }},
		{"first exec p99, eager/lazy", func(e, l *result) float64 { return stats.Pct(e.first, 99).Seconds() / stats.Pct(l.first, 99).Seconds() }},
		{"bytes received, lazy/eager", func(e, l *result) float64 { return float64(l.received) / float64(e.received) }},
		{"bytes written, % fewer lazy", func(e, l *result) float64 { return 100 * (1 - float64(l.written)/float64(e.written)) }},
	}
	fmt.Println("\nlazy against eager (median over rounds [min..max])")
	for _, f := range figs {
		var xs []float64
		for r := range res["lazy"] {
			xs = append(xs, f.val(res["eager"][r], res["lazy"][r]))
		}
		med, lo, hi := stats.Spread(xs)
		fmt.Printf("  %-36s %7.2f [%.2f..%.2f]\n", f.name, med, lo, hi)
	}
	l := res["lazy"][0]
	fmt.Printf("  tasks read %s in all, %s of distinct files (round 1)\n", mb(l.read), mb(l.distinct))
}
