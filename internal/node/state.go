package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
)

// recordVersion is the on-disk format of sandbox records. Bump it when the
// format changes and teach readRecord the old one. Version 1 gained
// optional fields without a bump (absent reads as zero, which older
// agents ignore): the disk limit, sandbox.resources.disk and disk_inodes
// and spec.Resources.Disk and DiskInodes; the limit itself lives in the
// filesystem (package diskquota), so a record without it loses nothing.
const recordVersion = 1

// record is what the agent keeps on disk to re-adopt a sandbox after a
// restart.
type record struct {
	Version int          `json:"version"`
	Sandbox api.Sandbox  `json:"sandbox"`
	Spec    backend.Spec `json:"spec"`
}

// writeRecord replaces a sandbox's record atomically (temp file + rename).
// No fsync: records matter across agent restarts, which keep the page
// cache; after a host crash the sandboxes are gone anyway.
func (a *Agent) writeRecord(r record) error {
	r.Version = recordVersion
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	path := a.recordPath(r.Sandbox.ID)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write sandbox record: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write sandbox record: %w", err)
	}
	return nil
}

func (a *Agent) removeRecord(id string) {
	if err := os.Remove(a.recordPath(id)); err != nil && !os.IsNotExist(err) {
		a.log.Error("remove sandbox record", "sandbox", id, "err", err)
	}
}

// persist writes a live sandbox's current view.
func (a *Agent) persist(s *sandbox) {
	if err := a.writeRecord(record{Sandbox: s.snapshot(), Spec: s.spec}); err != nil {
		a.log.Error("persist sandbox", "sandbox", s.spec.ID, "err", err)
	}
}

func readRecord(path string) (record, error) {
	var r record
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	if r.Version != recordVersion {
		return r, fmt.Errorf("%s: record version %d, this agent reads %d", path, r.Version, recordVersion)
	}
	return r, nil
}

// recover re-adopts the sandboxes in the state dir. A sandbox that was
// still being created when the last agent died is destroyed; one whose
// backend cannot find it any more is kept as "lost" until deleted, so its
// owner learns what happened instead of seeing a 404.
func (a *Agent) recover(ctx context.Context) error {
	entries, err := os.ReadDir(a.cfg.StateDir)
	if err != nil {
		return fmt.Errorf("read node state: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(a.cfg.StateDir, name)
		if strings.HasSuffix(name, ".tmp") {
			os.Remove(path)
			continue
		}
		if rec, ok := strings.CutSuffix(name, ".journal"); ok {
			if _, err := os.Stat(filepath.Join(a.cfg.StateDir, rec)); errors.Is(err, os.ErrNotExist) {
				os.Remove(path) // a journal whose sandbox is gone
			}
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		r, err := readRecord(path)
		if err != nil {
			a.log.Error("skip unreadable sandbox record", "err", err)
			continue
		}
		a.adopt(ctx, r)
	}
	return nil
}

func (a *Agent) adopt(ctx context.Context, r record) {
	id := r.Sandbox.ID
	b, ok := a.backends[r.Sandbox.Backend]
	if !ok {
		a.log.Error("sandbox on an unavailable backend", "sandbox", id, "backend", r.Sandbox.Backend)
		r.Sandbox.State, r.Sandbox.Reason = api.StateLost, "backend "+r.Sandbox.Backend+" unavailable after agent restart"
		a.keep(nil, r)
		return
	}
	if r.Sandbox.State == api.StateCreating || r.Sandbox.State == api.StateStopping {
		// Half created or half deleted: finish the job.
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := b.Destroy(dctx, id)
		cancel()
		if err != nil {
			a.log.Error("clean up interrupted sandbox", "sandbox", id, "err", err)
			r.Sandbox.State, r.Sandbox.Reason = api.StateLost, "interrupted by an agent restart"
			a.keep(b, r)
			return
		}
		a.removeRecord(id)
		a.log.Info("cleaned up interrupted sandbox", "sandbox", id)
		return
	}
	st, err := b.Recover(ctx, r.Spec)
	switch {
	case err != nil:
		r.Sandbox.State, r.Sandbox.Reason = api.StateLost, "not recovered after agent restart: "+err.Error()
	case st.State == backend.StatePaused && r.Sandbox.State == api.StatePaused:
		// Paused it stays, until a caller or a call resumes it.
	case st.State == backend.StateRunning || st.State == backend.StatePaused:
		// Running (a pause the agent died in the middle of is taken
		// back: its record was not written, or its cgroup never froze).
		if st.State == backend.StatePaused {
			if p, ok := b.(backend.Pauser); ok {
				if err := p.Resume(ctx, id); err != nil {
					a.log.Error("resume a sandbox left frozen", "sandbox", id, "err", err)
				}
			}
		}
		if r.Sandbox.State != api.StateRunning {
			r.Sandbox.State, r.Sandbox.Reason = api.StateRunning, ""
			r.Sandbox.PausedAt = nil
		}
	case r.Sandbox.State == api.StateRunning || r.Sandbox.State == api.StatePaused:
		r.Sandbox.State, r.Sandbox.Reason = api.StateFailed, fmt.Sprintf("sandbox init exited (code %d) while the agent was down", st.ExitCode)
	}
	if r.Sandbox.State == api.StateRunning || r.Sandbox.State == api.StatePaused {
		a.adoptNetwork(ctx, b, &r.Sandbox)
	}
	// The idle clock restarts: the agent cannot know what happened while
	// it was down, and reaping early would lose work.
	r.Sandbox.LastUsedAt = time.Now().UTC()
	s := a.keep(b, r)
	a.persist(s)
	if r.Sandbox.State == api.StateRunning || r.Sandbox.State == api.StatePaused {
		a.watch(s)
	}
	a.log.Info("re-adopted sandbox", "sandbox", id, "state", r.Sandbox.State)
}

// keep registers a recovered sandbox and counts its reservation.
func (a *Agent) keep(b backend.Backend, r record) *sandbox {
	if len(r.Sandbox.Layers) == 0 { // a record from before layers were listed
		for _, l := range r.Spec.Layers {
			r.Sandbox.Layers = append(r.Sandbox.Layers, l.Digest)
		}
	}
	s := &sandbox{backend: b, spec: r.Spec, view: r.Sandbox, log: &a.changes, held: r.Sandbox.Resources}
	if b == nil {
		s.backend = lostBackend{name: r.Sandbox.Backend}
	}
	if r.Sandbox.State == api.StatePaused {
		s.held, s.heldPaused = pausedHold(r.Sandbox), true
	}
	a.mu.Lock()
	s.rev = a.changes.next()
	a.sandboxes[r.Sandbox.ID] = s
	a.reserved.add(s.held, 1)
	if s.heldPaused {
		a.paused++
	}
	if s.spec.BestEffort {
		a.bestEffort++
	}
	a.joinMerge(s.view.MemoryMergeGroup)
	a.mu.Unlock()
	return s
}
