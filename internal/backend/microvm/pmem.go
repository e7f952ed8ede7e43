package microvm

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
)

// With DAX, each layer is mapped into the guests as a virtio-pmem device
// backed by one file on the host: every guest reading the layer reads the
// host's page cache of that file, and no guest keeps a copy in its own.
//
// The backing file is the layer rebuilt, once per node, from its own
// contents with every file's data in whole blocks (image.WithPlainData):
// the guest's EROFS maps only such files in place, and reads a file whose
// tail shares a block with its inode (how layers are built, smaller)
// through its own page cache, DAX or not. QEMU wants the file's size a
// multiple of 2 MiB: it is padded with zeros, which EROFS never reads.
// A layer whose files are mostly holes (a snapshot of `truncate -s 1T`)
// is rebuilt with its holes kept as holes (chunked: those files are then
// read through the page cache), not at its files' full size.

// pmemPath is the padded backing file of layer l.
func (m *MicroVM) pmemPath(l backend.Layer) string {
	return filepath.Join(m.cfg.StateDir, "pmem", strings.TrimPrefix(l.Digest, "sha256:")+".erofs")
}

// pmemFile makes l's backing file if it is not there yet.
func (m *MicroVM) pmemFile(ctx context.Context, l backend.Layer) error {
	path := m.pmemPath(l)
	mu := m.pmemLock(l.Digest)
	mu.Lock()
	defer mu.Unlock()
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if m.cfg.Mounts == nil {
		return errdefs.Unavailable("microvm: DAX needs layer mounts (Config.Mounts)")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	src, err := m.cfg.Mounts.Acquire(ctx, l)
	if err != nil {
		return fmt.Errorf("pmem backing of layer %s: %w", l.Digest, err)
	}
	defer m.cfg.Mounts.Release(l.Digest)
	opts := []image.BuildOption{image.WithPlainData()}
	if sparseTree(src, fileSize(l.Path)) {
		opts = append(opts, image.WithSparse())
	}
	tmp := path + ".tmp"
	os.Remove(tmp)
	if err := image.BuildEROFS(ctx, src, tmp, opts...); err != nil {
		return fmt.Errorf("pmem backing of layer %s: %w", l.Digest, err)
	}
	if err := os.Truncate(tmp, alignUp(fileSize(tmp), 2<<20)); err != nil {
		os.Remove(tmp)
		return err
	}
	os.Chmod(tmp, 0o444)
	return os.Rename(tmp, path)
}

// pmemLock is the lock of one layer's backing file: two creates from one
// layer build it once.
func (m *MicroVM) pmemLock(digest string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pmemMu == nil {
		m.pmemMu = map[string]*sync.Mutex{}
	}
	mu := m.pmemMu[digest]
	if mu == nil {
		mu = &sync.Mutex{}
		m.pmemMu[digest] = mu
	}
	return mu
}

// sparseTree says whether the regular files under dir add up to more
// than twice an image of size bytes (and 64 MiB): mostly holes.
func sparseTree(dir string, size int64) bool {
	var total int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total > 2*size+64<<20
}
