package container

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/qos"
)

// TestBestEffort: every thread of a best-effort sandbox runs under
// SCHED_IDLE, in an idle cgroup: its init, what an exec starts, a daemon
// an exec leaves behind and what that forks later; after a new agent
// process takes over, new execs too. A latency sandbox's run as normal
// work, in a cgroup of normal weight.
func TestBestEffort(t *testing.T) {
	h := newHarness(t)
	be := h.spec("qos-be")
	be.BestEffort = true
	h.start(be)
	h.start(h.spec("qos-lat"))
	for _, id := range []string{"qos-be", "qos-lat"} {
		// A daemon that forks on: its children come after the exec
		// that started it is gone.
		h.sh(id, "(while :; do sleep 0.05; done) > /dev/null 2>&1 &")
	}
	check := func(id string, want uint32) {
		t.Helper()
		s, err := h.c.get(id)
		if err != nil {
			t.Fatal(err)
		}
		d, ok := cpuCgroup(s.cgPath)
		if !ok {
			t.Fatalf("%s: no cpu cgroup in %v", id, s.cgPath)
		}
		// The best-effort class's group is idle, with the sandbox's
		// cgroup in it; a latency sandbox's is beside it.
		parent := cgroup.Dir{Path: filepath.Dir(d.Path), V2: d.V2}
		if inClass := filepath.Base(parent.Path) == qos.ClassGroup; inClass != (want == unix.SCHED_IDLE) {
			t.Errorf("%s: cgroup %s, in the best-effort class's group %v", id, d.Path, inClass)
		}
		if idle := qos.GroupIdle(parent); idle != (want == unix.SCHED_IDLE) && h.c.qos.Group == qos.GroupCPUIdle {
			t.Errorf("%s: cgroup %s idle %v", id, parent.Path, idle)
		}
		pids, err := d.TreeProcs()
		if err != nil {
			t.Fatal(err)
		}
		// The init and the daemon at least (its sleeps come and go).
		if len(pids) < 2 {
			t.Errorf("%s: %d processes in %s, want the init and the daemon", id, len(pids), d.Path)
		}
		// Every process before the agent in a host-wide OOM, a
		// best-effort sandbox's first.
		adj := qos.OOMScoreAdj(want == unix.SCHED_IDLE)
		for _, pid := range pids {
			if pol, err := qos.Policy(pid); err == nil && pol != want {
				t.Errorf("%s: process %d has policy %d, want %d", id, pid, pol, want)
			}
			if got, err := qos.ReadOOMScoreAdj(pid); err == nil && got != adj {
				t.Errorf("%s: process %d has oom_score_adj %d, want %d", id, pid, got, adj)
			}
		}
		// An exec's own process, as it runs.
		if got := h.sh(id, "cut -d' ' -f41 /proc/self/stat"); got != map[uint32]string{unix.SCHED_IDLE: "5", unix.SCHED_NORMAL: "0"}[want] {
			t.Errorf("%s: an exec's policy %s, want %d", id, got, want)
		}
		if got := h.sh(id, "cat /proc/self/oom_score_adj"); got != strconv.Itoa(adj) {
			t.Errorf("%s: an exec's oom_score_adj %s, want %d", id, got, adj)
		}
	}
	check("qos-be", unix.SCHED_IDLE)
	check("qos-lat", unix.SCHED_NORMAL)

	// A new agent process: execs in the recovered sandbox stay idle.
	h.restart()
	ctx := context.Background()
	for _, spec := range []string{"qos-be", "qos-lat"} {
		sp := h.spec(spec)
		sp.BestEffort = spec == "qos-be"
		if _, err := h.c.Recover(ctx, sp); err != nil {
			t.Fatal(err)
		}
	}
	check("qos-be", unix.SCHED_IDLE)
	check("qos-lat", unix.SCHED_NORMAL)

	// Destroyed, or swept by a new agent process that knows nothing of
	// it, a best-effort sandbox leaves nothing behind either.
	if err := h.c.Destroy(ctx, "qos-be"); err != nil {
		t.Fatal(err)
	}
	h.assertGone("qos-be")
	h.restart()
	removed, err := h.c.Sweep(ctx, func(string) bool { return true })
	if err != nil || len(removed) == 0 {
		t.Fatalf("sweep: %q, %v", removed, err)
	}
	h.assertGone("qos-lat")
	be2 := h.spec("qos-be2")
	be2.BestEffort = true
	h.start(be2)
	h.restart()
	if _, err := h.c.Sweep(ctx, func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
	h.assertGone("qos-be2")
}
