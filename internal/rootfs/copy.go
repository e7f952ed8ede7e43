package rootfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// CopyStats says what CopyTree copied.
type CopyStats struct {
	Files   int   // entries of every kind, directories included
	Bytes   int64 // data bytes of regular files, holes excluded
	Reflink bool  // regular files were cloned (FICLONE), not copied
}

// CopyTree copies the tree at src to dst (which must not exist) as it is
// on disk, for a snapshot of a sandbox's writable layer: owners, modes
// (setuid bits and all), mtimes and atimes, every xattr (overlayfs's
// trusted.overlay.* among them), hard links as hard links, symlinks as
// symlinks, holes as holes, and character device 0/0 (an overlayfs
// whiteout) as itself; fifos and sockets are recreated. Any other device
// node is refused (ErrInvalid): no sandbox can make one, and none goes
// into a layer. Nothing is followed: src is walked by descriptor, never
// through a symlink, so a tree a sandbox wrote cannot lead the copy
// elsewhere.
//
// Regular files are cloned where the filesystem can (FICLONE: btrfs, xfs
// with reflink, shared blocks, no data copied), else copied extent by
// extent (SEEK_DATA/SEEK_HOLE, copy_file_range). It runs as root (owners).
func CopyTree(src, dst string) (CopyStats, error) {
	c, err := copyTree(src, dst, nil)
	if err != nil {
		return CopyStats{}, err
	}
	return c.stats, nil
}

// copyTree is CopyTree with the copier set up by opt.
func copyTree(src, dst string, opt func(*copier)) (*copier, error) {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: src, Err: err}
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: src, Err: err}
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return nil, err
	}
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dst, Err: err}
	}
	defer unix.Close(dfd)
	c := &copier{root: dfd, links: map[[2]uint64]string{}, reflink: true, buf: make([]byte, 1<<20)}
	if opt != nil {
		opt(c)
	}
	if err := c.dir(sfd, dfd, "."); err != nil {
		return c, err
	}
	if err := c.meta(sfd, dfd, ".", &st); err != nil {
		return c, err
	}
	c.stats.Files++
	c.stats.Reflink = c.reflink && c.cloned
	return c, nil
}

type copier struct {
	root  int // dst, which links name from
	stats CopyStats
	// seen, when set, records every source entry copied (Copy.Update
	// compares against it); tolerant skips entries that fail to copy (the
	// source changed under a copy made while it runs: Update copies them).
	seen     map[string]srcEntry
	tolerant bool
	links    map[[2]uint64]string // (dev, ino) of a multiply-linked file -> its first copy, relative
	reflink  bool                 // still worth trying FICLONE
	cloned   bool                 // a file was cloned
	buf      []byte
}

// dir copies the entries of the directory sfd into dfd (rel names it, for
// errors and hard links).
func (c *copier) dir(sfd, dfd int, rel string) error {
	// Not an os.File: its finalizer would close sfd, the caller's, at
	// some later GC, and with it whatever reused the number.
	names, err := readNames(sfd)
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	for _, name := range names {
		r := filepath.Join(rel, name)
		if err := c.entry(sfd, dfd, name, r); err != nil {
			if !c.tolerant {
				return err
			}
			delete(c.seen, r) // Update copies it anew
			removeIn(dfd, name, r)
		}
	}
	return nil
}

func (c *copier) entry(sfd, dfd int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	c.stats.Files++
	if c.seen != nil {
		c.seen[rel] = srcEntry{dev: st.Dev, ino: st.Ino, ctime: st.Ctim, size: st.Size, mode: st.Mode}
	}
	typ := st.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := c.links[key]; ok {
			if err := unix.Linkat(c.root, first, c.root, rel, 0); err != nil {
				return fmt.Errorf("copy %s: link to %s: %w", rel, first, err)
			}
			return nil
		}
		c.links[key] = rel
	}
	switch typ {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return fmt.Errorf("copy %s: %w", rel, err)
		}
		s, d, err := openDirs(sfd, dfd, name, rel)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		defer unix.Close(d)
		if err := c.dir(s, d, rel); err != nil {
			return err
		}
		return c.meta(s, d, rel, &st) // after its entries: they change its mtime
	case unix.S_IFREG:
		return c.file(sfd, dfd, name, rel, &st)
	case unix.S_IFLNK:
		target, err := readlinkat(sfd, name)
		if err != nil {
			return fmt.Errorf("copy %s: %w", rel, err)
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return fmt.Errorf("copy %s: %w", rel, err)
		}
	case unix.S_IFCHR, unix.S_IFBLK:
		if typ == unix.S_IFBLK || st.Rdev != 0 {
			return invalid("copy", rel, fmt.Sprintf("a device node (%d:%d), not an overlay whiteout", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
		}
		if err := unix.Mknodat(dfd, name, unix.S_IFCHR|0o600, 0); err != nil {
			return fmt.Errorf("copy %s: %w", rel, err)
		}
	case unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknodat(dfd, name, typ|0o600, 0); err != nil {
			return fmt.Errorf("copy %s: %w", rel, err)
		}
	default:
		return invalid("copy", rel, fmt.Sprintf("unknown file type %o", typ))
	}
	return c.metaAt(sfd, dfd, name, rel, &st)
}

// openDirs opens the directory name in the source directory sfd and in
// the copy's dfd, following no symlink.
func openDirs(sfd, dfd int, name, rel string) (s, d int, err error) {
	s, err = unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("copy %s: %w", rel, err)
	}
	d, err = unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(s)
		return -1, -1, fmt.Errorf("copy %s: %w", rel, err)
	}
	return s, d, nil
}

// CopyFile copies the regular file src to dst (which must not exist) as
// CopyTree copies each file: a clone where the filesystem shares blocks
// (then reflink is true), else its data extents, holes left as holes.
func CopyFile(src, dst string) (reflink bool, err error) {
	c := &copier{reflink: true, buf: make([]byte, 1<<20)}
	var st unix.Stat_t
	if err := unix.Stat(src, &st); err != nil {
		return false, fmt.Errorf("copy %s: %w", src, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, fmt.Errorf("copy %s: not a regular file", src)
	}
	sd, err := unix.Open(filepath.Dir(src), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(sd)
	dd, err := unix.Open(filepath.Dir(dst), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(dd)
	if filepath.Base(src) != filepath.Base(dst) {
		return false, fmt.Errorf("copy %s to %s: CopyFile keeps the name", src, dst)
	}
	err = c.file(sd, dd, filepath.Base(src), filepath.Base(src), &st)
	return c.cloned, err
}

// file copies a regular file: a clone where the filesystem shares
// blocks, else its data extents, leaving holes as holes.
func (c *copier) file(sfd, dfd int, name, rel string, st *unix.Stat_t) error {
	s, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	defer unix.Close(s)
	d, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	defer unix.Close(d)
	if c.reflink {
		if err := unix.IoctlFileClone(d, s); err == nil {
			c.cloned = true
			c.stats.Bytes += st.Blocks * 512
			return c.meta(s, d, rel, st)
		}
		c.reflink = false // one refusal: this filesystem (pair) does not clone
	}
	if err := c.extents(s, d, st.Size); err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	return c.meta(s, d, rel, st)
}

// extents copies the data of s to d extent by extent, then sets d's size
// (a trailing hole).
func (c *copier) extents(s, d int, size int64) error {
	var off int64
	for off < size {
		data, err := unix.Seek(s, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(s, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if err := c.copyRange(s, d, data, hole-data); err != nil {
			return err
		}
		c.stats.Bytes += hole - data
		off = hole
	}
	return unix.Ftruncate(d, size)
}

func (c *copier) copyRange(s, d int, off, n int64) error {
	for n > 0 {
		soff, doff := off, off
		m, err := unix.CopyFileRange(s, &soff, d, &doff, int(min(n, 1<<30)), 0)
		if err != nil || m == 0 {
			// Filesystems or kernels without it: read and write.
			m, err = c.readWrite(s, d, off, min(n, int64(len(c.buf))))
			if err != nil {
				return err
			}
		}
		off += int64(m)
		n -= int64(m)
	}
	return nil
}

func (c *copier) readWrite(s, d int, off, n int64) (int, error) {
	m, err := unix.Pread(s, c.buf[:n], off)
	if err != nil {
		return 0, err
	}
	if m == 0 {
		return 0, io.ErrUnexpectedEOF // the file shrank under us
	}
	if _, err := unix.Pwrite(d, c.buf[:m], off); err != nil {
		return 0, err
	}
	return m, nil
}

// meta gives the open copy d the owner, mode, xattrs and times of s.
// Owner before mode: chown clears setuid bits.
func (c *copier) meta(s, d int, rel string, st *unix.Stat_t) error {
	if err := unix.Fchown(d, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("copy %s: chown: %w", rel, err)
	}
	if err := unix.Fchmod(d, st.Mode&0o7777); err != nil {
		return fmt.Errorf("copy %s: chmod: %w", rel, err)
	}
	if err := copyXattrs(fdXattrs(s), fdXattrs(d), rel); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, procFd(d), ts, 0); err != nil {
		return fmt.Errorf("copy %s: times: %w", rel, err)
	}
	return nil
}

// metaAt is meta for entries that cannot be opened (symlinks, whiteouts,
// fifos, sockets): by name, never following. Symlinks have no mode of
// their own, and user.* xattrs are not allowed on them.
func (c *copier) metaAt(sfd, dfd int, name, rel string, st *unix.Stat_t) error {
	if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("copy %s: chown: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(dfd, name, st.Mode&0o7777, 0); err != nil {
			return fmt.Errorf("copy %s: chmod: %w", rel, err)
		}
	}
	if err := copyXattrs(pathXattrs(atPath(sfd, name)), pathXattrs(atPath(dfd, name)), rel); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("copy %s: times: %w", rel, err)
	}
	return nil
}

// procFd names an open file by its descriptor, for utimensat.
func procFd(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// atPath names dirfd/name for the l*xattr calls: /proc/self/fd/N is the
// directory itself; name, a single component, is not followed.
func atPath(dirfd int, name string) string { return procFd(dirfd) + "/" + name }

// xattrs reads and writes one file's xattrs: by descriptor (an open file
// or directory), or by path without following a final symlink.
type xattrs struct {
	list func(buf []byte) (int, error)
	get  func(name string, buf []byte) (int, error)
	set  func(name string, val []byte) error
}

func fdXattrs(fd int) xattrs {
	return xattrs{
		list: func(buf []byte) (int, error) { return unix.Flistxattr(fd, buf) },
		get:  func(name string, buf []byte) (int, error) { return unix.Fgetxattr(fd, name, buf) },
		set:  func(name string, val []byte) error { return unix.Fsetxattr(fd, name, val, 0) },
	}
}

func pathXattrs(path string) xattrs {
	return xattrs{
		list: func(buf []byte) (int, error) { return unix.Llistxattr(path, buf) },
		get:  func(name string, buf []byte) (int, error) { return unix.Lgetxattr(path, name, buf) },
		set:  func(name string, val []byte) error { return unix.Lsetxattr(path, name, val, 0) },
	}
}

// copyXattrs copies every xattr of src to dst.
func copyXattrs(src, dst xattrs, rel string) error {
	size, err := src.list(nil)
	if errors.Is(err, unix.ENOTSUP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("copy %s: list xattrs: %w", rel, err)
	}
	if size == 0 {
		return nil
	}
	list := make([]byte, size)
	if size, err = src.list(list); err != nil {
		return fmt.Errorf("copy %s: list xattrs: %w", rel, err)
	}
	var val []byte
	for _, name := range splitNul(list[:size]) {
		n, err := src.get(name, nil)
		if err != nil {
			return fmt.Errorf("copy %s: xattr %s: %w", rel, name, err)
		}
		if cap(val) < n {
			val = make([]byte, n)
		}
		if n, err = src.get(name, val[:n]); err != nil {
			return fmt.Errorf("copy %s: xattr %s: %w", rel, name, err)
		}
		if err := dst.set(name, val[:n]); err != nil {
			return fmt.Errorf("copy %s: xattr %s: %w", rel, name, err)
		}
	}
	return nil
}

func splitNul(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != 0 {
			i++
		}
		if i > 0 {
			out = append(out, string(b[:i]))
		}
		if i < len(b) {
			i++
		}
		b = b[i:]
	}
	return out
}

func readlinkat(dirfd int, name string) (string, error) {
	for n := 256; ; n *= 2 {
		buf := make([]byte, n)
		m, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if m < n {
			return string(buf[:m]), nil
		}
	}
}

// TreeStats is what Scan found in a tree.
type TreeStats struct {
	Files int   // entries, directories included
	Bytes int64 // allocated bytes of regular files (each file once)
	Holes int64 // bytes of regular files' sizes not allocated: holes
	// Sparsest is the regular file with the most holes, relative to
	// the tree, and its holes.
	Sparsest      string
	SparsestHoles int64
}

// Scan walks the tree at dir by descriptor, following nothing, and
// counts what a layer built from it would hold. Like CopyTree it refuses
// (ErrInvalid) any device node but an overlayfs whiteout (character
// device 0/0): whatever made the tree (a btrfs snapshot of a sandbox's
// writable layer), none goes into a layer.
func Scan(dir string) (TreeStats, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return TreeStats{}, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	st := TreeStats{Files: 1}
	return st, scanDir(fd, ".", &st, map[[2]uint64]bool{})
}

// scanDir scans directory fd (rel) into ts; links holds the files with
// several names already counted.
func scanDir(fd int, rel string, ts *TreeStats, links map[[2]uint64]bool) error {
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("scan %s: %w", rel, err)
	}
	for _, name := range names {
		r := filepath.Join(rel, name)
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("scan %s: %w", r, err)
		}
		ts.Files++
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if st.Nlink > 1 { // one file, however many names
				key := [2]uint64{st.Dev, st.Ino}
				if links[key] {
					continue
				}
				links[key] = true
			}
			ts.Bytes += st.Blocks * 512
			if holes := st.Size - st.Blocks*512; holes > 0 {
				ts.Holes += holes
				if holes > ts.SparsestHoles {
					ts.Sparsest, ts.SparsestHoles = r, holes
				}
			}
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				return invalid("scan", r, fmt.Sprintf("a device node (%d:%d), not an overlay whiteout", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
			}
		case unix.S_IFBLK:
			return invalid("scan", r, "a block device node")
		case unix.S_IFDIR:
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("scan %s: %w", r, err)
			}
			err = scanDir(sub, r, ts, links)
			unix.Close(sub)
			if err != nil {
				return err
			}
		}
	}
	return nil
}
