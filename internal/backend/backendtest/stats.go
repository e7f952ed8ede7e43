package backendtest

import (
	"errors"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// testStats checks a backend.Statser: processes are counted, and where
// the backend enforces limits (it has cgroups), CPU time and memory move
// with what the sandbox does.
func (s *suite) testStats(t *testing.T) {
	st, ok := s.b.(backend.Statser)
	if !ok {
		t.Skip("backend has no Stats")
	}
	needs(t, s.caps.Exec, "Exec")
	if _, err := st.Stats(ctx(t), "bt-missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stats of an unknown id: %v, want ErrNotFound", err)
	}
	id := s.running(t)
	before, err := st.Stats(ctx(t), id)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	// Three sleepers in the background, some CPU and 32 MiB held in a
	// tmpfs file (memory the cgroup is charged for) or a host file (fake).
	s.shOK(t, id, "for i in 1 2 3; do sleep 60 </dev/null >/dev/null 2>&1 & done; "+
		"i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; "+
		"(mkdir -p dev/shm; head -c 33554432 /dev/zero > dev/shm/stats-ballast) 2>/dev/null; true",
		func(r *backend.ExecRequest) { r.Timeout = time.Minute })
	after, err := st.Stats(ctx(t), id)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	t.Logf("stats before %+v, after %+v", before, after)
	if after.PIDs < before.PIDs+3 {
		t.Errorf("PIDs %d after starting 3 sleepers (before: %d)", after.PIDs, before.PIDs)
	}
	if !s.caps.Limits {
		return
	}
	if after.CPU <= before.CPU {
		t.Errorf("CPU time %v after a busy loop, before %v: want more", after.CPU, before.CPU)
	}
	if after.Memory < before.Memory+16<<20 {
		t.Errorf("memory %d after holding 32 MiB in /dev/shm, before %d: want 16 MiB more at least", after.Memory, before.Memory)
	}
}
