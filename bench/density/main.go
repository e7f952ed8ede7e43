// Command density packs idle sandboxes onto one node until -n or until
// the node refuses (issue 18), and reports, as the count grows: host
// memory per sandbox (and the kernel's own part of it: slab, stacks, page
// tables, per-CPU), the agent's own memory per sandbox, create latency,
// exec round trip against exec at the start, and the cost of a list and
// of a node status; then delete latency. Target: 10,000 live sandboxes on
// 2 cores and 24 GiB, exec p50 at 10,000 within 2x of exec at 10 (DSec:
// >= 3,200 containers on a ~190-core node).
//
// The sandboxes are busybox, asking for 0.01 cores (the least a create
// may) and 16 MiB (runc's init is charged to the sandbox while it starts
// it: at 8 MiB, runc sometimes fails to set the limit under what its init
// already uses), idle: their init and nothing else, as an agent's sandbox
// between tool calls. The node admits memory requests up to 8x its memory
// (--memory-overcommit 8): 10,000 x 16 MiB.
//
//	sudo go run ./bench/density -n 10000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/bench/internal/hostcpu"
	"github.com/warrenhq/warren/bench/internal/hostmem"
	"github.com/warrenhq/warren/bench/internal/stats"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/daemon"
)

type config struct {
	n     int
	step  int
	conc  int
	execs int
	keep  bool
	hold  time.Duration
}

func main() {
	var cfg config
	flag.IntVar(&cfg.n, "n", 10000, "sandboxes to reach (the node may refuse first)")
	flag.IntVar(&cfg.step, "step", 1000, "report every this many sandboxes")
	flag.IntVar(&cfg.conc, "conc", 16, "creates in flight")
	flag.IntVar(&cfg.execs, "execs", 50, "exec round trips per report")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the data directory (and its log)")
	flag.DurationVar(&cfg.hold, "hold", 0, "keep the sandboxes this long after the last report before deleting them (to look at the node: the line before says how to reach it)")
	flag.Parse()
	if err := run(context.Background(), cfg); err != nil {
		log.Fatalf("bench/density: %v", err)
	}
}

// memUsed is the host's memory in use (MemTotal - MemAvailable), and the
// kernel's own part of it (hostmem.Meminfo.Kernel), bytes.
func memUsed() (used, kernel int64, err error) {
	m, err := hostmem.Read()
	return m.Used(), m.Kernel, err
}

// rss is process pid's resident memory, bytes.
func rss(pid int) (int64, error) {
	r, err := hostmem.ReadRollup(pid)
	return r.RSS, err
}

func run(ctx context.Context, cfg config) error {
	dir, err := benchup.TempDir("bench-density-")
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
	m0, k0, err := memUsed()
	if err != nil {
		return err
	}
	d, err := benchup.StartProc(ctx, bin, filepath.Join(dir, "data"), "--memory-overcommit", "8")
	if err != nil {
		return err
	}
	defer d.Stop()
	c := d.Client
	agent0, _ := rss(d.Cmd.Process.Pid)
	fmt.Printf("bench/density: busybox sandboxes (0.01 cores, 16Mi, idle) up to %d, %d creates in flight, %s\n", cfg.n, cfg.conc, time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("%8s %10s %10s %10s %12s %12s %10s %10s %10s %10s %8s %9s\n", "count", "host/sb", "kernel/sb", "agent/sb", "create p50", "create p99", "exec p50", "exec p99", "list", "status", "settle", "refusals")

	var ids []string
	var mu sync.Mutex
	var refused atomic.Value
	report := func(creates []time.Duration) error {
		m, k, err := memUsed()
		if err != nil {
			return err
		}
		a, _ := rss(d.Cmd.Process.Pid)
		n := len(ids)
		// What the kernel does after a burst of creates (freeing
		// cgroups, RCU) is over before exec is measured: the figure is
		// exec on a node of n idle sandboxes.
		settle, _, err := hostcpu.WaitQuiet(0.15, time.Minute)
		if err != nil {
			return err
		}
		ex, err := execs(ctx, c, ids, cfg.execs)
		if err != nil {
			return err
		}
		t := time.Now()
		if _, err := c.ListSandboxes(ctx, client.ListOptions{}); err != nil {
			return err
		}
		list := time.Since(t)
		t = time.Now()
		if _, err := c.ListNodes(ctx); err != nil {
			return err
		}
		status := time.Since(t)
		perSB := func(b int64) float64 { return float64(b) / float64(n) / (1 << 20) }
		fmt.Printf("%8d %9.2fM %9.2fM %9.2fM %12v %12v %10v %10v %10v %10v %8v %9d\n", n, perSB(m-m0), perSB(k-k0), perSB(a-agent0),
			stats.Pct(creates, 50).Round(100*time.Microsecond), stats.Pct(creates, 99).Round(100*time.Microsecond),
			stats.Pct(ex, 50).Round(10*time.Microsecond), stats.Pct(ex, 99).Round(10*time.Microsecond),
			list.Round(100*time.Microsecond), status.Round(100*time.Microsecond), settle.Round(time.Second), refusals.Load())
		return nil
	}

	// The first 10, for exec at the start; then steps.
	targets := []int{10}
	for t := cfg.step; t <= cfg.n; t += cfg.step {
		targets = append(targets, t)
	}
	if targets[len(targets)-1] != cfg.n {
		targets = append(targets, cfg.n)
	}
	for _, target := range targets {
		var creates []time.Duration
		sem := make(chan struct{}, cfg.conc)
		var wg sync.WaitGroup
		for i := len(ids); i < target && refused.Load() == nil; i++ {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				t := time.Now()
				sb, err := create(ctx, c)
				took := time.Since(t)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if refused.Load() == nil {
						refused.Store(fmt.Sprintf("at %d: %v", len(ids), err))
					}
					return
				}
				ids = append(ids, sb.ID)
				creates = append(creates, took)
			}()
		}
		wg.Wait()
		if err := report(creates); err != nil {
			return err
		}
		if r := refused.Load(); r != nil {
			fmt.Printf("the node refused a create %s\n", r)
			break
		}
	}

	if cfg.hold > 0 {
		fmt.Printf("holding %d sandboxes for %v (or until SIGINT): WARREN_ADDR=%s WARREN_TOKEN=$(cat %s), agent pid %d\n",
			len(ids), cfg.hold, d.Addr, filepath.Join(d.DataDir, daemon.AdminTokenFile), d.Cmd.Process.Pid)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, unix.SIGTERM)
		select {
		case <-time.After(cfg.hold):
		case <-sig:
		}
		signal.Stop(sig)
	}

	// Delete them all.
	var dels []time.Duration
	sem := make(chan struct{}, cfg.conc)
	var wg sync.WaitGroup
	start := time.Now()
	for _, id := range ids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t := time.Now()
			if err := c.DeleteSandbox(ctx, id); err == nil {
				mu.Lock()
				dels = append(dels, time.Since(t))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	fmt.Printf("deleted %d of %d in %v: p50 %v, p99 %v\n", len(dels), len(ids), time.Since(start).Round(time.Millisecond),
		stats.Pct(dels, 50).Round(100*time.Microsecond), stats.Pct(dels, 99).Round(100*time.Microsecond))
	return nil
}

// create makes one sandbox, retrying a refusal (429 node_full) after its
// Retry-After for up to refuseFor, as a trainer's client would: the node
// refuses while its CPU is busy with the creates themselves, and only a
// refusal that lasts says it is full.
func create(ctx context.Context, c *client.Client) (*api.Sandbox, error) {
	const refuseFor = 30 * time.Second
	deadline := time.Now().Add(refuseFor)
	for {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox",
			Resources: api.Resources{CPU: 0.01, Memory: 16 << 20}, TTL: api.Duration(24 * time.Hour)})
		var e *client.Error
		if err == nil || !errors.As(err, &e) || e.Code != api.CodeNodeFull || time.Now().After(deadline) {
			return sb, err
		}
		refusals.Add(1)
		time.Sleep(max(e.RetryAfter, 100*time.Millisecond))
	}
}

// refusals counts the creates refused and retried.
var refusals atomic.Int64

// execs returns n exec round trips of `true` in sandboxes picked at
// random among ids, one at a time.
func execs(ctx context.Context, c *client.Client, ids []string, n int) ([]time.Duration, error) {
	var ds []time.Duration
	for i := 0; i < n; i++ {
		id := ids[rand.IntN(len(ids))]
		t := time.Now()
		r, err := c.Exec(ctx, id, api.ExecRequest{Argv: []string{"true"}})
		if err != nil || r.ExitCode != 0 {
			return nil, fmt.Errorf("exec in %s: %v %+v", id, err, r)
		}
		ds = append(ds, time.Since(t))
	}
	return ds, nil
}
