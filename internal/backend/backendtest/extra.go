package backendtest

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

func (s *suite) testHostname(t *testing.T) {
	needs(t, s.caps.Hostname, "Hostname")
	needs(t, s.caps.Exec, "Exec")
	id := s.running(t)
	if got := trim(s.shOK(t, id, "hostname")); got != id {
		t.Errorf("hostname = %q, want the sandbox id %q", got, id)
	}
}

// testLimits checks the limits are enforced, quickly: a memory balloon is
// killed and a fork bomb is contained.
func (s *suite) testLimits(t *testing.T) {
	needs(t, s.caps.Limits, "Limits")
	needs(t, s.caps.Exec, "Exec")

	t.Run("Memory", func(t *testing.T) {
		id := s.running(t, func(sp *backend.Spec) { sp.Resources.Memory = 64 << 20 })
		// sort holds its whole input, one 256 MiB line, in memory.
		out := s.sh(t, id, "head -c 268435456 /dev/zero | sort >/dev/null; echo exit=$?", func(r *backend.ExecRequest) {
			// Under TCG the OOM kill takes minutes (reclaim thrashes the
			// sandbox's page cache first): 4 were once not enough.
			r.Timeout = testutil.Scale(2 * time.Minute)
		})
		t.Logf("balloon: %s", trim(out.stdout))
		if out.TimedOut || trim(out.stdout) == "exit=0" {
			t.Errorf("a 256 MiB balloon under a 64 MiB limit: got %q, TimedOut %v; want it killed", out.stdout, out.TimedOut)
		}
		if got := s.shOK(t, id, "echo ok"); got != "ok\n" {
			t.Errorf("exec after the balloon: got %q, want %q", got, "ok\n")
		}
	})

	t.Run("PIDs", func(t *testing.T) {
		const limit, tries = 32, 100
		id := s.running(t, func(sp *backend.Spec) { sp.Resources.PIDs = limit })
		// Each started child prints its pid (a failed fork leaves $! as
		// it was, or ends the shell).
		script := fmt.Sprintf("i=0; while [ $i -lt %d ]; do sleep 30 </dev/null >/dev/null 2>&1 & echo $!; i=$((i+1)); done", tries)
		out := s.sh(t, id, script, func(r *backend.ExecRequest) { r.Timeout = 30 * time.Second })
		started := len(slices.Compact(slices.Sorted(slices.Values(strings.Fields(out.stdout)))))
		t.Logf("fork bomb started %d of %d processes", started, tries)
		if started > limit {
			t.Errorf("fork bomb under a %d pids limit started %d processes, want < %d", limit, started, limit)
		}
	})
}

// testRecover creates sandboxes with one backend instance and re-adopts
// them with another over the same state.
func (s *suite) testRecover(t *testing.T) {
	needs(t, s.caps.Recover, "Recover")
	if s.h.Reopen == nil {
		t.Skip("Harness.Reopen is nil")
	}
	c := ctx(t)

	running := s.spec(t)
	s.create(t, s.b, running)
	if err := s.b.Start(c, running.ID); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if s.caps.Exec {
		s.shOK(t, running.ID, "mkdir -p rec && echo kept > rec/marker")
	}
	if s.caps.Files {
		if err := s.b.(backend.Files).WriteFile(c, running.ID, "/rec-file", 0o644, strings.NewReader("before")); err != nil {
			t.Fatalf("WriteFile: %v", err)
		}
	}
	stopped := s.spec(t)
	s.create(t, s.b, stopped)
	if err := s.b.Start(c, stopped.ID); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := s.b.Stop(c, stopped.ID, time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}

	b2 := s.h.Reopen(t, s.b)
	s.b = b2 // the later cases too: old is as good as gone
	s2 := &suite{h: s.h, b: b2, caps: b2.Capabilities()}

	st, err := b2.Recover(c, running)
	if err != nil || st.State != backend.StateRunning {
		t.Fatalf("Recover of a running sandbox = %q, %v; want %q", st.State, err, backend.StateRunning)
	}
	s2.wantState(t, running.ID, backend.StateRunning)
	if s.caps.Exec {
		if got := s2.shOK(t, running.ID, "cat rec/marker"); got != "kept\n" {
			t.Errorf("exec after recovery: got %q, want %q", got, "kept\n")
		}
	}
	if s.caps.Files {
		// The files of a sandbox an earlier process created, both ways.
		f := b2.(backend.Files)
		var b bytes.Buffer
		if err := f.ReadFile(c, running.ID, "/rec-file", &b); err != nil || b.String() != "before" {
			t.Errorf("ReadFile after recovery = %q, %v; want %q", b.String(), err, "before")
		}
		if err := f.WriteFile(c, running.ID, "/rec-file", 0o644, strings.NewReader("after")); err != nil {
			t.Errorf("WriteFile after recovery: %v", err)
		} else if s.caps.Exec {
			if got := s2.shOK(t, running.ID, "cat rec-file"); got != "after" { // exec runs in "/" (sh)
				t.Errorf("a file written after recovery, read inside: %q, want %q", got, "after")
			}
		}
	}
	if st, err := b2.Recover(c, running); err != nil || st.State != backend.StateRunning {
		t.Errorf("second Recover = %q, %v; want %q again", st.State, err, backend.StateRunning)
	}

	st, err = b2.Recover(c, stopped)
	if err != nil || st.State != backend.StateStopped {
		t.Errorf("Recover of a stopped sandbox = %q, %v; want %q", st.State, err, backend.StateStopped)
	}

	_, err = b2.Recover(c, s.spec(t))
	wantErr(t, "Recover of a sandbox never created", err, errdefs.ErrNotFound)

	for _, id := range []string{running.ID, stopped.ID} {
		if err := b2.Destroy(c, id); err != nil {
			t.Errorf("Destroy(%s) after recovery: %v", id, err)
		}
		_, err := b2.Inspect(c, id)
		wantErr(t, "Inspect after Destroy", err, errdefs.ErrNotFound)
	}
}
