package rootfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// maxRetries bounds retries of openat2 on EAGAIN, which RESOLVE_IN_ROOT
// returns when a concurrent rename could have made ".." resolution unsafe.
const maxRetries = 64

// dirRoot is an open sandbox root. Every lookup starts from its O_PATH fd
// with RESOLVE_IN_ROOT, so ".." and absolute symlinks stop at it.
type dirRoot struct {
	fd int
}

func openRoot(dir string) (*dirRoot, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		// The host path of the root is not the caller's business: name it
		// "/" so errors never leak host layout into API responses.
		return nil, wrap("open root", "/", err)
	}
	return &dirRoot{fd: fd}, nil
}

func (r *dirRoot) close() { unix.Close(r.fd) }

// clean turns a sandbox path (absolute or relative to "/") into the
// lexically cleaned form relative to the root: "." for the root itself.
// Lexical cleaning means "a/link/.." is "a" whatever link points to, the way
// users (and path.Join) read it; it cannot escape either way, because the
// kernel resolves what is left in-root.
func clean(p string) string {
	c := path.Clean("/" + p)
	if c == "/" {
		return "."
	}
	return c[1:]
}

// display is how rel appears in errors: the sandbox path.
func display(rel string) string {
	if rel == "." {
		return "/"
	}
	return "/" + rel
}

// resolve opens rel inside the root with flags. Symlinks in every component,
// including the last unless flags has O_NOFOLLOW, are resolved as if the root
// were "/"; magic links (/proc/*/fd) are refused.
func (r *dirRoot) resolve(rel string, flags int) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(r.fd, rel, &how)
		if (err == unix.EAGAIN || err == unix.EINTR) && i < maxRetries {
			continue
		}
		if err == unix.ENOSYS {
			return -1, errdefs.Unavailable("rootfs: openat2(2) is not supported by this kernel (needs Linux 5.6)")
		}
		return fd, err
	}
}

// stat resolves rel in-root, following a final symlink, and returns an
// O_PATH fd pinning the inode with its stat.
func (r *dirRoot) stat(rel string) (int, *unix.Stat_t, error) {
	fd, err := r.resolve(rel, unix.O_PATH)
	if err != nil {
		return -1, nil, wrap("stat", display(rel), err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nil, wrap("stat", display(rel), err)
	}
	return fd, &st, nil
}

// openRegular opens the regular file rel (following a final symlink
// in-root) for reading; anything else is ErrInvalid and is never opened.
func (r *dirRoot) openRegular(rel string) (*os.File, error) {
	fd, st, err := r.stat(rel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if !isReg(st) {
		return nil, invalid("read", display(rel), describe(st))
	}
	f, err := reopen(fd, unix.O_RDONLY)
	if err != nil {
		return nil, wrap("read", display(rel), err)
	}
	return f, nil
}

// parent resolves the directory holding rel and returns an O_PATH fd to it
// with rel's final component. With create, missing directories are made.
// Operations on the result use only that single name with *at syscalls and
// never follow it, so a symlink there cannot redirect them.
func (r *dirRoot) parent(rel string, create bool) (int, string, error) {
	if rel == "." {
		return -1, "", invalid("write", "/", "is the root directory")
	}
	dir, name := path.Dir(rel), path.Base(rel)
	if create {
		fd, err := r.mkdirAll(dir)
		return fd, name, err
	}
	fd, err := r.resolve(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", wrap("open", display(dir), err)
	}
	return fd, name, nil
}

// mkdirAll resolves rel as a directory, creating missing components with
// mode 0755, and returns an O_PATH fd to it.
func (r *dirRoot) mkdirAll(rel string) (int, error) {
	fd, err := r.resolve(rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != unix.ENOENT {
		if err != nil {
			return -1, wrap("mkdir", display(rel), err)
		}
		return fd, nil
	}
	// Slow path: walk down from the root. Each prefix is re-resolved from
	// the root, so a component swapped for a symlink meanwhile still
	// resolves in-root.
	pfd, err := unix.Dup(r.fd)
	if err != nil {
		return -1, wrap("mkdir", display(rel), err)
	}
	parts := strings.Split(rel, "/")
	for i, name := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		fd, err := r.resolve(prefix, unix.O_PATH|unix.O_DIRECTORY)
		if err == unix.ENOENT {
			if err = mkdirAt(pfd, name, 0o755); err == nil || err == unix.EEXIST {
				fd, err = r.resolve(prefix, unix.O_PATH|unix.O_DIRECTORY)
			}
		}
		unix.Close(pfd)
		if err != nil {
			return -1, wrap("mkdir", display(prefix), err)
		}
		pfd = fd
	}
	return pfd, nil
}

// mkdirAt makes directory name in dirfd with exactly mode (not masked by
// umask).
func mkdirAt(dirfd int, name string, mode uint32) error {
	if err := unix.Mkdirat(dirfd, name, 0o700); err != nil {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, mode)
}

// replace atomically puts a new entry at name in dirfd: create makes it under
// a fresh temporary name, then renameat swaps it in. A reader sees the old
// entry or the new one, never a partial file; a symlink at name is replaced,
// not followed. Replacing a directory fails (EISDIR).
func replace(dirfd int, name string, create func(tmp string) error) error {
	tmp, err := tempName()
	if err != nil {
		return err
	}
	if err := create(tmp); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return err
	}
	err = unix.Renameat(dirfd, tmp, dirfd, name)
	// Also after success: renaming a hard link onto another link of the
	// same inode is a no-op that leaves tmp behind.
	unix.Unlinkat(dirfd, tmp, 0)
	return err
}

func tempName() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return ".warren-tmp-" + hex.EncodeToString(b[:]), nil
}

// reopen opens the inode behind an O_PATH fd for I/O. Going through
// /proc/self/fd opens exactly that inode, so nothing in the sandbox can swap
// it between our fstat and the open, and we never open a device or fifo by
// accident (we check the type on the O_PATH fd first).
func reopen(fd int, flags int) (*os.File, error) {
	p := "/proc/self/fd/" + strconv.Itoa(fd)
	nfd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil, errdefs.Unavailable("rootfs: reopen needs /proc mounted on the host")
	}
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(nfd), p), nil
}

// pathError is an error about one sandbox path. It unwraps to the errno (or
// cause) and to its errdefs kind, so both errors.Is(err, unix.ENOENT) and
// errors.Is(err, errdefs.ErrNotFound) hold.
type pathError struct {
	op, path string
	err      error
	kind     error // an errdefs sentinel, or nil when unclassified
}

func (e *pathError) Error() string { return "rootfs: " + e.op + " " + e.path + ": " + e.err.Error() }

func (e *pathError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.err, e.kind}
}

// wrap classifies a syscall error about path. Errors already classified
// (such as ErrUnavailable from resolve) are returned unchanged.
func wrap(op, p string, err error) error {
	var pe *pathError
	var ee *errdefs.Error
	if errors.As(err, &pe) || errors.As(err, &ee) {
		return err
	}
	return &pathError{op: op, path: p, err: err, kind: kindOf(err)}
}

func invalid(op, p, msg string) error {
	return &pathError{op: op, path: p, err: errors.New(msg), kind: errdefs.ErrInvalid}
}

func kindOf(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errdefs.ErrInvalid // a truncated upload or archive
	}
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return nil
	}
	switch errno {
	case unix.ENOENT:
		return errdefs.ErrNotFound
	case unix.ENOTDIR, unix.EISDIR, unix.ELOOP, unix.EXDEV, unix.EINVAL,
		unix.ENAMETOOLONG, unix.EEXIST, unix.ENOTEMPTY:
		// A wrong file type, a symlink loop or a bad name: the request does
		// not fit what is in the sandbox.
		return errdefs.ErrInvalid
	}
	return nil
}

// perm is the permission bits of st, with setuid, setgid and sticky.
func perm(st *unix.Stat_t) uint32 { return st.Mode & 0o7777 }

func isDir(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }
func isReg(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFREG }
