package microvm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/rootfs"
)

// With DAX, each layer is mapped into the guests as a virtio-pmem device
// backed by one file on the host: every guest reading the layer reads the
// host's page cache of that file, and no guest keeps a copy in its own.
// QEMU wants the file's size a multiple of 2 MiB, so the backing file is
// the layer padded with zeros (which EROFS never reads), one per layer
// on the node, made once (a clone where the filesystem shares blocks).

// pmemPath is the padded backing file of layer l.
func (m *MicroVM) pmemPath(l backend.Layer) string {
	return filepath.Join(m.cfg.StateDir, "pmem", strings.TrimPrefix(l.Digest, "sha256:")+".erofs")
}

// pmemFile makes l's padded backing file if it is not there yet.
func (m *MicroVM) pmemFile(l backend.Layer) error {
	path := m.pmemPath(l)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	copyPath := filepath.Join(tmp, filepath.Base(l.Path))
	if _, err := rootfs.CopyFile(l.Path, copyPath); err != nil {
		return fmt.Errorf("pmem backing of layer %s: %w", l.Digest, err)
	}
	if err := os.Truncate(copyPath, alignUp(fileSize(l.Path), 2<<20)); err != nil {
		return err
	}
	os.Chmod(copyPath, 0o444)
	return os.Rename(copyPath, path) // a racing create made the same file
}

// copyFile copies src to dst (a clone where the filesystem can).
func copyFile(src, dst string) (bool, error) {
	if filepath.Base(src) == filepath.Base(dst) {
		return rootfs.CopyFile(src, dst)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), ".copy-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(tmp)
	mid := filepath.Join(tmp, filepath.Base(src))
	reflink, err := rootfs.CopyFile(src, mid)
	if err != nil {
		return false, err
	}
	return reflink, os.Rename(mid, dst)
}
