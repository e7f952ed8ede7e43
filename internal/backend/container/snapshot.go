package container

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/diskquota"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/rootfs"
)

var _ backend.Snapshotter = (*Container)(nil)

// Snapshot copies sandbox id's writable layer (its overlay upper
// directory) while its cgroup is frozen, so the copy is one instant of
// the sandbox, as after a power cut: no process of it runs, and every
// write a process made before is in the upper directory, whether or not
// it reached the disk. The freeze lasts only as long as the copy:
//
//   - btrfs (a sandbox with a disk limit has a subvolume of its own): a
//     snapshot of the subvolume, one transaction whatever it holds (its
//     dirty data is synced before the freeze, so the transaction is
//     small);
//   - elsewhere: a copy of the tree made while the sandbox runs, then
//     brought up to date while it is frozen (rootfs.Copy: a stat of each
//     entry, and a copy of what changed meanwhile); files are cloned
//     where the filesystem shares blocks (xfs with reflink), else copied
//     extent by extent.
//
// Then the sandbox runs on, and the paths to strip and the build residue
// are taken out of the copy (rootfs.StripAll). The copy is in the sandbox's directory, so it is on
// the same filesystem and goes with the sandbox if the caller never
// removes it.
func (c *Container) Snapshot(ctx context.Context, id string, req backend.SnapshotRequest) (*backend.Snapshot, error) {
	strip := make([]string, len(req.Strip))
	for i, p := range req.Strip {
		var err error
		if strip[i], err = rootfs.CleanStripPath(p); err != nil {
			return nil, err
		}
	}
	s, err := c.get(id)
	if err != nil {
		return nil, err
	}
	if !s.init.alive() || c.created(s) {
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "snapshot of %s: sandbox is not running", id)
	}
	// One freeze at a time: a second snapshot would thaw the first's.
	s.freezeMu.Lock()
	defer s.freezeMu.Unlock()

	dir := filepath.Join(c.dir(id), "snapshot-"+randomHex(8))
	rw := c.writableDir(id)
	upper := filepath.Join(rw, "upper")
	snap := &backend.Snapshot{Remove: func() error { return diskquota.RemoveTree(dir) }}
	btrfs := diskquota.IsSubvolume(rw)
	// While the sandbox runs: its dirty data to disk (a btrfs snapshot
	// would otherwise write it while the sandbox is frozen), and without
	// btrfs a first copy, brought up to date while frozen.
	syncfs(rw)
	var cp *rootfs.Copy
	if !btrfs {
		if cp, _, err = rootfs.StartCopy(upper, dir); err != nil {
			return nil, errors.Join(fmt.Errorf("snapshot of %s: %w", id, err), snap.Remove())
		}
	}
	start := time.Now()
	if err := s.cg.base.Freeze(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("snapshot of %s: %w", id, err), snap.Remove())
	}
	if btrfs {
		err = diskquota.Snapshot(rw, dir)
		snap.Upper, snap.Method = filepath.Join(dir, "upper"), "btrfs-snapshot"
	} else {
		var st rootfs.CopyStats
		st, err = cp.Update()
		snap.Upper, snap.Method = dir, "copy"
		if st.Reflink {
			snap.Method = "reflink"
		}
	}
	// Thawed whatever happened: the sandbox runs on.
	if terr := s.cg.base.Thaw(context.WithoutCancel(ctx)); terr != nil {
		err = errors.Join(err, terr)
	}
	snap.Freeze = time.Since(start)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("snapshot of %s: %w", id, err), snap.Remove())
	}

	if len(strip) > 0 || len(req.Residue) > 0 {
		lowers := make([]string, 0, len(s.spec.Layers))
		for i := len(s.spec.Layers) - 1; i >= 0; i-- { // top first
			mp, err := c.cfg.Mounts.Path(s.spec.Layers[i].Digest)
			if err != nil {
				return nil, errors.Join(fmt.Errorf("snapshot of %s: %w", id, err), snap.Remove())
			}
			lowers = append(lowers, mp)
		}
		if snap.Residue, err = rootfs.StripAll(snap.Upper, lowers, strip, req.Residue); err != nil {
			return nil, errors.Join(fmt.Errorf("snapshot of %s: %w", id, err), snap.Remove())
		}
	}
	return snap, nil
}

// syncfs writes the dirty data of dir's filesystem; best effort (a
// failure only makes the freeze that follows longer).
func syncfs(dir string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	unix.Syncfs(fd)
	unix.Close(fd)
}
