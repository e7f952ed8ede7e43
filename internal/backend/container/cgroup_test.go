package container

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestExecCgroupModes drives execCgroup on both cgroup versions with host
// processes: the v1 freezer hierarchy and, where mounted (a v2 host, or
// the unified hierarchy of a hybrid one), cgroup v2.
func TestExecCgroupModes(t *testing.T) {
	testutil.RequireRoot(t)
	modes := map[string]cgroup.Dir{}
	l, err := cgroup.Host()
	if err != nil {
		t.Fatal(err)
	}
	if l.Unified != "" {
		modes["v2"] = cgroup.Dir{Path: l.Unified, V2: true}
	}
	if p, ok := l.V1["freezer"]; ok {
		modes["v1"] = cgroup.Dir{Path: p}
	}
	if len(modes) == 0 {
		testutil.Unavailable(t, "no cgroup hierarchy to test")
	}
	for name, root := range modes {
		t.Run(name, func(t *testing.T) {
			base := root.Child("warren-test-" + randomHex(4))
			if err := base.Mkdir(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { base.Destroy(context.Background()) })
			cg := execCgroup{base: base}
			ctx := context.Background()

			// start runs a shell that forks two sleeps once it is in sub.
			start := func(sub string) *exec.Cmd {
				if err := cg.create(sub); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cg.kill(ctx, sub); cg.remove(sub) })
				cmd := exec.Command("sh", "-c", "sleep 0.3; sleep 100 & sleep 100 & wait")
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				go cmd.Wait() // reap
				if err := os.WriteFile(filepath.Join(cg.path(sub), "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(5 * time.Second)
				for {
					pids, _ := cg.procs(sub)
					if len(pids) == 3 {
						return cmd
					}
					if time.Now().After(deadline) {
						t.Fatalf("procs in %s: %v, want 3", sub, pids)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}

			sub := execPrefix + "kill"
			start(sub)
			if err := cg.kill(ctx, sub); err != nil {
				t.Fatal(err)
			}
			if pids, _ := cg.procs(sub); len(pids) != 0 {
				t.Errorf("after kill: %v", pids)
			}
			if err := cg.remove(sub); err != nil {
				t.Fatal(err)
			}

			sub = execPrefix + "evac"
			start(sub)
			if err := cg.evacuate(ctx, sub); err != nil {
				t.Fatal(err)
			}
			moved, _ := cg.procs(".")
			if len(moved) != 3 {
				t.Errorf("moved to the parent: %v, want 3", moved)
			}
			if err := cg.remove(sub); err != nil {
				t.Fatal(err)
			}
			// Leave nothing: move them back to be killed.
			if err := os.Mkdir(cg.path(sub), 0o755); err != nil {
				t.Fatal(err)
			}
			for _, pid := range moved {
				os.WriteFile(filepath.Join(cg.path(sub), "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
			}
			if err := cg.cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			if subs, _ := cg.subs(); len(subs) != 0 {
				t.Errorf("subs left: %v", subs)
			}
			if pids, _ := cg.procs("."); len(pids) != 0 {
				t.Errorf("left in base: %v", pids)
			}
		})
	}
}

// TestDestroyFrozen: a sandbox whose exec cgroup and own cgroup were left
// frozen (by an agent that died mid-kill, or by hand) with a process
// blocked on a FIFO is still destroyed at once, leaving nothing behind.
func TestDestroyFrozen(t *testing.T) {
	h := newHarness(t)
	h.start(h.spec("frozen-1"))
	s := h.c.sandboxes["frozen-1"]
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.c.Exec(context.Background(), "frozen-1", backend.ExecRequest{
			Argv: []string{"sh", "-c", "mkfifo /tmp/f; sleep 1000 & cat /tmp/f"}, Timeout: time.Hour})
	}()
	var sub string
	deadline := time.Now().Add(10 * time.Second)
	for sub == "" {
		if subs, _ := s.cg.subs(); len(subs) == 1 {
			if pids, _ := s.cg.procs(subs[0]); len(pids) >= 2 {
				sub = subs[0]
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the exec never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx := context.Background()
	if err := s.cg.sub(sub).Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.cg.base.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := h.c.Destroy(dctx, "frozen-1"); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Destroy took %v", d)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("the exec did not return after Destroy")
	}
	h.assertGone("frozen-1")
}
