package fake

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/rootfs"
)

var _ backend.Snapshotter = (*Backend)(nil)

// Snapshot copies the sandbox's whole root: the fake has no layers below
// it, so everything in it counts as written. Nothing is frozen (the fake
// isolates nothing); Freeze is the copy's time. Paths to strip and
// residue are taken out of the copy.
func (b *Backend) Snapshot(ctx context.Context, id string, req backend.SnapshotRequest) (*backend.Snapshot, error) {
	st, err := b.Inspect(ctx, id)
	if err != nil {
		return nil, err
	}
	if st.State != backend.StateRunning {
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "fake: snapshot of %s: sandbox is %s", id, st.State)
	}
	for _, p := range req.Strip {
		if _, err := rootfs.CleanStripPath(p); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp(filepath.Join(b.base, id), "snapshot-")
	if err != nil {
		return nil, err
	}
	upper := filepath.Join(dir, "upper")
	start := time.Now()
	_, err = rootfs.CopyTree(b.Root(id), upper)
	snap := &backend.Snapshot{Upper: upper, Freeze: time.Since(start), Method: "copy",
		Remove: func() error { return os.RemoveAll(dir) }}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if snap.Residue, err = rootfs.StripAll(upper, nil, req.Strip, req.Residue); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return snap, nil
}
