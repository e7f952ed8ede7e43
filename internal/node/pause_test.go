package node

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Pause and resume through the agent (the fake backend): the state and
// the reservation follow, a call resumes a paused sandbox by itself, the
// clocks stand still while it is paused, and a restart keeps it paused.
func TestPauseResume(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newAgent(t, dir, nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{TTL: api.Duration(2 * time.Second), IdleTimeout: api.Duration(time.Second)})
	other := mustCreate(t, a, api.CreateSandboxRequest{})
	before := a.Status().Usage

	p, err := a.Pause(ctx, sb.ID, PausedByCaller)
	if err != nil || p.State != api.StatePaused || p.PausedAt == nil || p.Pause == nil || p.Pause.By != PausedByCaller {
		t.Fatalf("Pause: %+v, %v", p, err)
	}
	if again, err := a.Pause(ctx, sb.ID, PausedByCaller); err != nil || again.State != api.StatePaused {
		t.Errorf("a second Pause: %+v, %v; want it paused, no error", again, err)
	}
	u := a.Status().Usage
	if u.Paused != 1 || u.Sandboxes != before.Sandboxes || u.CPU != before.CPU-sb.Resources.CPU {
		t.Errorf("usage paused %+v, running %+v: want one paused, its CPU released", u, before)
	}
	// Its TTL (2s) and idle timeout (1s) stand still while it is paused.
	time.Sleep(2500 * time.Millisecond)
	if got, err := a.Get(ctx, sb.ID); err != nil || got.State != api.StatePaused {
		t.Fatalf("paused past its TTL and idle timeout: %+v, %v; want paused still", got, err)
	}

	// A restart keeps it paused.
	a.Close()
	a = newAgent(t, dir, nil)
	if got, err := a.Get(ctx, sb.ID); err != nil || got.State != api.StatePaused {
		t.Fatalf("after a restart: %+v, %v; want paused", got, err)
	}
	if u := a.Status().Usage; u.Paused != 1 {
		t.Errorf("after a restart: usage %+v, want one paused", u)
	}

	// An exec resumes it first; its TTL moved on by the paused time.
	res, err := a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"echo", "back"}}, nil, nil)
	if err != nil || string(res.Stdout) != "back\n" {
		t.Fatalf("exec on a paused sandbox: %+v, %v; want it resumed and run", res, err)
	}
	got, err := a.Get(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning || got.PausedAt != nil || got.Pause.ResumedBy != "exec" ||
		!got.ExpiresAt.After(sb.ExpiresAt.Add(2*time.Second)) {
		t.Fatalf("after the exec: %+v, %v; want running, resumed by exec, its TTL moved on", got, err)
	}
	if u := a.Status().Usage; u.Paused != 0 || u.CPU != before.CPU {
		t.Errorf("after the resume: usage %+v, want %+v", u, before)
	}

	// Resume of a running sandbox is no error; pause of a missing one is 404.
	if r, err := a.Resume(ctx, other.ID, PausedByCaller); err != nil || r.State != api.StateRunning {
		t.Errorf("Resume of a running sandbox: %+v, %v", r, err)
	}
	if _, err := a.Pause(ctx, "n1-aaaaaaaaaaaaaaaa", PausedByCaller); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Pause of a missing sandbox: %v", err)
	}
	// And it ends as any other does, now that it runs again.
	waitFor(t, "the resumed sandbox's idle timeout", func() bool {
		_, err := a.Get(ctx, sb.ID)
		return errors.Is(err, errdefs.ErrNotFound)
	})
	// A paused sandbox is deleted like a running one.
	if _, err := a.Pause(ctx, other.ID, PausedByCaller); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, other.ID); err != nil {
		t.Fatalf("delete a paused sandbox: %v", err)
	}
	if u := a.Status().Usage; u.Paused != 0 || u.Sandboxes != 0 || u.Memory != 0 {
		t.Errorf("with no sandboxes: usage %+v", u)
	}
}

// A sandbox asked to be paused when idle is, and is not deleted; one whose
// TTL runs while paused ends paused.
func TestAutoPauseAndTTLWhilePaused(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{AutoPause: api.Duration(time.Second)})
	waitFor(t, "auto-pause", func() bool {
		got, err := a.Get(ctx, sb.ID)
		return err == nil && got.State == api.StatePaused && got.Pause != nil && got.Pause.By == PausedByAutoPause
	})
	running := mustCreate(t, a, api.CreateSandboxRequest{TTL: api.Duration(time.Second), TTLWhilePaused: true})
	if _, err := a.Pause(ctx, running.ID, PausedByCaller); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the TTL of a sandbox whose TTL runs while paused", func() bool {
		_, err := a.Get(ctx, running.ID)
		return errors.Is(err, errdefs.ErrNotFound) && strings.Contains(err.Error(), endTTL)
	})
}

// A pause with a call in flight is refused (the call would freeze halfway);
// Update changes a paused sandbox's clocks and labels without resuming it.
func TestPauseBusyAndUpdate(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), nil)
	sb := mustCreate(t, a, api.CreateSandboxRequest{Labels: map[string]string{"a": "1", "b": "2"}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"sleep", "1"}}, nil, nil)
	}()
	waitFor(t, "the exec in flight", func() bool {
		s, _ := a.lookup(sb.ID)
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.calls == 1
	})
	if _, err := a.Pause(ctx, sb.ID, PausedByCaller); errdefs.Code(err) != api.CodeSandboxBusy {
		t.Errorf("pause with an exec in flight: %v, want %s", err, api.CodeSandboxBusy)
	}
	<-done
	if _, err := a.Pause(ctx, sb.ID, PausedByCaller); err != nil {
		t.Fatal(err)
	}
	ttl, idle, v := api.Duration(time.Hour), api.Duration(0), "3"
	got, err := a.Update(ctx, sb.ID, api.SandboxUpdate{TTL: &ttl, IdleTimeout: &idle, Labels: map[string]*string{"a": nil, "c": &v}})
	if err != nil || got.State != api.StatePaused || got.TTL != ttl || got.Labels["a"] != "" || got.Labels["b"] != "2" || got.Labels["c"] != "3" {
		t.Fatalf("Update of a paused sandbox: %+v, %v", got, err)
	}
	for _, u := range []api.SandboxUpdate{
		{TTL: new(api.Duration)},
		{Labels: map[string]*string{api.LabelGang: &v}},
		{Labels: map[string]*string{"bad key!": &v}},
	} {
		if _, err := a.Update(ctx, sb.ID, u); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Update %+v: %v, want ErrInvalid", u, err)
		}
	}
	if got, _ := a.Get(ctx, sb.ID); got.State != api.StatePaused || got.Labels["c"] != "3" {
		t.Errorf("after refused updates: %+v", got)
	}
}
