package microvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/loopdev"
	"github.com/warrenhq/warren/internal/rootfs"
)

var _ backend.Snapshotter = (*MicroVM)(nil)

// Snapshot implements backend.Snapshotter. The guest syncs and freezes
// its writable filesystem (FIFREEZE: every write before is on the disk,
// none happens during), the host copies the disk image (a clone where
// the host's filesystem shares blocks, else its data extents), and the
// guest thaws: the sandbox stood still only for the copy. The copy is
// mounted on the host, and its overlay upper directory, the same layout
// a container's writable layer has, is the snapshot: it stacks as a diff
// layer on the sandbox's layers, for containers and microVMs alike.
func (m *MicroVM) Snapshot(ctx context.Context, id string, req backend.SnapshotRequest) (*backend.Snapshot, error) {
	strip := make([]string, len(req.Strip))
	for i, p := range req.Strip {
		var err error
		if strip[i], err = rootfs.CleanStripPath(p); err != nil {
			return nil, err
		}
	}
	s, err := m.running(id, "snapshot")
	if err != nil {
		return nil, err
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	dir := filepath.Join(s.dir, "snapshot-"+hex.EncodeToString(rnd[:]))
	mnt := filepath.Join(dir, "mnt")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return nil, err
	}
	snap := &backend.Snapshot{Remove: func() error {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return err
		}
		return os.RemoveAll(dir)
	}}
	fail := func(err error) (*backend.Snapshot, error) {
		return nil, errors.Join(fmt.Errorf("snapshot of %s: %w", id, err), snap.Remove())
	}
	if err := s.guest.call(ctx, "POST", "/v1/sync", url.Values{"freeze": {"1"}}, nil, nil); err != nil {
		return fail(err)
	}
	start := time.Now()
	reflink, err := rootfs.CopyFile(filepath.Join(s.dir, upperFile), filepath.Join(dir, upperFile))
	// Thawed whatever happened: the sandbox runs on.
	if terr := s.guest.call(context.WithoutCancel(ctx), "POST", "/v1/sync", url.Values{"freeze": {"0"}}, nil, nil); terr != nil {
		err = errors.Join(err, terr)
	}
	snap.Freeze = time.Since(start)
	if err != nil {
		return fail(err)
	}
	snap.Method = "disk-image-copy"
	if reflink {
		snap.Method = "disk-image-reflink"
	}
	// Read-write: stripping changes the copy (never the sandbox's disk).
	if err := loopdev.Mount(filepath.Join(dir, upperFile), mnt, "ext4", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
		return fail(fmt.Errorf("mount the disk's copy: %w", err))
	}
	snap.Upper = filepath.Join(mnt, "upper")
	if len(strip) > 0 || len(req.Residue) > 0 {
		lowers, release, err := m.lowers(ctx, s)
		if err != nil {
			return fail(err)
		}
		snap.Residue, err = rootfs.StripAll(snap.Upper, lowers, strip, req.Residue)
		release()
		if err != nil {
			return fail(err)
		}
	}
	return snap, nil
}

// lowers mounts s's layers on the host (shared with containers, through
// Config.Mounts), top first, for stripping a snapshot.
func (m *MicroVM) lowers(ctx context.Context, s *sandbox) ([]string, func(), error) {
	if m.cfg.Mounts == nil {
		return nil, nil, errdefs.Unavailable("microvm: no layer mounts configured: cannot strip paths from a snapshot")
	}
	var got []string
	release := func() {
		for _, d := range got {
			m.cfg.Mounts.Release(d)
		}
	}
	lowers := make([]string, 0, len(s.spec.Layers))
	for i := len(s.spec.Layers) - 1; i >= 0; i-- {
		l := s.spec.Layers[i]
		mp, err := m.cfg.Mounts.Acquire(ctx, l)
		if err != nil {
			release()
			return nil, nil, err
		}
		got = append(got, l.Digest)
		lowers = append(lowers, mp)
	}
	return lowers, release, nil
}
