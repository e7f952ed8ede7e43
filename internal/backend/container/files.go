package container

import (
	"context"
	"io"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/diskquota"
	"github.com/warrenhq/warren/internal/rootfs"
)

// The file calls work on the sandbox's merged root as the agent holds it
// (a detached clone of its mount: sandbox.withRoot), through package rootfs, which resolves every path inside it. They see
// what the sandbox wrote to its root filesystem, not to the tmpfs mounts
// that exist only in its mount namespace (/dev, /dev/shm).

// Stat describes path inside the sandbox.
func (c *Container) Stat(ctx context.Context, id, path string) (backend.FileInfo, error) {
	s, err := c.get(id)
	if err != nil {
		return backend.FileInfo{}, err
	}
	var fi backend.FileInfo
	err = s.withRoot(func(root string) (err error) {
		fi, err = rootfs.Stat(root, path)
		return err
	})
	return fi, err
}

// WriteFile creates or replaces a regular file inside the sandbox.
func (c *Container) WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	return s.withRoot(func(root string) error {
		return asSandboxRoot(s, func() error { return rootfs.WriteFile(root, path, mode, r) })
	})
}

// asSandboxRoot runs f, which writes into the sandbox's root from the
// host, as the sandbox's root where it has a user namespace: through its
// idmapped layers the host's root is no id at all (EOVERFLOW), and what
// it creates must belong to the sandbox's root, not the host's.
func asSandboxRoot(s *sandbox, f func() error) error {
	if s.ids == nil {
		return f()
	}
	return diskquota.OnThread(s.fsid(), false, f)
}

// ReadFile streams a regular file of the sandbox to w.
func (c *Container) ReadFile(ctx context.Context, id, path string, w io.Writer) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	return s.withRoot(func(root string) error { return rootfs.ReadFile(root, path, w) })
}

// WriteTar extracts a tar stream under dir inside the sandbox.
func (c *Container) WriteTar(ctx context.Context, id, dir string, r io.Reader) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	return s.withRoot(func(root string) error {
		return asSandboxRoot(s, func() error { return rootfs.WriteTarShifted(root, dir, r, s.idShift()) })
	})
}

// ReadTar writes path inside the sandbox to w as a tar stream.
func (c *Container) ReadTar(ctx context.Context, id, path string, w io.Writer) error {
	s, err := c.get(id)
	if err != nil {
		return err
	}
	return s.withRoot(func(root string) error { return rootfs.ReadTarShifted(root, path, w, s.idShift()) })
}
