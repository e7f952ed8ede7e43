package node

import (
	"context"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// call is where every call on a running sandbox starts, whatever its verb:
// it finds sandbox id running (resuming it first if it is paused: callers
// see only the latency), its backend as T (the optional backend interface
// the verb needs: backend.Execer, backend.Files, backend.Statser, ...)
// and begins the call (reaper.go), so that the call keeps the sandbox
// alive while it runs. done must end it: it returns the call's error, or
// sandbox_gone if the platform ended the sandbox meanwhile. Errors: 404
// for an unknown sandbox, 409 for one not running, 400 not_supported for
// a backend without the verb.
func call[T any](ctx context.Context, a *Agent, id, verb string) (b T, s *sandbox, done func(error) error, err error) {
	for attempt := 0; ; attempt++ {
		s, err = a.running(ctx, id, verb)
		if err != nil {
			return b, nil, nil, err
		}
		var ok bool
		if b, ok = s.backend.(T); !ok {
			return b, nil, nil, errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported, "backend %s does not support %s", s.backend.Name(), verb)
		}
		ends, err := s.begin()
		if err != nil {
			if attempt < 3 && s.isPaused() {
				continue // paused again between the resume and now
			}
			return b, nil, nil, err
		}
		return b, s, func(err error) error { return s.done(ends, err) }, nil
	}
}

func (s *sandbox) isPaused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.view.State == api.StatePaused
}

// Stats reports a running sandbox's resource use.
func (a *Agent) Stats(ctx context.Context, id string) (api.SandboxStats, error) {
	b, _, done, err := call[backend.Statser](ctx, a, id, "stats")
	if err != nil {
		return api.SandboxStats{}, err
	}
	st, err := b.Stats(ctx, id)
	if err := done(err); err != nil {
		return api.SandboxStats{}, err
	}
	return api.SandboxStats{CPUSeconds: st.CPU.Seconds(), Memory: st.Memory, MemoryPeak: st.MemoryPeak, PIDs: st.PIDs}, nil
}
