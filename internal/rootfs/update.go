package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// A Copy is a tree copied while its source may still change, brought up
// to date later by copying only what changed (Update): how a snapshot of
// a running sandbox keeps it frozen only for the difference. The first
// pass (StartCopy) runs while the sandbox runs; Update runs while it is
// frozen and costs a walk of the tree (a stat per entry) plus what
// changed since the first pass began.
//
// What changed is told by each entry's inode and ctime, which the kernel
// sets on every change to its data or metadata and no process can set:
// an entry the same in both walks is the same. Timestamps are coarse (a
// tick), so an entry whose ctime is within racyWindow of the first
// pass's start counts as changed whatever it says (as git treats a
// "racily clean" entry).
type Copy struct {
	src, dst string
	start    time.Time
	c        *copier
}

// racyWindow covers the coarse clock that stamps ctimes (a jiffy, at most
// 10 ms) with room to spare.
const racyWindow = 50 * time.Millisecond

// srcEntry is an entry of the source as a pass saw it.
type srcEntry struct {
	dev, ino uint64
	ctime    unix.Timespec
	size     int64
	mode     uint32
}

// StartCopy copies src to dst (which must not exist) as CopyTree does,
// while src may change: entries that change under it are copied by
// Update instead.
func StartCopy(src, dst string) (*Copy, CopyStats, error) {
	cp := &Copy{src: src, dst: dst, start: time.Now()}
	var err error
	cp.c, err = copyTree(src, dst, func(c *copier) {
		c.seen = map[string]srcEntry{}
		c.tolerant = true
	})
	if err != nil {
		return nil, CopyStats{}, err
	}
	return cp, cp.c.stats, nil
}

// Update brings the copy up to date with src, which must not change
// meanwhile: entries new or changed since StartCopy are copied (again),
// entries gone are removed. Its stats count what it copied.
func (cp *Copy) Update() (CopyStats, error) {
	sfd, err := unix.Open(cp.src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return CopyStats{}, &os.PathError{Op: "open", Path: cp.src, Err: err}
	}
	defer unix.Close(sfd)
	dfd, err := unix.Open(cp.dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return CopyStats{}, &os.PathError{Op: "open", Path: cp.dst, Err: err}
	}
	defer unix.Close(dfd)
	old := cp.c.seen
	u := &copier{root: dfd, links: map[[2]uint64]string{}, reflink: cp.c.reflink, buf: cp.c.buf}
	// Hard links to an unchanged inode stay links to its unchanged copy.
	for rel, e := range old {
		if e.mode&unix.S_IFMT != unix.S_IFDIR {
			u.links[[2]uint64{e.dev, e.ino}] = rel
		}
	}
	up := &updater{u: u, old: old, racy: unix.NsecToTimespec(cp.start.Add(-racyWindow).UnixNano()), fresh: map[[2]uint64]bool{}}
	if err := up.dir(sfd, dfd, "."); err != nil {
		return u.stats, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return u.stats, err
	}
	if err := clearXattrs(dfd); err != nil {
		return u.stats, err
	}
	return u.stats, u.meta(sfd, dfd, ".", &st)
}

type updater struct {
	u     *copier
	old   map[string]srcEntry
	racy  unix.Timespec      // ctimes from this on count as changed
	fresh map[[2]uint64]bool // files with several names copied this pass
}

// same says whether the entry at rel, now st, is as the first pass saw it.
func (up *updater) same(rel string, st *unix.Stat_t) bool {
	e, ok := up.old[rel]
	return ok && e.dev == st.Dev && e.ino == st.Ino && e.ctime == st.Ctim && e.size == st.Size && e.mode == st.Mode &&
		(st.Ctim.Sec < up.racy.Sec || st.Ctim.Sec == up.racy.Sec && st.Ctim.Nsec < up.racy.Nsec)
}

// dir brings the copy of directory rel (dfd) up to date with sfd.
func (up *updater) dir(sfd, dfd int, rel string) error {
	names, err := readNames(sfd)
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	present := make(map[string]bool, len(names))
	for _, name := range names {
		present[name] = true
		r := filepath.Join(rel, name)
		var st unix.Stat_t
		if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("copy %s: %w", r, err)
		}
		e, had := up.old[r]
		if st.Mode&unix.S_IFMT == unix.S_IFDIR && had && e.mode&unix.S_IFMT == unix.S_IFDIR && e.ino == st.Ino {
			// The same directory: its entries, then its own metadata.
			if err := up.subdir(sfd, dfd, name, r, &st); err != nil {
				return err
			}
			continue
		}
		if up.same(r, &st) {
			continue
		}
		if err := removeIn(dfd, name, r); err != nil {
			return err
		}
		key := [2]uint64{st.Dev, st.Ino}
		multi := st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1
		if multi && !up.fresh[key] {
			// A changed file: its first name this pass is copied anew,
			// its others link to that copy, not to a stale one.
			delete(up.u.links, key)
		}
		if err := up.u.entry(sfd, dfd, name, r); err != nil {
			return err
		}
		if multi {
			up.fresh[key] = true
		}
	}
	// Entries of the copy the source no longer has.
	dnames, err := readNames(dfd)
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	for _, name := range dnames {
		if !present[name] {
			if err := removeIn(dfd, name, filepath.Join(rel, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (up *updater) subdir(sfd, dfd int, name, rel string, st *unix.Stat_t) error {
	s, d, err := openDirs(sfd, dfd, name, rel)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	defer unix.Close(d)
	if err := up.dir(s, d, rel); err != nil {
		return err
	}
	// Its metadata again, whatever changed: its entries changing changed
	// its mtime in the copy, and an xattr (overlayfs's opaque mark) may
	// have come or gone.
	if err := clearXattrs(d); err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	return up.u.meta(s, d, rel, st)
}

// clearXattrs removes every xattr of the open file fd.
func clearXattrs(fd int) error {
	size, err := unix.Flistxattr(fd, nil)
	if errors.Is(err, unix.ENOTSUP) || size == 0 {
		return nil
	}
	if err != nil {
		return err
	}
	list := make([]byte, size)
	if size, err = unix.Flistxattr(fd, list); err != nil {
		return err
	}
	for _, name := range splitNul(list[:size]) {
		if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return err
		}
	}
	return nil
}
