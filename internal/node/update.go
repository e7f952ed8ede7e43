package node

import (
	"context"
	"maps"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Update changes a live sandbox's TTL (from now), idle timeout, auto-pause
// and labels (api.SandboxUpdate), paused or running, without resuming
// it. Errors: 404; 400 for a bad value; 409 for a sandbox being ended.
func (a *Agent) Update(ctx context.Context, id string, u api.SandboxUpdate) (sb api.Sandbox, err error) {
	s, err := a.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer func(start time.Time) { a.record(id, start, api.JournalEntry{Verb: "update"}, err) }(time.Now())
	d := a.cfg.Defaults
	if u.TTL != nil && (u.TTL.D() < time.Second || u.TTL.D() > d.MaxTTL) {
		return api.Sandbox{}, errdefs.Invalid("ttl %v: want 1s..%v", *u.TTL, d.MaxTTL)
	}
	for _, f := range []struct {
		name string
		v    *api.Duration
	}{{"idle_timeout", u.IdleTimeout}, {"auto_pause", u.AutoPause}} {
		if f.v != nil && *f.v != 0 && (f.v.D() < time.Second || f.v.D() > d.MaxTTL) {
			return api.Sandbox{}, errdefs.Invalid("%s %v: want 0 (off) or 1s..%v", f.name, *f.v, d.MaxTTL)
		}
	}
	set := map[string]string{}
	for k, v := range u.Labels {
		if strings.HasPrefix(k, api.LabelPrefixPlatform) {
			return api.Sandbox{}, errdefs.Invalid("label %q: %s labels are the platform's", k, api.LabelPrefixPlatform)
		}
		if v != nil {
			set[k] = *v
		}
	}
	if err := api.CheckLabels("labels", set, api.MaxLabels); err != nil {
		return api.Sandbox{}, errdefs.Request(err)
	}
	s.mu.Lock()
	if s.deleting {
		s.mu.Unlock()
		return api.Sandbox{}, errGone(id, s.endReason, false)
	}
	labels := maps.Clone(s.view.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range u.Labels {
		if v == nil {
			delete(labels, k)
		} else {
			labels[k] = *v
		}
	}
	if len(labels) > api.MaxLabels {
		s.mu.Unlock()
		return api.Sandbox{}, errdefs.Invalid("labels: %d after the update, at most %d", len(labels), api.MaxLabels)
	}
	v := &s.view
	v.Labels = labels
	if u.TTL != nil {
		now := time.Now().UTC()
		exp := now.Add(u.TTL.D())
		if v.State == api.StatePaused && v.PausedAt != nil && !v.TTLWhilePaused {
			// Paused time is added back on resume: count from the pause.
			exp = v.PausedAt.Add(u.TTL.D())
		}
		v.TTL, v.ExpiresAt = *u.TTL, &exp
	}
	if u.IdleTimeout != nil {
		v.IdleTimeout = *u.IdleTimeout
	}
	if u.AutoPause != nil {
		v.AutoPause = *u.AutoPause
	}
	s.changed()
	s.mu.Unlock()
	a.persist(s)
	return s.snapshot(), nil
}
