package backendtest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

func (s *suite) testLifecycle(t *testing.T) {
	t.Run("CreateStartStopDestroy", func(t *testing.T) {
		c := ctx(t)
		spec := s.spec(t)
		id := spec.ID
		s.create(t, s.b, spec)
		s.wantState(t, id, backend.StateCreated)

		if err := s.b.Start(c, id); err != nil {
			t.Fatalf("Start: %v", err)
		}
		st := s.wantState(t, id, backend.StateRunning)
		if st.StartedAt.IsZero() {
			t.Errorf("running sandbox: StartedAt is zero, want the start time")
		}
		wantErr(t, "Start of a running sandbox", s.b.Start(c, id), errdefs.ErrConflict)

		// Wait blocks while it runs ...
		short, cancel := context.WithTimeout(c, 200*time.Millisecond)
		_, err := s.b.Wait(short, id)
		cancel()
		wantErr(t, "Wait on a running sandbox with a short ctx", err, context.DeadlineExceeded)
		waited := make(chan backend.Status, 1)
		go func() {
			st, err := s.b.Wait(c, id)
			if err != nil {
				t.Errorf("Wait: %v", err)
			}
			waited <- st
		}()

		// ... and returns once it is stopped.
		if err := s.b.Stop(c, id, 5*time.Second); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		select {
		case st := <-waited:
			if st.State != backend.StateStopped {
				t.Errorf("Wait returned state %q, want %q", st.State, backend.StateStopped)
			}
		case <-time.After(killWithin):
			t.Fatalf("Wait did not return within %v of Stop", killWithin)
		}
		s.wantState(t, id, backend.StateStopped)
		if st, err := s.b.Wait(c, id); err != nil || st.State != backend.StateStopped {
			t.Errorf("Wait on a stopped sandbox = %q, %v; want %q at once", st.State, err, backend.StateStopped)
		}
		if err := s.b.Stop(c, id, time.Second); err != nil {
			t.Errorf("Stop of a stopped sandbox: got %v, want nil", err)
		}

		if err := s.b.Destroy(c, id); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		_, err = s.b.Inspect(c, id)
		wantErr(t, "Inspect after Destroy", err, errdefs.ErrNotFound)
		if err := s.b.Destroy(c, id); err != nil {
			t.Errorf("second Destroy: got %v, want nil", err)
		}
	})

	t.Run("DestroyRunning", func(t *testing.T) {
		c := ctx(t)
		id := s.running(t)
		waited := make(chan error, 1)
		go func() { _, err := s.b.Wait(c, id); waited <- err }()
		if err := s.b.Destroy(c, id); err != nil {
			t.Fatalf("Destroy of a running sandbox: %v", err)
		}
		_, err := s.b.Inspect(c, id)
		wantErr(t, "Inspect after Destroy", err, errdefs.ErrNotFound)
		select {
		case <-waited:
		case <-time.After(killWithin):
			t.Fatalf("Wait did not return within %v of Destroy", killWithin)
		}
	})

	t.Run("DestroyCreated", func(t *testing.T) {
		c := ctx(t)
		spec := s.spec(t)
		s.create(t, s.b, spec)
		if err := s.b.Destroy(c, spec.ID); err != nil {
			t.Fatalf("Destroy of a created sandbox: %v", err)
		}
		_, err := s.b.Inspect(c, spec.ID)
		wantErr(t, "Inspect after Destroy", err, errdefs.ErrNotFound)
		// The id is free again.
		s.create(t, s.b, spec)
	})
}

// wantState inspects id and fails t unless it is in state want.
func (s *suite) wantState(t *testing.T, id string, want backend.State) backend.Status {
	t.Helper()
	st, err := s.b.Inspect(ctx(t), id)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", id, err)
	}
	if st.State != want {
		t.Fatalf("Inspect(%s).State = %q, want %q", id, st.State, want)
	}
	return st
}

func (s *suite) testErrors(t *testing.T) {
	t.Run("InvalidID", func(t *testing.T) {
		for _, id := range []string{"", ".", "..", "a/b", "../escape", "-x", "with space", strings.Repeat("x", 300)} {
			spec := s.h.Spec(t, id)
			spec.ID = id
			err := s.b.Create(ctx(t), spec)
			if err == nil {
				s.b.Destroy(context.Background(), id)
			}
			wantErr(t, "Create(id "+id+")", err, errdefs.ErrInvalid)
		}
	})

	t.Run("DuplicateCreate", func(t *testing.T) {
		spec := s.spec(t)
		s.create(t, s.b, spec)
		wantErr(t, "second Create of an id", s.b.Create(ctx(t), spec), errdefs.ErrConflict)
		s.wantState(t, spec.ID, backend.StateCreated) // the first is untouched
	})

	t.Run("UnknownID", func(t *testing.T) {
		c := ctx(t)
		id := newID(t)
		_, err := s.b.Inspect(c, id)
		wantErr(t, "Inspect", err, errdefs.ErrNotFound)
		wantErr(t, "Start", s.b.Start(c, id), errdefs.ErrNotFound)
		wantErr(t, "Stop", s.b.Stop(c, id, time.Second), errdefs.ErrNotFound)
		_, err = s.b.Wait(c, id)
		wantErr(t, "Wait", err, errdefs.ErrNotFound)
		if err := s.b.Destroy(c, id); err != nil {
			t.Errorf("Destroy of an unknown id: got %v, want nil", err)
		}
		if s.caps.Recover {
			_, err = s.b.Recover(c, s.h.Spec(t, id))
			wantErr(t, "Recover", err, errdefs.ErrNotFound)
		}
		if s.caps.Exec {
			_, err = exec(c, s.b, id, backend.ExecRequest{Argv: []string{"true"}})
			wantErr(t, "Exec", err, errdefs.ErrNotFound)
		}
		if s.caps.Files {
			f := s.b.(backend.Files)
			var buf bytes.Buffer
			_, err = f.Stat(c, id, "/")
			wantErr(t, "Stat", err, errdefs.ErrNotFound)
			wantErr(t, "WriteFile", f.WriteFile(c, id, "/x", 0o644, strings.NewReader("x")), errdefs.ErrNotFound)
			wantErr(t, "ReadFile", f.ReadFile(c, id, "/x", &buf), errdefs.ErrNotFound)
			wantErr(t, "WriteTar", f.WriteTar(c, id, "/", &buf), errdefs.ErrNotFound)
			wantErr(t, "ReadTar", f.ReadTar(c, id, "/", &buf), errdefs.ErrNotFound)
		}
	})

	t.Run("ExecNotRunning", func(t *testing.T) {
		needs(t, s.caps.Exec, "Exec")
		c := ctx(t)
		spec := s.spec(t)
		s.create(t, s.b, spec)
		_, err := exec(c, s.b, spec.ID, backend.ExecRequest{Argv: []string{"true"}})
		wantErr(t, "Exec in a created sandbox", err, errdefs.ErrConflict)
		if err := s.b.Start(c, spec.ID); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := s.b.Stop(c, spec.ID, time.Second); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		_, err = exec(c, s.b, spec.ID, backend.ExecRequest{Argv: []string{"true"}})
		wantErr(t, "Exec in a stopped sandbox", err, errdefs.ErrConflict)
	})
}
