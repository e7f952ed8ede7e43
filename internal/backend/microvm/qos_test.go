package microvm

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/qos"
)

// A best-effort microVM's QEMU runs every thread under SCHED_IDLE, in
// the best-effort class's cgroup, and a latency one's none; a merging
// microVM's guest RAM is opted into KSM (mem-merge=on) and no other's
// (QEMU's own default is on); both QEMUs come before the agent in a
// host-wide OOM, the best-effort one first. Both guests run.
func TestBestEffortAndMerge(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	be := h.started(t, "qos-be", func(s *backend.Spec) { s.BestEffort, s.MemoryMerge = true, true })
	lat := h.started(t, "qos-lat")
	for _, c := range []struct {
		id          string
		idle, merge bool
	}{{be, true, true}, {lat, false, false}} {
		if out, _, code := h.sh(t, c.id, "echo up"); code != 0 || out != "up\n" {
			t.Fatalf("%s: exec %q %d", c.id, out, code)
		}
		st, err := h.m.Inspect(ctx, c.id)
		if err != nil || st.Pid <= 0 {
			t.Fatalf("%s: Inspect %+v, %v", c.id, st, err)
		}
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", st.Pid))
		if err != nil || len(tasks) < 2 {
			t.Fatalf("%s: QEMU's threads: %d, %v", c.id, len(tasks), err)
		}
		for _, task := range tasks {
			tid, _ := strconv.Atoi(task.Name())
			if pol, err := qos.Policy(tid); err == nil && (pol == unix.SCHED_IDLE) != c.idle {
				t.Errorf("%s: QEMU thread %d has policy %d, want SCHED_IDLE %v", c.id, tid, pol, c.idle)
			}
		}
		if adj, err := qos.ReadOOMScoreAdj(st.Pid); err != nil || adj != qos.OOMScoreAdj(c.idle) {
			t.Errorf("%s: QEMU's oom_score_adj %d, %v; want %d", c.id, adj, err, qos.OOMScoreAdj(c.idle))
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", st.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if inClass := strings.Contains(string(cg), "/"+qos.ClassGroup+"/"); inClass != c.idle {
			t.Errorf("%s: QEMU's cgroups %q, in the best-effort class %v", c.id, cg, inClass)
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.Pid))
		want := map[bool]string{true: "mem-merge=on", false: "mem-merge=off"}[c.merge]
		if !strings.Contains(string(cmdline), want) {
			t.Errorf("%s: QEMU's command line has no %s: %q", c.id, want, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
		ksm, err := os.ReadFile(fmt.Sprintf("/proc/%d/ksm_stat", st.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(ksm), "ksm_mergeable: yes"); got != c.merge {
			t.Errorf("%s: QEMU's memory mergeable %v, want %v:\n%s", c.id, got, c.merge, ksm)
		}
	}
}
