package fake

import (
	"context"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

var _ backend.Pauser = (*Backend)(nil)

// Pause marks a running sandbox paused (persisted, so Recover says so);
// the fake holds no memory of its own to reclaim, and does not stop the
// host processes an exec left running.
func (b *Backend) Pause(ctx context.Context, id string) (backend.PauseStats, error) {
	err := b.setPaused(id, true)
	return backend.PauseStats{Reclaim: "none: the fake backend holds no memory"}, err
}

// Resume marks a paused sandbox running again.
func (b *Backend) Resume(ctx context.Context, id string) error { return b.setPaused(id, false) }

func (b *Backend) setPaused(id string, on bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	x, err := b.get(id)
	if err != nil {
		return err
	}
	from, to := backend.StateRunning, backend.StatePaused
	if !on {
		from, to = to, from
	}
	switch x.st.State {
	case to:
		return nil
	case from:
	default:
		return errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "fake: pause %s: sandbox is %s", id, x.st.State)
	}
	st := x.st
	st.State = to
	if err := save(x.dir, st); err != nil {
		return err
	}
	x.st = st
	return nil
}

var _ backend.Reclaimer = (*Backend)(nil)

// Reclaim of a running sandbox: the fake holds no memory of its own, so
// there is nothing to push out; it answers as a reclaim that freed none.
func (b *Backend) Reclaim(ctx context.Context, id string) (backend.ReclaimStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	x, err := b.get(id)
	if err != nil {
		return backend.ReclaimStats{}, err
	}
	if x.st.State != backend.StateRunning {
		return backend.ReclaimStats{}, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "fake: reclaim %s: sandbox is %s", id, x.st.State)
	}
	return backend.ReclaimStats{How: "none: the fake backend holds no memory"}, nil
}
