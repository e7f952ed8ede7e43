package node

import (
	"context"
	"fmt"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/criu"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/rootfs"
)

// Packer builds a directory (a copy of a sandbox's writable layer) into a
// diff layer on top of parent, stores it where every node can fetch it
// and keeps it in this node's layer cache; *image.Cache does.
type Packer interface {
	Pack(ctx context.Context, dir, parent string) (api.PackResult, error)
}

// Pack is the node's half of a snapshot (api.PackRequest): the backend
// copies what the sandbox wrote, holding it still only for the copy
// (backend.Snapshotter), then the copy is packed into a diff layer on the
// sandbox's top layer. The call is held open until the layer is stored,
// so the reaper leaves the sandbox alone meanwhile; the sandbox runs on
// whatever happens. Errors: those of call, ErrInvalid for a bad strip
// path, ErrUnavailable when this node cannot store layers.
func (a *Agent) Pack(ctx context.Context, id string, req api.PackRequest) (api.PackResult, error) {
	start := time.Now()
	if a.cfg.Packer == nil {
		return api.PackResult{}, errdefs.Unavailable("snapshot of %s: this node has no blob store to pack layers into", id)
	}
	if req.WithProcesses {
		why := "it takes no snapshots"
		if a.snapshots != nil {
			why = a.snapshots.ProcessesUnavailable
		}
		return api.PackResult{}, errdefs.New(errdefs.ErrUnavailable, api.CodeProcessSnapshotUnavailable,
			"snapshot of %s with its processes: node %s cannot: %s; a filesystem snapshot (without --with-processes) can", id, a.cfg.ID, why)
	}
	if len(req.Strip) > api.MaxStripPaths {
		return api.PackResult{}, errdefs.Invalid("snapshot of %s: %d strip paths, at most %d", id, len(req.Strip), api.MaxStripPaths)
	}
	b, s, done, err := call[backend.Snapshotter](ctx, a, id, "snapshot")
	if err != nil {
		return api.PackResult{}, err
	}
	res, err := a.pack(ctx, b, s, req)
	err = done(err)
	a.record(id, start, api.JournalEntry{Verb: "snapshot"}, err) // journal.go
	if err != nil {
		return api.PackResult{}, err
	}
	res.Stats.TotalMS = float64(time.Since(start).Microseconds()) / 1000
	a.log.Info("sandbox packed", "sandbox", id, "layer", res.Digest, "freeze_ms", res.Stats.FreezeMS,
		"method", res.Stats.Method, "pack_ms", res.Stats.PackMS, "files", res.Stats.Files, "uploaded", res.Stats.UploadedBytes)
	return res, nil
}

func (a *Agent) pack(ctx context.Context, b backend.Snapshotter, s *sandbox, req api.PackRequest) (api.PackResult, error) {
	id := s.spec.ID
	if len(s.spec.Layers) == 0 {
		return api.PackResult{}, fmt.Errorf("snapshot of %s: no layers", id)
	}
	snap, err := b.Snapshot(ctx, id, backend.SnapshotRequest{Strip: req.Strip, Residue: residue(req)})
	if err != nil {
		return api.PackResult{}, err
	}
	defer func() {
		if err := snap.Remove(); err != nil {
			a.log.Warn("removing a snapshot's copy", "sandbox", id, "err", err)
		}
	}()
	parent := s.spec.Layers[len(s.spec.Layers)-1].Digest
	res, err := a.cfg.Packer.Pack(ctx, snap.Upper, parent)
	if err != nil {
		return api.PackResult{}, fmt.Errorf("snapshot of %s: %w", id, err)
	}
	for _, l := range s.spec.Layers {
		res.Layers = append(res.Layers, l.Digest)
	}
	res.Stats.FreezeMS = float64(snap.Freeze.Microseconds()) / 1000
	res.Stats.Method = snap.Method
	res.Stats.Residue = capList(snap.Residue, api.MaxResidueShown)
	return res, nil
}

// residue is what a pack strips besides req.Strip: the build residue
// (rootfs.Residue) unless the caller keeps it.
func residue(req api.PackRequest) []string {
	if req.KeepResidue {
		return nil
	}
	return rootfs.Residue
}

// capList keeps the first n of l and says how many more there were.
func capList(l []string, n int) []string {
	if len(l) <= n {
		return l
	}
	return append(l[:n:n], fmt.Sprintf("... and %d more", len(l)-n))
}

// nodeSnapshots is what snapshots the node's backends take: filesystem
// ones where a backend is a Snapshotter; processes nowhere yet, and the
// reason (package criu).
func nodeSnapshots(ctx context.Context, backends map[string]backend.Backend) *api.NodeSnapshots {
	fs := false
	for _, b := range backends {
		if _, ok := b.(backend.Snapshotter); ok {
			fs = true
		}
	}
	if !fs {
		return nil
	}
	return &api.NodeSnapshots{Kinds: []string{api.SnapshotKindFilesystem}, ProcessesUnavailable: processesUnavailable(ctx)}
}

// processesUnavailable says why this node snapshots no processes.
func processesUnavailable(ctx context.Context) string {
	v, err := criu.Probe(ctx)
	if err != nil {
		return err.Error()
	}
	for _, l := range guard.LSMs() {
		if l.Name == "landlock" && l.Applied {
			return "criu " + v + " runs here, but sandboxes run under Landlock, which CRIU does not checkpoint: a restored process would run without its domain"
		}
	}
	return "criu " + v + " runs here, but this warren takes filesystem snapshots only"
}
