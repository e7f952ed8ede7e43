package node

import (
	"context"
	"fmt"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Pausing. A paused sandbox's processes are frozen and its memory pushed
// out (backend.Pauser); it keeps its files, network and ports. Its state
// is paused, its TTL and idle clocks stand still (the TTL runs on with
// TTLWhilePaused), and it holds of the node's reservation only its
// memory at its paused size: no CPU. Any call on it resumes it first
// (call, in verbs.go), so callers see only latency; Resume does it
// without a call.

// Who paused a sandbox (api.PauseInfo.By).
const (
	PausedByCaller    = "caller"
	PausedByAutoPause = "auto-pause"
)

// Pause pauses sandbox id (by says who asked). A paused sandbox answers
// as it is. Errors: 404; 409 sandbox_not_running when it is not running,
// sandbox_busy while calls on it are in flight (they would freeze
// halfway); 400 not_supported for a backend that cannot.
func (a *Agent) Pause(ctx context.Context, id, by string) (sb api.Sandbox, err error) {
	s, err := a.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer func(start time.Time) { a.record(id, start, api.JournalEntry{Verb: "pause", By: by}, err) }(time.Now())
	p, ok := s.backend.(backend.Pauser)
	if !ok {
		return api.Sandbox{}, errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported, "backend %s does not support pause", s.backend.Name())
	}
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	s.mu.Lock()
	switch {
	case s.deleting:
		s.mu.Unlock()
		return api.Sandbox{}, errGone(id, s.endReason, false)
	case s.view.State == api.StatePaused:
		s.mu.Unlock()
		return s.snapshot(), nil
	case s.view.State != api.StateRunning:
		state := s.view.State
		s.mu.Unlock()
		return api.Sandbox{}, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "pause %s: sandbox is %s, not running", id, state)
	case s.calls > 0:
		n := s.calls
		s.mu.Unlock()
		return api.Sandbox{}, errdefs.New(errdefs.ErrConflict, api.CodeSandboxBusy, "pause %s: %d call(s) in flight; pause it when they end", id, n)
	}
	// Paused from here: a call that starts now waits on pauseMu, then
	// resumes it.
	now := time.Now().UTC()
	s.view.State, s.view.Reason, s.view.PausedAt = api.StatePaused, "paused by "+by, &now
	s.changed()
	s.mu.Unlock()

	st, err := p.Pause(ctx, id)
	if err != nil {
		s.mu.Lock()
		if s.view.State == api.StatePaused {
			s.view.State, s.view.Reason, s.view.PausedAt = api.StateRunning, "", nil
			s.changed()
		}
		s.mu.Unlock()
		return api.Sandbox{}, err
	}
	s.mu.Lock()
	s.view.Pause = &api.PauseInfo{By: by, FreezeMS: float64(st.Freeze.Microseconds()) / 1000,
		MemoryBefore: st.Before, MemoryAfter: st.After, Reclaim: st.Reclaim}
	s.changed()
	v := s.view
	s.mu.Unlock()
	a.rehold(s, pausedHold(v), true)
	a.persist(s)
	a.log.Info("sandbox paused", "sandbox", id, "by", by, "freeze_ms", v.Pause.FreezeMS,
		"memory_before", st.Before, "memory_after", st.After, "reclaim", st.Reclaim)
	return s.snapshot(), nil
}

// Resume resumes paused sandbox id (by: "caller", or the verb of the
// call that needs it running). A running sandbox answers as it is.
func (a *Agent) Resume(ctx context.Context, id, by string) (api.Sandbox, error) {
	s, err := a.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := a.resume(ctx, s, by); err != nil {
		return api.Sandbox{}, err
	}
	return s.snapshot(), nil
}

// resume thaws s if it is paused. Its TTL moves on by the time it was
// paused (unless TTLWhilePaused), and its idle clock starts afresh.
func (a *Agent) resume(ctx context.Context, s *sandbox, by string) error {
	id := s.spec.ID
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	s.mu.Lock()
	state, deleting := s.view.State, s.deleting
	s.mu.Unlock()
	if deleting {
		return errGone(id, s.endReason, false)
	}
	if state != api.StatePaused {
		return nil
	}
	p, ok := s.backend.(backend.Pauser)
	if !ok {
		return errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported, "backend %s does not support resume", s.backend.Name())
	}
	start := time.Now()
	if err := p.Resume(context.WithoutCancel(ctx), id); err != nil {
		err = fmt.Errorf("resume %s: %w", id, err)
		a.record(id, start, api.JournalEntry{Verb: "resume", By: by}, err)
		return err
	}
	a.record(id, start, api.JournalEntry{Verb: "resume", By: by}, nil)
	now := time.Now().UTC()
	s.mu.Lock()
	if s.view.PausedAt != nil && s.view.ExpiresAt != nil && !s.view.TTLWhilePaused {
		exp := s.view.ExpiresAt.Add(now.Sub(*s.view.PausedAt))
		s.view.ExpiresAt = &exp
	}
	s.view.State, s.view.Reason, s.view.PausedAt, s.view.LastUsedAt = api.StateRunning, "", nil, now
	if s.view.Pause != nil {
		p := *s.view.Pause
		p.ResumedAt, p.ResumedBy = &now, by
		s.view.Pause = &p
	}
	s.changed()
	v := s.view
	s.mu.Unlock()
	a.rehold(s, v.Resources, false)
	a.persist(s)
	a.log.Info("sandbox resumed", "sandbox", id, "by", by, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// pausedHold is what a paused sandbox holds of the node's reservation:
// its memory at its paused size, no CPU.
func pausedHold(v api.Sandbox) api.Resources {
	r := api.Resources{}
	if v.Pause != nil {
		r.Memory = api.Quantity(min(v.Pause.MemoryAfter, int64(v.Resources.Memory)))
	}
	return r
}

// rehold makes s hold r of the node's reservation instead of what it
// did, paused or not.
func (a *Agent) rehold(s *sandbox, r api.Resources, paused bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sandboxes[s.spec.ID] != s {
		return // ended meanwhile: its hold is released
	}
	a.reserved.add(s.held, -1)
	if s.heldPaused {
		a.paused--
	}
	s.held, s.heldPaused = r, paused
	a.reserved.add(s.held, 1)
	if s.heldPaused {
		a.paused++
	}
}

// autoPause pauses s if it asked to be after AutoPause idle and has
// been; the reaper calls it.
func (a *Agent) autoPause(s *sandbox, now time.Time) {
	s.mu.Lock()
	due := s.view.AutoPause > 0 && s.view.State == api.StateRunning && !s.deleting && s.calls == 0 &&
		now.Sub(s.view.LastUsedAt) > s.view.AutoPause.D()
	s.mu.Unlock()
	if !due {
		return
	}
	if _, err := a.Pause(context.Background(), s.spec.ID, PausedByAutoPause); err != nil {
		a.log.Warn("auto-pause", "sandbox", s.spec.ID, "err", err)
	}
}
