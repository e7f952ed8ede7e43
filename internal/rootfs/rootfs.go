// Package rootfs reads and writes files inside a sandbox's root filesystem
// from the host, resolving every path strictly inside the root (openat2 with
// RESOLVE_IN_ROOT): absolute and relative symlinks planted in the sandbox are
// resolved as if root were "/", so they can never make the host read or write
// outside it. Backends whose root is visible on the host (container, fake)
// implement backend.Files with it.
//
// The sandbox may be running while we work, so nothing here resolves a path
// string twice and trusts the answer: parents are resolved once to an fd,
// the final component is created or changed with *at syscalls on that fd
// without following it, and files are read through the fd that was checked.
//
// Rules every function follows:
//
//   - Paths are sandbox paths. Relative ones are taken from "/", and they are
//     cleaned lexically first ("a/link/.." is "a").
//   - Reading (Stat, ReadFile, ReadTar's top path) follows a final symlink,
//     in-root, like stat(2) inside the sandbox would.
//   - Writing never follows a final symlink: WriteFile and WriteTar replace
//     the symlink itself (the entry is swapped in with renameat), so its
//     target, in-root or not, is never touched.
//   - Errors wrap errdefs.ErrNotFound for a missing path and
//     errdefs.ErrInvalid for a wrong file type, a symlink loop or a refused
//     tar entry; messages name the sandbox path, never the host path.
//
// Everything works unprivileged except setting owners, which is done only
// when running as root (as tar(1) does).
package rootfs

import (
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
)

// Open resolves path inside root and opens the existing entry there with
// flags (unix.O_*; O_CLOEXEC is added). A final symlink is followed in-root
// unless flags has O_NOFOLLOW. Use O_PATH for anything that may not be a
// regular file or a directory: opening a fifo for reading blocks. Creating
// (O_CREAT, O_TMPFILE) is ErrInvalid: use WriteFile or WriteTar.
func Open(root, path string, flags int) (*os.File, error) {
	if flags&unix.O_CREAT != 0 || flags&unix.O_TMPFILE == unix.O_TMPFILE {
		return nil, invalid("open", display(clean(path)), "Open does not create files")
	}
	rt, err := openRoot(root)
	if err != nil {
		return nil, err
	}
	defer rt.close()
	rel := clean(path)
	fd, err := rt.resolve(rel, flags)
	if err != nil {
		return nil, wrap("open", display(rel), err)
	}
	return os.NewFile(uintptr(fd), display(rel)), nil
}

// Stat describes path inside root. ErrNotFound if it does not exist.
func Stat(root, path string) (backend.FileInfo, error) {
	rt, err := openRoot(root)
	if err != nil {
		return backend.FileInfo{}, err
	}
	defer rt.close()
	fd, st, err := rt.stat(clean(path))
	if err != nil {
		return backend.FileInfo{}, err
	}
	unix.Close(fd)
	return backend.FileInfo{Size: st.Size, Mode: perm(st), IsDir: isDir(st)}, nil
}

// WriteFile creates or replaces the regular file path inside root, creating
// missing parent directories (mode 0755), and copies r into it. The new
// content appears atomically: it is written to a temporary file in the same
// directory and renamed over path, so a reader sees the old file or the
// complete new one, and a failed copy leaves the old file as it was. A
// symlink at path is replaced, not followed; a directory there is
// ErrInvalid. When replacing a regular file as root, its owner is kept (a
// hard link to the old file keeps the old content). mode is applied exactly,
// whatever the umask. There is no fsync: this is about readers, not crashes.
func WriteFile(root, path string, mode uint32, r io.Reader) error {
	rt, err := openRoot(root)
	if err != nil {
		return err
	}
	defer rt.close()
	rel := clean(path)
	dfd, name, err := rt.parent(rel, true)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	a := attrs{mode: mode & 0o7777, uid: -1, gid: -1}
	if canChown() {
		var st unix.Stat_t
		if unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && isReg(&st) {
			a.uid, a.gid = int(st.Uid), int(st.Gid)
		}
	}
	err = replace(dfd, name, func(tmp string) error { return createFile(dfd, tmp, r, a) })
	if err != nil {
		return wrap("write", display(rel), err)
	}
	return nil
}

// ReadFile copies the regular file path inside root to w, streaming.
// ErrNotFound if missing, ErrInvalid if it is not a regular file.
func ReadFile(root, path string, w io.Writer) error {
	rt, err := openRoot(root)
	if err != nil {
		return err
	}
	defer rt.close()
	rel := clean(path)
	f, err := rt.openRegular(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(w, f); err != nil {
		return wrap("read", display(rel), err)
	}
	return nil
}

// canChown reports whether we may give files away to other owners.
func canChown() bool { return os.Geteuid() == 0 }

// describe says what kind of non-regular file st is, for errors.
func describe(st *unix.Stat_t) string {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "is a directory"
	case unix.S_IFLNK:
		return "is a symlink"
	case unix.S_IFIFO:
		return "is a fifo"
	case unix.S_IFSOCK:
		return "is a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "is a device"
	}
	return "is not a regular file"
}
