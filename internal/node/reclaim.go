package node

import (
	"context"
	"os"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
)

// Idle reclaim: a running sandbox no call has used for Config.ReclaimIdle
// has its memory pushed out (backend.Reclaimer: its page cache, and its
// anonymous memory where the node swaps), once per idle spell, and again
// every reclaimAgain while the spell lasts (what it runs in the
// background may have read more in). The reaper does it, at most
// reclaimsPerPass sandboxes per pass. What the sandbox touches again
// comes back from its files (or swap): an idle sandbox keeps its memory
// in name, the host gets it in fact.
//
// DAMON (the kernel's access monitor) could pick the cold pages of a busy
// sandbox too, where the host's DAMON has per-cgroup filters; the node
// reports whether it has DAMON (damonStatus) but reclaims by idleness.

const (
	reclaimAgain    = 10 // idle spells of ReclaimIdle before reclaiming again
	reclaimsPerPass = 16
)

// reclaimIdle reclaims s's memory if it is due; it returns whether it
// tried.
func (a *Agent) reclaimIdle(s *sandbox, now time.Time) bool {
	idle := a.cfg.ReclaimIdle
	r, ok := s.backend.(backend.Reclaimer)
	if idle <= 0 || !ok {
		return false
	}
	s.mu.Lock()
	due := s.view.State == api.StateRunning && !s.deleting && s.calls == 0 && now.Sub(s.view.LastUsedAt) > idle &&
		(s.reclaimedAt.Before(s.view.LastUsedAt) || now.Sub(s.reclaimedAt) > reclaimAgain*idle)
	if due {
		s.reclaimedAt = now
	}
	s.mu.Unlock()
	if !due {
		return false
	}
	ctx, cancel := context.WithTimeout(a.closing, time.Minute)
	defer cancel()
	st, err := r.Reclaim(ctx, s.spec.ID)
	if err != nil {
		a.log.Debug("idle reclaim", "sandbox", s.spec.ID, "err", err)
		return true
	}
	a.mu.Lock()
	a.reclaims++
	a.reclaimed += max(st.Before-st.After, 0)
	a.reclaimHow = st.How
	a.mu.Unlock()
	a.log.Debug("reclaimed an idle sandbox's memory", "sandbox", s.spec.ID, "before", st.Before, "after", st.After, "how", st.How)
	return true
}

// reclaimStatus is api.NodeInUse.Reclaim. a.mu held.
func (a *Agent) reclaimStatus() *api.NodeReclaim {
	r := &api.NodeReclaim{IdleAfter: api.Duration(a.cfg.ReclaimIdle), Sandboxes: a.reclaims, Bytes: api.Quantity(a.reclaimed), DAMON: damonStatus()}
	switch {
	case a.cfg.ReclaimIdle <= 0:
		r.Mechanism = "off"
	case a.reclaimHow != "":
		r.Mechanism = a.reclaimHow
	default:
		r.Mechanism = "cgroup memory reclaim (none due yet)"
		for _, b := range a.backends {
			if _, ok := b.(backend.Reclaimer); ok {
				return r
			}
		}
		r.Mechanism = "none: no backend here reclaims"
	}
	return r
}

// damonStatus says whether the host has DAMON, which warren does not
// use (yet).
func damonStatus() string {
	if _, err := os.Stat("/sys/kernel/mm/damon/admin/kdamonds"); err != nil {
		return "unavailable: no DAMON sysfs interface (CONFIG_DAMON_SYSFS)"
	}
	return "available (sysfs), not used: reclaim is by idleness"
}
