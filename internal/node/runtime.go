package node

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Sandbox runtimes. A backend with several (backend.Runtimes: the
// container backend's runc and gVisor) runs each sandbox under the one
// its create names. The agent asks at New which of them this host runs,
// reports them (api.Node.Runtimes, an unavailable one also as a
// problem), refuses a create whose runtime it cannot run, and refuses
// what a runtime's sandboxes cannot do: a gVisor sandbox's network stack
// is its own, so the node neither gives it a network nor reaches its
// ports.

// runtimesOf returns b as a backend with several runtimes, if it is one
// that names any.
func runtimesOf(b backend.Backend) (backend.Runtimes, bool) {
	rb, ok := b.(backend.Runtimes)
	return rb, ok && len(rb.Runtimes()) > 0
}

// nodeRuntimes asks each backend with runtimes which of them this host
// runs: the status entries, by backend then in the backend's order, and
// a problem line for each it does not run.
func nodeRuntimes(ctx context.Context, backends map[string]backend.Backend) ([]api.NodeRuntime, []string) {
	var rts []api.NodeRuntime
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(backends)) {
		rb, ok := runtimesOf(backends[name])
		if !ok {
			continue
		}
		for _, rt := range rb.Runtimes() {
			r := api.NodeRuntime{Backend: name, Name: rt, Available: true}
			if err := rb.RuntimeAvailable(ctx, rt); err != nil {
				// The backend's reason often starts with the
				// runtime's name, which the entry already gives.
				r.Available, r.Reason = false, strings.TrimPrefix(err.Error(), rt+": ")
				problems = append(problems, fmt.Sprintf("%s: runtime %s unavailable: %s", name, rt, r.Reason))
			}
			rts = append(rts, r)
		}
	}
	return rts, problems
}

// runtime resolves a create's runtime on backend b: the runtime the
// sandbox runs under (api.Sandbox.Runtime; "" on a backend without
// runtimes), and what its backend.Spec carries ("" for the default).
// ErrInvalid for a runtime b does not have; ErrUnavailable with
// api.CodeRuntimeUnavailable for one this node cannot run, saying why.
func (a *Agent) runtime(b backend.Backend, want string) (name, spec string, err error) {
	rb, ok := runtimesOf(b)
	if !ok {
		if want != "" {
			return "", "", errdefs.Invalid("runtime %s: backend %s on node %s has no runtimes to choose from", want, b.Name(), a.cfg.ID)
		}
		return "", "", nil
	}
	names := rb.Runtimes()
	name = want
	if name == "" {
		name = names[0]
	}
	if !slices.Contains(names, name) {
		return "", "", errdefs.Invalid("runtime %q: backend %s runs %s", want, b.Name(), strings.Join(names, " or "))
	}
	for _, r := range a.runtimes {
		if r.Backend == b.Name() && r.Name == name && !r.Available {
			return "", "", errdefs.New(errdefs.ErrUnavailable, api.CodeRuntimeUnavailable,
				"runtime %s is not available on node %s: %s", name, a.cfg.ID, r.Reason)
		}
	}
	if name != names[0] {
		spec = name
	}
	return name, spec, nil
}

// ownNetwork returns ErrInvalid with api.CodeNotSupported if s runs under
// a runtime whose network the node cannot reach into (gVisor's): no
// network policy but none, no ports. Nil otherwise.
func (s *sandbox) ownNetwork(verb string) error {
	s.mu.Lock()
	id, rt := s.view.ID, s.view.Runtime
	s.mu.Unlock()
	if rt != api.RuntimeGVisor {
		return nil
	}
	return errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported,
		"%s of sandbox %s: it runs under gvisor, whose network stack is its own (its loopback only): the node can neither give it a network nor reach its ports", verb, id)
}
