package rootfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// WriteTar extracts the tar stream r under dir inside root, creating dir
// and its parents if needed.
//
// Entry names (and hard link targets) are taken relative to dir and cleaned
// lexically: a leading "/" and any ".." that would climb above dir are
// dropped, so "../../etc/x" and "/etc/x" both land at dir/etc/x. Symlinks
// met while resolving an entry's parent directories, including ones made by
// earlier entries, are followed in-root: an archive can write anywhere in
// the sandbox, as a process inside it could, but never outside it.
//
// Regular files, directories, symlinks (target stored verbatim) and hard
// links are extracted; device nodes, fifos and other types are ErrInvalid,
// as is a hard link to a missing entry or a directory. Extraction stops at
// the first bad entry; entries before it stay. An existing non-directory at
// an entry's name is replaced atomically (a symlink is never followed); an
// existing directory is kept for a directory entry and is ErrInvalid for
// any other. Modes (with setuid, setgid, sticky) and mtimes are applied and,
// when running as root, the numeric uid and gid; user and group names,
// xattrs and ACLs are ignored. Directories get their mode and mtime after
// the last entry, so a read-only directory can still be filled.
func WriteTar(root, dir string, r io.Reader) error { return WriteTarShifted(root, dir, r, 0) }

// WriteTarShifted is WriteTar for a root whose owners are shifted by
// shift from the archive's (a sandbox in a user namespace seen from the
// host): an entry owned by uid u is given uid u+shift.
func WriteTarShifted(root, dir string, r io.Reader, shift int) error {
	rt, err := openRoot(root)
	if err != nil {
		return err
	}
	defer rt.close()
	x := &extractor{rt: rt, base: clean(dir), shift: shift}
	fd, err := rt.mkdirAll(x.base)
	if err != nil {
		return err
	}
	unix.Close(fd)
	err = x.extract(tar.NewReader(r))
	// Finish the directories made so far even after a bad entry, so they
	// don't stay at mode 0700.
	if ferr := x.finishDirs(); err == nil {
		err = ferr
	}
	return err
}

type extractor struct {
	shift int // added to owners
	rt    *dirRoot
	base  string    // dir, relative to the root
	dirs  []dirMeta // directory entries, finished last
}

type dirMeta struct {
	rel string
	a   attrs
}

func (x *extractor) extract(tr *tar.Reader) error {
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		// ErrInsecurePath (GODEBUG tarinsecurepath=0) still returns the
		// header; names are made safe by entryPath.
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("rootfs: read tar: %w: %w", errdefs.ErrInvalid, err)
			}
			return fmt.Errorf("rootfs: read tar: %w", err)
		}
		if err := x.entry(h, tr); err != nil {
			return err
		}
	}
}

// entryPath maps a name in the archive to a path relative to the root,
// confined lexically to base.
func (x *extractor) entryPath(name string) string { return path.Join(x.base, clean(name)) }

func (x *extractor) entry(h *tar.Header, r io.Reader) error {
	rel := x.entryPath(h.Name)
	a := attrs{mode: uint32(h.Mode) & 0o7777, uid: -1, gid: -1, atime: h.AccessTime, mtime: h.ModTime}
	if canChown() {
		a.uid, a.gid = h.Uid+x.shift, h.Gid+x.shift
	}
	var err error
	switch h.Typeflag {
	case tar.TypeDir:
		err = x.dir(rel, a)
	case tar.TypeReg, tar.TypeGNUSparse: // the reader expands sparse files
		err = x.create(rel, func(dfd int, tmp string) error { return createFile(dfd, tmp, r, a) })
	case tar.TypeSymlink:
		if h.Linkname == "" {
			return invalid("extract", display(rel), "symlink with an empty target")
		}
		err = x.create(rel, func(dfd int, tmp string) error {
			if err := unix.Symlinkat(h.Linkname, dfd, tmp); err != nil {
				return err
			}
			return a.applyLink(dfd, tmp)
		})
	case tar.TypeLink:
		err = x.link(rel, x.entryPath(h.Linkname))
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return invalid("extract", display(rel), "device nodes and fifos are not allowed")
	default:
		return invalid("extract", display(rel), fmt.Sprintf("unsupported tar entry type %q", h.Typeflag))
	}
	if err != nil {
		return wrap("extract", display(rel), err)
	}
	return nil
}

// create puts a new non-directory at rel, made by mk under a temporary name
// in its parent, replacing what is there.
func (x *extractor) create(rel string, mk func(dirfd int, tmp string) error) error {
	dfd, name, err := x.rt.parent(rel, true)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return replace(dfd, name, func(tmp string) error { return mk(dfd, tmp) })
}

// link makes rel a hard link to target; both are in-root.
func (x *extractor) link(rel, target string) error {
	tfd, tname, err := x.rt.parent(target, false)
	if err != nil {
		return invalid("extract", display(rel), fmt.Sprintf("hard link target %s: %v", display(target), err))
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tname, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return invalid("extract", display(rel), fmt.Sprintf("hard link target %s: %v", display(target), err))
	}
	if isDir(&st) {
		return invalid("extract", display(rel), fmt.Sprintf("hard link target %s is a directory", display(target)))
	}
	// linkat without AT_SYMLINK_FOLLOW links a symlink itself, never its
	// target.
	return x.create(rel, func(dfd int, tmp string) error { return unix.Linkat(tfd, tname, dfd, tmp, 0) })
}

// dir makes the directory rel (mode 0700 until finishDirs), replacing a
// non-directory there, and queues its attributes.
func (x *extractor) dir(rel string, a attrs) error {
	if rel != x.base { // base was made by WriteTar
		dfd, name, err := x.rt.parent(rel, true)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		err = mkdirAt(dfd, name, 0o700)
		if err == unix.EEXIST {
			var st unix.Stat_t
			if err = unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && !isDir(&st) {
				if err = unix.Unlinkat(dfd, name, 0); err == nil {
					err = mkdirAt(dfd, name, 0o700)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	x.dirs = append(x.dirs, dirMeta{rel: rel, a: a})
	return nil
}

// finishDirs applies the queued directory attributes in reverse archive
// order, so children come before their parents and a parent made
// unsearchable does not block them.
func (x *extractor) finishDirs() error {
	for _, d := range slices.Backward(x.dirs) {
		flags := unix.O_RDONLY | unix.O_DIRECTORY
		if d.rel != x.base {
			// A later entry may have replaced it with a symlink: don't
			// follow it (base itself may legitimately be reached via one).
			flags |= unix.O_NOFOLLOW
		}
		fd, err := x.rt.resolve(d.rel, flags)
		if err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR {
			continue // replaced or removed by a later entry
		}
		if err == nil {
			err = d.a.applyFd(fd)
			unix.Close(fd)
		}
		if err != nil {
			return wrap("extract", display(d.rel), err)
		}
	}
	return nil
}

// ReadTar writes path inside root (file or directory tree) to w as a tar
// stream whose entries are named relative to path's parent:
// ReadTar(root, "/work") yields "work/", "work/a.txt", ... and
// ReadTar(root, "/") yields "./", "./bin/", .... A symlink at path itself is
// followed in-root (the entry keeps path's name); symlinks below it are
// stored as symlinks, and the walk never leaves the tree: each child is
// opened from its parent's fd with O_NOFOLLOW, no path is resolved twice.
// Files with several links in the tree become hard link entries. Sockets,
// fifos and device nodes are skipped: they carry no data and WriteTar
// refuses them. Owners are numeric (no names); entries are sorted by name
// within a directory. A file that shrinks while being read is padded with
// zeros, one that grows is cut at its size when first seen.
func ReadTar(root, path string, w io.Writer) error { return ReadTarShifted(root, path, w, 0) }

// ReadTarShifted is ReadTar for a root whose owners are shifted by shift
// (a sandbox in a user namespace seen from the host): a file of uid u is
// stored as u-shift, or as 65534 (nobody) if that is not one of the 65536
// ids the shift maps.
func ReadTarShifted(root, path string, w io.Writer, shift int) error {
	rt, err := openRoot(root)
	if err != nil {
		return err
	}
	defer rt.close()
	return rt.readTar(clean(path), w, shift)
}

func (r *dirRoot) readTar(rel string, w io.Writer, shift int) error {
	fd, st, err := r.stat(rel)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	tw := tar.NewWriter(w)
	wk := walker{tw: tw, links: map[fileID]string{}, shift: shift}
	if err := wk.add(fd, st, path.Base(rel), display(rel)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("rootfs: write tar: %w", err)
	}
	return nil
}

type fileID struct{ dev, ino uint64 }

type walker struct {
	shift int // taken from owners
	tw    *tar.Writer
	links map[fileID]string // first tar name of each multiply-linked file
}

// add writes the entry for the inode behind the O_PATH fd, named name in
// the archive and spath in the sandbox (for errors), and its children.
func (wk *walker) add(fd int, st *unix.Stat_t, name, spath string) error {
	h := &tar.Header{
		Name:    name,
		Mode:    int64(perm(st)),
		Uid:     wk.unshift(st.Uid),
		Gid:     wk.unshift(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
	}
	var err error
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag, h.Name = tar.TypeDir, name+"/"
		err = wk.dir(fd, h, name, spath)
	case unix.S_IFREG:
		err = wk.file(fd, st, h)
	case unix.S_IFLNK:
		h.Typeflag = tar.TypeSymlink
		if h.Linkname, err = readlink(fd); err == nil {
			err = wk.tw.WriteHeader(h)
		}
	default:
		return nil // socket, fifo, device: skipped, see ReadTar
	}
	if err != nil {
		return wrap("read tar", spath, err)
	}
	return nil
}

func (wk *walker) dir(fd int, h *tar.Header, name, spath string) error {
	if err := wk.tw.WriteHeader(h); err != nil {
		return err
	}
	d, err := reopen(fd, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	dfd := int(d.Fd())
	for _, n := range names {
		cfd, err := unix.Openat(dfd, n, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOENT {
			continue // removed while we walk
		}
		if err != nil {
			return wrap("read tar", path.Join(spath, n), err)
		}
		var cst unix.Stat_t
		err = unix.Fstat(cfd, &cst)
		if err == nil {
			err = wk.add(cfd, &cst, name+"/"+n, path.Join(spath, n))
		}
		unix.Close(cfd)
		if err != nil {
			return wrap("read tar", path.Join(spath, n), err)
		}
	}
	return nil
}

func (wk *walker) file(fd int, st *unix.Stat_t, h *tar.Header) error {
	if st.Nlink > 1 {
		id := fileID{dev: st.Dev, ino: st.Ino}
		if first, ok := wk.links[id]; ok {
			h.Typeflag, h.Linkname = tar.TypeLink, first
			return wk.tw.WriteHeader(h)
		}
		wk.links[id] = h.Name
	}
	h.Typeflag, h.Size = tar.TypeReg, st.Size
	if err := wk.tw.WriteHeader(h); err != nil {
		return err
	}
	f, err := reopen(fd, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.CopyN(wk.tw, f, st.Size)
	if err == io.EOF {
		_, err = io.CopyN(wk.tw, zeros{}, st.Size-n)
	}
	return err
}

// readlink reads the target of the symlink behind an O_PATH|O_NOFOLLOW fd.
func readlink(fd int) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// unshift maps a host id to the archive's (see ReadTarShifted).
func (wk *walker) unshift(id uint32) int {
	if wk.shift == 0 {
		return int(id)
	}
	if u := int(id) - wk.shift; u >= 0 && u < 65536 {
		return u
	}
	return 65534
}
