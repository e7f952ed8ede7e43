package node

import (
	"context"
	"errors"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
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

// reap deletes every expired sandbox. A scan is cheap next to a create:
// thousands of sandboxes take microseconds.
func (a *Agent) reap(now time.Time) {
	for _, id := range a.expired(now) {
		if err := a.Delete(context.Background(), id); err != nil {
			a.log.Error("reap sandbox", "sandbox", id, "err", err)
			continue
		}
		a.log.Info("reaped sandbox", "sandbox", id)
	}
}

func (a *Agent) expired(now time.Time) []string {
	a.mu.Lock()
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	a.mu.Unlock()
	var ids []string
	for _, s := range all {
		s.mu.Lock()
		v := s.view
		busy := s.deleting
		s.mu.Unlock()
		if busy {
			continue
		}
		if (v.ExpiresAt != nil && now.After(*v.ExpiresAt)) ||
			(v.IdleTimeout > 0 && now.Sub(v.LastUsedAt) > v.IdleTimeout.D()) {
			ids = append(ids, v.ID)
		}
	}
	return ids
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
