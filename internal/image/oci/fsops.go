package oci

import (
	"errors"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/rootfs"
)

// tree is the directory an image is flattened into. Every path is resolved
// inside it the way rootfs does (openat2 RESOLVE_IN_ROOT): ".." and
// absolute symlinks planted by an earlier entry stop at the tree's top, so
// no entry can reach the host. The final component of an entry is only
// ever touched with *at syscalls on its parent's fd, never followed.
type tree struct {
	dir string
}

// openDir resolves rel (clean, relative, "." for the top) in-root to an
// O_PATH directory fd.
func (t *tree) openDir(rel string) (int, error) {
	f, err := rootfs.Open(t.dir, rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, err
	}
	// rootfs.Open hands us an *os.File; keep a plain fd and let the File go.
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	return fd, err
}

// mkdirAll resolves the directory rel in-root, creating missing components
// (root-owned, 0755, as container runtimes do for parents a layer does not
// list), and returns an O_PATH fd to it. A non-directory in the way is
// ErrInvalid: a layer cannot put a file under a file.
func (t *tree) mkdirAll(rel string) (int, error) {
	fd, err := t.openDir(rel)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		if err != nil {
			return -1, badEntry(rel, "parent is not a directory: %v", err)
		}
		return fd, nil
	}
	// Walk down, resolving each prefix in-root again, so a symlink among
	// the components is followed the same way the kernel would inside.
	pfd, err := t.openDir(".")
	if err != nil {
		return -1, err
	}
	parts := strings.Split(rel, "/")
	for i, name := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		fd, err := t.openDir(prefix)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(pfd, name, 0o755); err == nil || err == unix.EEXIST {
				fd, err = t.openDir(prefix)
			}
		}
		unix.Close(pfd)
		if err != nil {
			return -1, badEntry(prefix, "cannot make parent directory: %v", err)
		}
		pfd = fd
	}
	return pfd, nil
}

// removeAll removes name in dirfd and, for a directory, everything below
// it, without following any symlink. A missing name is not an error.
func removeAll(dirfd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dirfd, name, 0)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	for {
		names, err := d.Readdirnames(1024)
		for _, n := range names {
			if err := removeAll(fd, n); err != nil {
				return err
			}
		}
		if err != nil || len(names) == 0 {
			break
		}
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// listDir returns the names in the directory name of dirfd, unsorted.
func listDir(dirfd int, name string) ([]string, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	return d.Readdirnames(-1)
}

// procPath names the entry name in the directory behind dirfd through
// /proc/self/fd, for the few syscalls that have no *at form (lsetxattr).
// The magic link resolves to exactly that directory.
func procPath(dirfd int, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
}

// setXattrs sets xattrs on name in dirfd without following a symlink.
func setXattrs(dirfd int, name string, xattrs map[string]string) error {
	if len(xattrs) == 0 {
		return nil
	}
	p := procPath(dirfd, name)
	for k, v := range xattrs {
		if err := unix.Lsetxattr(p, k, []byte(v), 0); err != nil {
			return &os.PathError{Op: "setxattr " + k, Path: name, Err: err}
		}
	}
	return nil
}

// getXattrs reads every xattr of the file at p (not following a symlink).
func getXattrs(p string) (map[string]string, error) {
	size, err := unix.Llistxattr(p, nil)
	if err != nil || size == 0 {
		if err == unix.ENOTSUP {
			err = nil
		}
		return nil, err
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, k := range strings.Split(strings.TrimRight(string(buf[:size]), "\x00"), "\x00") {
		if k == "" {
			continue
		}
		n, err := unix.Lgetxattr(p, k, nil)
		if err != nil {
			return nil, err
		}
		v := make([]byte, n)
		if n > 0 {
			if n, err = unix.Lgetxattr(p, k, v); err != nil {
				return nil, err
			}
		}
		out[k] = string(v[:n])
	}
	return out, nil
}

// depth is the number of components in a clean relative path.
func depth(rel string) int {
	if rel == "." {
		return 0
	}
	return strings.Count(rel, "/") + 1
}

// ancestors calls f with rel and each of its parents up to the top
// (excluded), deepest first, and stops when f returns false.
func ancestors(rel string, f func(string) bool) {
	for p := rel; p != "." && p != "/" && p != ""; p = path.Dir(p) {
		if !f(p) {
			return
		}
	}
}
