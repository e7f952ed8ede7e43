package rootfs

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Strip takes path p out of a snapshot: upper is a copy of a sandbox's
// overlayfs upper directory, lowers the read-only layers under it (top
// first). Whatever upper holds at p goes, with everything under it; where
// a lower layer has p, a whiteout takes its place, so the stacked result
// has no p at all (missing directories on the way are made with their
// lower layer's owner, mode and times, as overlayfs would copy them up).
//
// p is taken literally: a path that passes through a symlink, in upper or
// in a lower layer, is refused (ErrInvalid), since what it names would
// depend on where the link points; name the path it points to instead.
// Nothing is ever followed, so a tree a sandbox wrote cannot lead Strip
// outside upper.
func Strip(upper string, lowers []string, p string) error {
	rel := clean(p)
	if rel == "." {
		return invalid("strip", "/", "is the root directory")
	}
	up, err := openRoot(upper)
	if err != nil {
		return err
	}
	defer up.close()
	dir, name := path.Dir(rel), path.Base(rel)

	// Out of the upper layer.
	switch pfd, err := up.resolveLiteral(dir); {
	case err == nil:
		err = removeAt(pfd, name, rel)
		unix.Close(pfd)
		if err != nil {
			return err
		}
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		// Nothing of it in the upper layer.
	default:
		return err
	}

	// Hidden where a lower layer has it.
	var in string // the topmost lower layer with p
	for _, l := range lowers {
		ok, err := existsLiteral(l, rel)
		if err != nil {
			return err
		}
		if ok {
			in = l
			break
		}
	}
	if in == "" {
		return nil
	}
	pfd, err := up.mkdirAllLike(dir, lowers)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mknodat(pfd, name, unix.S_IFCHR|0o600, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return wrap("strip", display(rel), err)
	}
	return nil
}

// resolveLiteral opens directory rel in-root with no symlink anywhere on
// the way; one there is ErrInvalid. O_PATH.
func (r *dirRoot) resolveLiteral(rel string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(r.fd, rel, &how)
		if (err == unix.EAGAIN || err == unix.EINTR) && i < maxRetries {
			continue
		}
		if err == unix.ELOOP {
			return -1, invalid("strip", display(rel), "passes through a symlink: name the path it points to")
		}
		return fd, err
	}
}

// existsLiteral says whether root has rel, with no symlink on the way to
// it (a final symlink is an entry like any other).
func existsLiteral(root, rel string) (bool, error) {
	r, err := openRoot(root)
	if err != nil {
		return false, err
	}
	defer r.close()
	pfd, err := r.resolveLiteral(path.Dir(rel))
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	err = unix.Fstatat(pfd, path.Base(rel), &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, wrap("strip", display(rel), err)
	}
	// A whiteout in a lower layer (a snapshot's) already hides it.
	return !(st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0), nil
}

// mkdirAllLike opens directory rel in the upper layer, making each missing
// component like the topmost lower layer's directory of that name. O_PATH.
func (r *dirRoot) mkdirAllLike(rel string, lowers []string) (int, error) {
	if rel == "." {
		return unix.Dup(r.fd)
	}
	fd, err := r.resolveLiteral(rel)
	if !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	pfd, err := r.mkdirAllLike(path.Dir(rel), lowers)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	name := path.Base(rel)
	st, err := lowerDir(lowers, rel)
	if err != nil {
		return -1, err
	}
	dfd, err := reopen(pfd, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, wrap("strip", display(rel), err)
	}
	defer dfd.Close()
	d := int(dfd.Fd())
	if err := unix.Mkdirat(d, name, st.Mode&0o7777); err != nil {
		return -1, wrap("strip", display(rel), err)
	}
	if err := unix.Fchownat(d, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, wrap("strip", display(rel), err)
	}
	if err := unix.Fchmodat(d, name, st.Mode&0o7777, 0); err != nil { // past the umask
		return -1, wrap("strip", display(rel), err)
	}
	if err := unix.UtimesNanoAt(d, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, wrap("strip", display(rel), err)
	}
	return r.resolveLiteral(rel)
}

// lowerDir stats directory rel in the topmost lower layer that has it.
func lowerDir(lowers []string, rel string) (*unix.Stat_t, error) {
	for _, l := range lowers {
		r, err := openRoot(l)
		if err != nil {
			return nil, err
		}
		fd, err := r.resolveLiteral(rel)
		r.close()
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil {
			return nil, wrap("strip", display(rel), err)
		}
		return &st, nil
	}
	return nil, invalid("strip", display(rel), "is in no layer")
}

// removeAt removes name in the directory dirfd (an O_PATH fd) with
// everything under it, never following a symlink. Missing is fine.
func removeAt(dirfd int, name, rel string) error {
	d, err := reopen(dirfd, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return wrap("strip", display(rel), err)
	}
	defer d.Close()
	return removeIn(int(d.Fd()), name, rel)
}

func removeIn(dfd int, name, rel string) error {
	err := unix.Unlinkat(dfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return wrap("strip", display(rel), err)
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return wrap("strip", display(rel), err)
	}
	names, err := readNames(fd)
	if err == nil {
		for _, n := range names {
			if err = removeIn(fd, n, rel+"/"+n); err != nil {
				break
			}
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return wrap("strip", display(rel), err)
	}
	return nil
}

// readNames lists the directory fd (consuming its offset).
func readNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, fmt.Errorf("read directory: %w", err)
		}
		if n == 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// CleanStripPath checks p as a path to strip from a snapshot and returns
// it cleaned: absolute, not the root, no NUL. ErrInvalid otherwise.
func CleanStripPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return "", invalid("strip", p, "is not an absolute path")
	}
	c := path.Clean(p)
	if c == "/" {
		return "", invalid("strip", p, "is the root directory")
	}
	return c, nil
}
