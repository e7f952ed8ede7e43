package node

import (
	"context"
	"fmt"
	"sort"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
)

// Memory pressure: what the node does when the memory in use passes what
// it lets sandboxes have (the host's memory less Limits.Reserve, plus
// swap), so that neither the host nor the agent is ever OOM-killed for
// them. The policy:
//
//  1. Only best-effort sandboxes are touched, never latency ones: a
//     latency sandbox past its own limit meets its own cgroup's OOM
//     killer, as always.
//  2. Running best-effort sandboxes are paused first, the one charged the
//     most memory first (a pause reclaims its page cache, and its
//     anonymous memory where the host has swap), one per meter tick
//     (useInterval), so that each pause's effect shows before the next.
//     A paused sandbox resumes on its next call, like any other.
//  3. When no best-effort sandbox is left running, or the backend cannot
//     pause, best-effort sandboxes are evicted (deleted), again the one
//     charged the most first: their state is stopping, then gone, and
//     the reason (api.Sandbox.Reason; sandbox_gone's message afterwards)
//     says "evicted: node memory pressure ...".
//
// Each action is logged and journalled; a pause says
// PausedByMemoryPressure as who paused it.

// PausedByMemoryPressure is api.PauseInfo.By of a sandbox the node paused
// to free memory.
const PausedByMemoryPressure = "memory-pressure"

// relievePressure takes one step of the policy if the memory in use is
// past the limit, and returns what it did ("" for nothing).
func (a *Agent) relievePressure(ctx context.Context) string {
	_, _, _, mem := a.meter.read()
	if mem.Total == 0 {
		return ""
	}
	inUse := mem.used() + mem.SwapTotal - mem.SwapFree
	limit := mem.Total - a.cfg.Limits.Reserve + mem.SwapTotal
	if inUse <= limit {
		return ""
	}
	why := fmt.Sprintf("node memory pressure: %v in use of %v", api.Quantity(inUse), api.Quantity(limit))
	running, paused := a.bestEffortByMemory(ctx)
	for _, s := range running {
		if _, ok := s.backend.(backend.Pauser); !ok {
			continue
		}
		if _, err := a.Pause(ctx, s.spec.ID, PausedByMemoryPressure); err == nil {
			a.log.Warn("paused a best-effort sandbox", "sandbox", s.spec.ID, "reason", why)
			return "paused " + s.spec.ID
		}
	}
	for _, s := range append(running, paused...) {
		reason, err := a.end(ctx, s, func(s *sandbox) string {
			if s.view.State != api.StateRunning && s.view.State != api.StatePaused {
				return ""
			}
			return "evicted: " + why
		})
		if reason != "" {
			a.log.Warn("evicted a best-effort sandbox", "sandbox", s.spec.ID, "reason", reason, "err", err)
			return "evicted " + s.spec.ID
		}
	}
	return ""
}

// bestEffortByMemory lists the best-effort sandboxes, running and paused
// ones apart, each the most memory first (as their backends count it;
// those that cannot say, last).
func (a *Agent) bestEffortByMemory(ctx context.Context) (running, paused []*sandbox) {
	a.mu.Lock()
	var all []*sandbox
	for _, s := range a.sandboxes {
		if s.spec.BestEffort {
			all = append(all, s)
		}
	}
	a.mu.Unlock()
	charged := map[*sandbox]int64{}
	for _, s := range all {
		if st, ok := s.backend.(backend.Statser); ok {
			if stats, err := st.Stats(ctx, s.spec.ID); err == nil {
				charged[s] = stats.Memory
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return charged[all[i]] > charged[all[j]] })
	for _, s := range all {
		s.mu.Lock()
		state, deleting := s.view.State, s.deleting
		s.mu.Unlock()
		switch {
		case deleting:
		case state == api.StateRunning:
			running = append(running, s)
		case state == api.StatePaused:
			paused = append(paused, s)
		}
	}
	return running, paused
}
