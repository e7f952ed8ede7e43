package node

import (
	"context"
	"sort"
)

// sweeper is what a backend may also do: remove what it holds on the host
// for sandboxes the agent has no record of (orphan says which ids), and
// say what it removed. Such leftovers come from an agent that died between
// a backend's create and its record, a record removed by hand, or a data
// dir restored from elsewhere: nothing would ever reap them.
type sweeper interface {
	Sweep(ctx context.Context, orphan func(id string) bool) (removed []string, err error)
}

// sweep runs every backend's Sweep at start, after recovery (so that the
// records are known) and before anything is served, and logs each thing
// removed. A backend that fails to sweep is logged, not fatal: the node
// still serves what it has.
func (a *Agent) sweep(ctx context.Context) {
	a.mu.Lock()
	known := make(map[string]bool, len(a.sandboxes))
	for id := range a.sandboxes {
		known[id] = true
	}
	a.mu.Unlock()
	orphan := func(id string) bool { return SandboxIDPattern.MatchString(id) && !known[id] }
	names := make([]string, 0, len(a.backends))
	for name := range a.backends {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		sw, ok := a.backends[name].(sweeper)
		if !ok {
			continue
		}
		removed, err := sw.Sweep(ctx, orphan)
		for _, what := range removed {
			a.log.Warn("swept what no sandbox record accounts for", "backend", name, "removed", what)
		}
		if err != nil {
			a.log.Error("sweep", "backend", name, "err", err)
		}
	}
}
