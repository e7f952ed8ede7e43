package fake

import (
	"context"
	"io"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/rootfs"
)

// The file calls delegate to package rootfs on the sandbox's root, so they
// are confined to it exactly as the container backend's are. They work in
// any state, stopped included.

// root returns the root directory of a known sandbox.
func (b *Backend) root(ctx context.Context, id string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	x, err := b.get(id)
	if err != nil {
		return "", err
	}
	return x.root(), nil
}

// Stat describes path inside the sandbox.
func (b *Backend) Stat(ctx context.Context, id, path string) (backend.FileInfo, error) {
	root, err := b.root(ctx, id)
	if err != nil {
		return backend.FileInfo{}, err
	}
	return rootfs.Stat(root, path)
}

// WriteFile creates or replaces a regular file inside the sandbox.
func (b *Backend) WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) error {
	root, err := b.root(ctx, id)
	if err != nil {
		return err
	}
	return rootfs.WriteFile(root, path, mode, r)
}

// ReadFile streams a regular file of the sandbox to w.
func (b *Backend) ReadFile(ctx context.Context, id, path string, w io.Writer) error {
	root, err := b.root(ctx, id)
	if err != nil {
		return err
	}
	return rootfs.ReadFile(root, path, w)
}

// WriteTar extracts a tar stream under dir inside the sandbox.
func (b *Backend) WriteTar(ctx context.Context, id, dir string, r io.Reader) error {
	root, err := b.root(ctx, id)
	if err != nil {
		return err
	}
	return rootfs.WriteTar(root, dir, r)
}

// ReadTar writes path inside the sandbox to w as a tar stream.
func (b *Backend) ReadTar(ctx context.Context, id, path string, w io.Writer) error {
	root, err := b.root(ctx, id)
	if err != nil {
		return err
	}
	return rootfs.ReadTar(root, path, w)
}
