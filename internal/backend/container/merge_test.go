package container

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// A merging sandbox's processes are opted into KSM, its init and what an
// exec starts alike, and nothing of another sandbox or of the agent is.
// Where the kernel cannot (before Linux 6.7: the cgroup v2 guest's 6.1),
// the backend says why and a merging sandbox runs unmerged.
func TestMemoryMerge(t *testing.T) {
	h := newHarness(t)
	on := "yes"
	if err := h.c.MemoryMerge(); err != nil {
		t.Logf("this host cannot merge (merging sandboxes run unmerged): %v", err)
		on = "no"
	}
	m := h.spec("merge-on")
	m.MemoryMerge = true
	h.start(m)
	h.start(h.spec("merge-off"))

	mergeAny := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "ksm_merge_any: "); ok {
				return v
			}
		}
		return "no" // a kernel without the line has no prctl opt-in either
	}
	for id, want := range map[string]string{"merge-on": on, "merge-off": "no"} {
		s, err := h.c.get(id)
		if err != nil {
			t.Fatal(err)
		}
		if got := mergeAny("/proc/" + strconv.Itoa(s.init.pid) + "/ksm_stat"); got != want {
			t.Errorf("%s: init ksm_merge_any %s, want %s", id, got, want)
		}
		if got := h.sh(id, "grep ksm_merge_any /proc/self/ksm_stat || echo 'ksm_merge_any: no'"); got != "ksm_merge_any: "+want {
			t.Errorf("%s: an exec'd process says %q, want ksm_merge_any: %s", id, got, want)
		}
	}
	if got := mergeAny("/proc/self/ksm_stat"); got != "no" {
		t.Errorf("the agent's own memory is opted in: %s", got)
	}
}
