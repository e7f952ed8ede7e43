package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Why the platform ends a sandbox. A call the end cuts short answers
// sandbox_gone with the reason; a later call's 404 names it too.
const (
	endDeleted  = "deleted"
	endTTL      = "ttl expired"
	endIdle     = "idle timeout"
	endShutdown = "node shutting down"
)

// reapLoop deletes sandboxes past their TTL or idle timeout.
func (a *Agent) reapLoop() {
	defer a.wg.Done()
	t := time.NewTicker(a.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case now := <-t.C:
			a.reap(now)
		}
	}
}

// reap ends every sandbox past its TTL, and every idle one past its idle
// timeout. A scan is cheap next to a create: thousands of sandboxes take
// microseconds.
func (a *Agent) reap(now time.Time) int {
	n, reclaims := 0, 0
	for _, s := range a.all() {
		ended, err := a.end(context.Background(), s, func(s *sandbox) string { return s.expiry(now) })
		if err != nil {
			a.log.Error("reap sandbox", "sandbox", s.spec.ID, "err", err)
			continue
		}
		if ended != "" {
			n++
			a.log.Info("reaped sandbox", "sandbox", s.spec.ID, "reason", ended)
			continue
		}
		a.autoPause(s, now)                                      // pause.go
		if reclaims < reclaimsPerPass && a.reclaimIdle(s, now) { // reclaim.go
			reclaims++
		}
	}
	return n
}

func (a *Agent) all() []*sandbox {
	a.mu.Lock()
	defer a.mu.Unlock()
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	return all
}

// expiry is why the reaper should end s now, or "". The TTL is a hard
// limit; the idle timeout counts from the end of the last call and never
// runs while one is in flight. Neither runs while s is paused (its TTL
// moves on by the paused time when it resumes), unless it asked for its
// TTL to (TTLWhilePaused). Sandboxes on a lost backend stay: nothing here
// can clean them up, and their state says so. s.mu is held.
func (s *sandbox) expiry(now time.Time) string {
	if _, lost := s.backend.(lostBackend); lost {
		return ""
	}
	v := &s.view
	paused := v.State == api.StatePaused
	switch {
	case v.ExpiresAt != nil && now.After(*v.ExpiresAt) && (!paused || v.TTLWhilePaused):
		return endTTL
	case !paused && v.IdleTimeout > 0 && s.calls == 0 && now.Sub(v.LastUsedAt) > v.IdleTimeout.D():
		return endIdle
	}
	return ""
}

// end destroys s if why, asked under s's lock, gives a reason (the
// reaper's check that s is still expired and idle must not race with a
// call starting). It returns the reason, or "" when why gave none or
// another end is on it already. Calls in flight then answer sandbox_gone
// with the reason. A destroy that fails leaves s failed.
func (a *Agent) end(ctx context.Context, s *sandbox, why func(*sandbox) string) (string, error) {
	id := s.spec.ID
	s.mu.Lock()
	if s.deleting {
		s.mu.Unlock()
		return "", nil // another end is on it
	}
	reason := why(s)
	if reason == "" {
		s.mu.Unlock()
		return "", nil
	}
	s.deleting = true
	s.ends++
	s.endReason = reason
	s.view.State, s.view.Reason = api.StateStopping, reason
	s.changed()
	cancel := s.cancel
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	// Destroy outlives the caller: a half-destroyed sandbox helps nobody.
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer dcancel()
	if a.cfg.Network != nil {
		// First: the sandbox's last packets meet no rules of a reused slot.
		if err := a.cfg.Network.Detach(id); err != nil {
			a.log.Error("remove sandbox network", "sandbox", id, "err", err)
		}
	}
	if err := s.backend.Destroy(dctx, id); err != nil {
		s.mu.Lock()
		s.deleting = false
		s.view.State, s.view.Reason = api.StateFailed, "delete failed: "+err.Error()
		s.changed()
		s.mu.Unlock()
		return "", fmt.Errorf("destroy %s: %w", id, err)
	}
	a.removeRecord(id)
	a.forgetJournal(id) // journal.go
	a.mu.Lock()
	if a.sandboxes[id] == s {
		delete(a.sandboxes, id)
		a.changes.buried(id)
		a.graves.add(id, reason, time.Now().UTC())
		a.reserved.add(s.held, -1)
		if s.heldPaused {
			a.paused--
		}
		if s.spec.BestEffort {
			a.bestEffort--
		}
		a.leaveMerge(s.view.MemoryMergeGroup)
	}
	a.mu.Unlock()
	a.log.Info("sandbox deleted", "sandbox", id, "reason", reason)
	return reason, nil
}

// StopSandboxes ends every sandbox of the node, for an agent told to leave
// nothing behind when it stops (`--stop-sandboxes`): from now on the node
// admits no create (503), creates in flight are waited for and ended too,
// and calls in flight answer sandbox_gone ("node shutting down"). It
// returns the ids it ended; the error joins those it could not.
func (a *Agent) StopSandboxes(ctx context.Context) ([]string, error) {
	a.mu.Lock()
	a.shuttingDown = true
	a.mu.Unlock()
	for {
		a.mu.Lock()
		n := a.inflight
		a.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	var (
		mu    sync.Mutex
		ids   []string
		errs  []error
		wg    sync.WaitGroup
		slots = make(chan struct{}, 8)
	)
	for _, s := range a.all() {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			// Lost ones too: this node gives up on everything it holds.
			ended, err := a.end(ctx, s, func(*sandbox) string { return endShutdown })
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if ended != "" {
				ids = append(ids, s.spec.ID)
			}
		}()
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// begin registers a call on s, which must be running: until done, the
// idle reaper leaves s alone. It returns the count of ends done must
// compare against.
func (s *sandbox) begin() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deleting {
		return 0, errGone(s.spec.ID, s.endReason, false)
	}
	if s.view.State != api.StateRunning {
		return 0, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "sandbox %s is %s, not running", s.spec.ID, s.view.State)
	}
	s.calls++
	s.view.LastUsedAt = time.Now().UTC()
	s.changed()
	return s.ends, nil
}

// done ends a call begun at ends: the idle clock restarts now. If the
// platform set out to end s meanwhile, the call answers sandbox_gone
// instead of err or its result.
func (s *sandbox) done(ends uint64, err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls--
	s.view.LastUsedAt = time.Now().UTC()
	s.changed()
	if s.ends != ends {
		return errGone(s.spec.ID, s.endReason, true)
	}
	return err
}

// errGone: the platform ended sandbox id (during the call, if during).
// An end the caller did not ask for and its limits did not make (the node
// shutting down) is the platform's fault: the error says so
// (api.Error.InfraError).
func errGone(id, reason string, during bool) error {
	var err error
	if during {
		err = errdefs.New(errdefs.ErrConflict, api.CodeSandboxGone, "sandbox %s was ended by the platform during the call: %s", id, reason)
	} else {
		err = errdefs.New(errdefs.ErrConflict, api.CodeSandboxGone, "sandbox %s is being ended by the platform: %s", id, reason)
	}
	if reason == endShutdown {
		err = errdefs.AsInfra(err, "the sandbox's node shut down")
	}
	return err
}

// graves remembers why recently ended sandboxes ended, so that a call
// arriving after still hears why (in its 404's message). Bounded: the
// oldest are forgotten first. Guarded by Agent.mu.
type graves struct {
	by    map[string]grave
	order []string // oldest first
}

type grave struct {
	reason string
	at     time.Time
}

// maxGraves bounds the ends remembered.
const maxGraves = 4096

func (g *graves) add(id, reason string, at time.Time) {
	if g.by == nil {
		g.by = map[string]grave{}
	}
	if len(g.order) >= maxGraves {
		drop := len(g.order) / 2
		for _, old := range g.order[:drop] {
			delete(g.by, old)
		}
		g.order = append(g.order[:0], g.order[drop:]...)
	}
	g.by[id] = grave{reason: reason, at: at}
	g.order = append(g.order, id)
}

func (g *graves) get(id string) (grave, bool) {
	v, ok := g.by[id]
	return v, ok
}

func isNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }

// lostBackend stands in for a backend that is unavailable after a restart,
// so the sandboxes it held can be listed as lost. It cannot clean them up.
type lostBackend struct {
	backend.Backend // nil: only the methods below are called
	name            string
}

func (l lostBackend) Name() string { return l.name }

func (l lostBackend) Destroy(context.Context, string) error {
	return errdefs.Unavailable("backend %s is unavailable on this node; cannot clean up", l.name)
}
