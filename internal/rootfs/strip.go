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
// the layers below would still show p, a whiteout takes its place, so the
// stacked result has no p at all. What the layers show follows overlayfs:
// the topmost layer with an entry decides it, a whiteout or a file hides
// the layers below, and an opaque directory hides theirs. Missing parent
// directories in upper are made with the owner and mode of the directory
// the layers show there (overlayfs's copy-up does the same; like its, their
// mtimes are then those of the entries made in them).
//
// p is taken literally: a path that passes through a symlink, in upper or
// in the layer that decides a component, is refused (ErrInvalid), since
// what it names would depend on where the link points; name the path it
// points to instead. Nothing is ever followed, so a tree a sandbox wrote
// cannot lead Strip outside upper.
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
	comps := strings.Split(rel, "/")

	// Upper: the parent directories as far as it has them.
	pfd, depth, hidden, err := up.walkDirs(comps[:len(comps)-1])
	if err != nil {
		return err
	}
	if pfd >= 0 {
		defer unix.Close(pfd)
	}
	if depth == len(comps)-1 { // upper has the parent: out of it
		if err := removeAt(pfd, comps[len(comps)-1], rel); err != nil {
			return err
		}
	}
	if hidden {
		return nil // a whiteout, a file or an opaque directory of upper's hides the lowers' p
	}
	// The lowers: does their stack show p, and which directories on
	// the way?
	dirs, shown, err := lowerView(lowers, comps)
	if err != nil || !shown {
		return err
	}
	wfd, err := up.mkdirsLike(comps[:len(comps)-1], depth, pfd, dirs)
	if err != nil {
		return err
	}
	defer unix.Close(wfd)
	if err := unix.Mknodat(wfd, comps[len(comps)-1], unix.S_IFCHR|0o600, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return wrap("strip", display(rel), err)
	}
	return nil
}

// walkDirs follows the directories comps from the root as far as they
// exist, never through a symlink (ErrInvalid). It returns an O_PATH fd of
// the deepest one reached (the root's when none is) and how many it
// reached; hidden if it stopped at an entry that hides the lowers' (a
// whiteout or any other non-directory) or reached an opaque directory.
func (r *dirRoot) walkDirs(comps []string) (fd, depth int, hidden bool, err error) {
	fd, err = unix.Dup(r.fd)
	if err != nil {
		return -1, 0, false, err
	}
	for i, c := range comps {
		var st unix.Stat_t
		err := unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case errors.Is(err, unix.ENOENT):
			return fd, i, false, nil
		case err != nil:
			unix.Close(fd)
			return -1, 0, false, wrap("strip", display(strings.Join(comps[:i+1], "/")), err)
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			unix.Close(fd)
			return -1, 0, false, invalid("strip", display(strings.Join(comps[:i+1], "/")), "is a symlink: name the path it points to")
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			return fd, i, true, nil
		}
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, 0, false, wrap("strip", display(strings.Join(comps[:i+1], "/")), err)
		}
		fd = next
		if opaque(fd) {
			return fd, i + 1, true, nil
		}
	}
	return fd, len(comps), false, nil
}

// opaque says whether the directory fd (O_PATH) is marked opaque.
func opaque(fd int) bool {
	for _, name := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		var b [1]byte
		// Through the magic link to the directory (an O_PATH fd has no
		// fgetxattr).
		if n, err := unix.Getxattr(procFd(fd), name, b[:]); err == nil && n == 1 && b[0] == 'y' {
			return true
		}
	}
	return false
}

// lowerView resolves comps through the stack of lowers (top first) as
// overlayfs would, and says whether the stack shows comps' path, with the
// stat of each parent directory as it shows it (from the topmost layer
// that has it).
func lowerView(lowers []string, comps []string) (dirs []unix.Stat_t, shown bool, err error) {
	roots := make([]int, 0, len(lowers)) // the layers still merged at this depth: their dirs
	defer func() {
		for _, fd := range roots {
			unix.Close(fd)
		}
	}()
	for _, l := range lowers {
		fd, err := unix.Open(l, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, false, wrap("strip", "/", err)
		}
		roots = append(roots, fd)
	}
	for i, c := range comps {
		last := i == len(comps)-1
		var next []int
		decided := false
		for _, fd := range roots {
			var st unix.Stat_t
			err := unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				return nil, false, wrap("strip", display(strings.Join(comps[:i+1], "/")), err)
			}
			typ := st.Mode & unix.S_IFMT
			if !decided {
				decided = true
				if typ == unix.S_IFCHR && st.Rdev == 0 {
					return nil, false, nil // a whiteout: hidden
				}
				if last {
					return dirs, true, nil
				}
				if typ == unix.S_IFLNK {
					return nil, false, invalid("strip", display(strings.Join(comps[:i+1], "/")), "is a symlink: name the path it points to")
				}
				if typ != unix.S_IFDIR {
					return nil, false, nil // a file: nothing below it
				}
				dirs = append(dirs, st)
			} else if typ != unix.S_IFDIR {
				break // a lower layer's file or whiteout ends the merge
			}
			d, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, false, wrap("strip", display(strings.Join(comps[:i+1], "/")), err)
			}
			next = append(next, d)
			if opaque(d) {
				break // the layers below do not merge in
			}
		}
		for _, fd := range roots {
			unix.Close(fd)
		}
		roots = next
		if !decided {
			return nil, false, nil // in no layer
		}
	}
	return dirs, true, nil
}

// mkdirsLike makes the parent directories comps in upper from depth on
// (pfd is the one at depth), each like the lowers' (dirs), and returns an
// O_PATH fd of the last.
func (r *dirRoot) mkdirsLike(comps []string, depth, pfd int, dirs []unix.Stat_t) (int, error) {
	fd, err := unix.Dup(pfd)
	if err != nil {
		return -1, err
	}
	for i := depth; i < len(comps); i++ {
		st := dirs[i]
		rel := strings.Join(comps[:i+1], "/")
		d, err := reopen(fd, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			unix.Close(fd)
			return -1, wrap("strip", display(rel), err)
		}
		dfd := int(d.Fd())
		err = unix.Mkdirat(dfd, comps[i], st.Mode&0o7777)
		if err == nil {
			err = unix.Fchownat(dfd, comps[i], int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
		}
		if err == nil {
			err = unix.Fchmodat(dfd, comps[i], st.Mode&0o7777, 0) // past the umask, after chown's clearing
		}
		if err == nil {
			err = unix.UtimesNanoAt(dfd, comps[i], []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
		}
		var next int
		if err == nil {
			next, err = unix.Openat(dfd, comps[i], unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		d.Close()
		unix.Close(fd)
		if err != nil {
			return -1, wrap("strip", display(rel), err)
		}
		fd = next
	}
	return fd, nil
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
