// Package rootfs reads and writes files inside a sandbox's root filesystem
// from the host, resolving every path strictly inside the root (openat2 with
// RESOLVE_IN_ROOT): absolute and relative symlinks planted in the sandbox are
// resolved as if root were "/", so they can never make the host read or write
// outside it. Backends whose root is visible on the host (container, fake)
// implement backend.Files with it.
package rootfs

import (
	"io"

	"github.com/warrenhq/warren/internal/backend"
)

// Stat describes path inside root. ErrNotFound if it does not exist.
func Stat(root, path string) (backend.FileInfo, error) { panic("TODO") }

// WriteFile creates or truncates the regular file path inside root, creating
// missing parent directories (mode 0755), and copies r into it.
func WriteFile(root, path string, mode uint32, r io.Reader) error { panic("TODO") }

// ReadFile copies the regular file path inside root to w. ErrNotFound if
// missing, ErrInvalid if it is not a regular file.
func ReadFile(root, path string, w io.Writer) error { panic("TODO") }

// WriteTar extracts the tar stream r under dir inside root.
func WriteTar(root, dir string, r io.Reader) error { panic("TODO") }

// ReadTar writes path inside root (file or directory tree) to w as a tar.
func ReadTar(root, path string, w io.Writer) error { panic("TODO") }

// LookupUser resolves "", "name", "uid", "uid:gid" or "name:group" against
// root's /etc/passwd and /etc/group. "" is root (0:0).
func LookupUser(root, user string) (uid, gid uint32, err error) { panic("TODO") }
