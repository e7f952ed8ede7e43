package node

import (
	"context"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// backendFor returns running sandbox id and its backend as T, the
// optional backend interface a verb needs (backend.Statser, ...), or a
// classified error: a sandbox that is not running (409), a backend without
// the verb (400 not_supported). It is where a new verb on a sandbox starts.
func backendFor[T any](a *Agent, id, verb string) (*sandbox, T, error) {
	var zero T
	s, err := a.running(id)
	if err != nil {
		return nil, zero, err
	}
	t, ok := s.backend.(T)
	if !ok {
		return nil, zero, errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported, "backend %s does not support %s", s.backend.Name(), verb)
	}
	return s, t, nil
}

// Stats reports a running sandbox's resource use.
func (a *Agent) Stats(ctx context.Context, id string) (api.SandboxStats, error) {
	_, b, err := backendFor[backend.Statser](a, id, "stats")
	if err != nil {
		return api.SandboxStats{}, err
	}
	st, err := b.Stats(ctx, id)
	if err != nil {
		return api.SandboxStats{}, err
	}
	return api.SandboxStats{CPUSeconds: st.CPU.Seconds(), Memory: st.Memory, MemoryPeak: st.MemoryPeak, PIDs: st.PIDs}, nil
}
