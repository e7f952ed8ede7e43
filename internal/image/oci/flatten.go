package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// OCI whiteout markers (image-spec layer.md).
const (
	whPrefix = ".wh."
	whOpaque = ".wh..wh..opq"
	// whMeta prefixes AUFS bookkeeping entries (.wh..wh.plnk, ...), which
	// carry no meaning for the flattened tree and are skipped.
	whMeta = ".wh..wh."
)

// Limits bound what one import may make, so that a small upload cannot
// fill a disk (a gzip bomb) or pin the server for hours. Exceeding one is
// ErrInvalid with code "image_too_large".
type Limits struct {
	MaxLayers  int   // layers in the image
	MaxEntries int   // tar entries across all layers
	MaxBytes   int64 // regular file bytes written across all layers
}

// DefaultLimits fit the largest real images (CUDA and ML stacks run to
// ~500k files and tens of GB) with room to spare.
var DefaultLimits = Limits{MaxLayers: 256, MaxEntries: 4 << 20, MaxBytes: 128 << 30}

// Layer is one layer of an image: an uncompressed tar stream.
type Layer interface {
	Uncompressed() (io.ReadCloser, error)
}

// Flatten applies layers (bottom first) onto dir, an empty directory, the
// way a container runtime stacks them: later entries replace earlier ones,
// ".wh.NAME" removes NAME from the layers below, and ".wh..wh..opq" hides
// everything the layers below put in its directory.
//
// Modes (with setuid, setgid and sticky), mtimes, symlinks (target stored
// verbatim), hard links, fifos and xattrs are kept; owners and trusted.*
// and security.* xattrs only when running as root. Overlay's own xattrs
// (trusted.overlay.*, user.overlay.*) are dropped: they would steer the
// overlay that later stacks the layer.
//
// Everything in the archive is untrusted. Entry names and hard link
// targets that climb above the top ("../x") are ErrInvalid, as are device
// nodes (overlay writes its whiteouts as 0/0 character devices; OCI layers
// use .wh. files, so a device in one is never legitimate), whiteouts of
// "." or "..", and entries of unknown types. Symlinks among an entry's
// parent directories, including ones made by earlier entries, are followed
// inside dir (an absolute target is taken from dir), so nothing is ever
// written outside it. Errors about the archive wrap ErrInvalid with code
// "invalid_image"; on error dir is left half-written for the caller to
// remove.
func Flatten(ctx context.Context, dir string, layers []Layer, lim Limits) error {
	if lim.MaxLayers > 0 && len(layers) > lim.MaxLayers {
		return tooLarge("image has %d layers, more than the limit of %d", len(layers), lim.MaxLayers)
	}
	f := &flattener{
		t:       tree{dir: dir},
		lim:     lim,
		root:    os.Geteuid() == 0,
		dirs:    map[string]dirAttrs{},
		removed: map[string]int{},
	}
	for i, l := range layers {
		if err := f.layer(ctx, i, l); err != nil {
			return err
		}
	}
	return f.finishDirs()
}

type flattener struct {
	t    tree
	lim  Limits
	root bool // may chown and set privileged xattrs

	entries int
	bytes   int64
	seq     int // entries applied so far; orders dirs against removals

	// inLayer holds the paths the current layer has made, which an
	// opaque marker or whiteout in the same layer must not remove.
	inLayer map[string]bool
	// dirs holds each directory entry's mode and mtime, applied after the
	// last layer so that later layers can still write below a read-only
	// directory and don't disturb its mtime. removed records when a path
	// was last removed, so a directory removed and made again implicitly
	// does not get the attributes of its predecessor.
	dirs    map[string]dirAttrs
	removed map[string]int
}

type dirAttrs struct {
	seq   int
	mode  uint32
	mtime time.Time
}

func (f *flattener) layer(ctx context.Context, i int, l Layer) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return invalidImage("layer %d: %v", i, err)
	}
	defer rc.Close()
	f.inLayer = map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return invalidImage("layer %d: read tar: %v", i, err)
		}
		f.entries++
		if f.lim.MaxEntries > 0 && f.entries > f.lim.MaxEntries {
			return tooLarge("image has more than %d entries", f.lim.MaxEntries)
		}
		f.seq++
		if err := f.entry(h, tr); err != nil {
			return entryError(i, h.Name, err)
		}
	}
}

// entryError classifies an error applying an entry. The archive drives
// every syscall we make, so a failing one means a bad archive (a name too
// long, a file where a directory must be, ...), except for the few errors
// that mean the host is in trouble.
func entryError(layer int, name string, err error) error {
	var ee *errdefs.Error
	if errors.As(err, &ee) {
		return fmt.Errorf("layer %d: %w", layer, err)
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.ENOSPC, unix.EDQUOT, unix.EIO, unix.ENOMEM, unix.EMFILE, unix.ENFILE, unix.EROFS:
			return fmt.Errorf("layer %d: entry %q: %w", layer, name, err)
		}
	}
	return errdefs.New(errdefs.ErrInvalid, codeInvalidImage, "invalid image: layer %d: entry %q: %v", layer, name, err)
}

// cleanName maps an entry name to a clean path relative to the top ("."
// for the top itself). Leading "/" and "./" are accepted, as every runtime
// does; climbing above the top is refused.
func cleanName(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", badEntry(name, "empty or malformed name")
	}
	c := path.Clean(strings.TrimLeft(name, "/"))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", badEntry(name, "path escapes the image root")
	}
	return c, nil
}

func (f *flattener) entry(h *tar.Header, r io.Reader) error {
	switch h.Typeflag {
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock:
		return badEntry(h.Name, "device nodes are not allowed in an imported image")
	}
	rel, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	base := path.Base(rel)
	if strings.HasPrefix(base, whPrefix) {
		return f.whiteout(h, rel, base)
	}
	if rel == "." {
		if h.Typeflag != tar.TypeDir {
			return badEntry(h.Name, "the image root must be a directory")
		}
		f.dirs["."] = dirAttrs{seq: f.seq, mode: uint32(h.Mode) & 0o7777, mtime: h.ModTime}
		return f.meta(-1, ".", h, true)
	}

	pfd, err := f.t.mkdirAll(path.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)

	var st unix.Stat_t
	exists := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	isDir := exists && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if exists && !(isDir && h.Typeflag == tar.TypeDir) {
		if err := f.remove(pfd, base, rel); err != nil {
			return err
		}
	}
	f.inLayer[rel] = true

	switch h.Typeflag {
	case tar.TypeDir:
		if !isDir {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return err
			}
		}
		f.dirs[rel] = dirAttrs{seq: f.seq, mode: uint32(h.Mode) & 0o7777, mtime: h.ModTime}
		return f.meta(pfd, base, h, true)
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse: // the reader expands sparse files
		if h.Size < 0 || f.lim.MaxBytes > 0 && f.bytes+h.Size > f.lim.MaxBytes {
			return tooLarge("image holds more than %d bytes of files", f.lim.MaxBytes)
		}
		f.bytes += h.Size
		if err := writeFile(pfd, base, r); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if h.Linkname == "" || strings.ContainsRune(h.Linkname, 0) {
			return badEntry(h.Name, "symlink with an empty or malformed target")
		}
		if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
			return err
		}
	case tar.TypeLink:
		// A hard link shares its target's inode and so its metadata: the
		// link entry's own header fields are not applied.
		return f.link(pfd, base, h)
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return err
		}
	default:
		return badEntry(h.Name, "unsupported tar entry type %q", h.Typeflag)
	}
	return f.meta(pfd, base, h, false)
}

// link makes base in pfd a hard link to the entry h.Linkname names, made
// by this layer or one below.
func (f *flattener) link(pfd int, base string, h *tar.Header) error {
	target, err := cleanName(h.Linkname)
	if err != nil {
		return badEntry(h.Name, "hard link target %q escapes the image root", h.Linkname)
	}
	if target == "." {
		return badEntry(h.Name, "hard link to the image root")
	}
	tfd, err := f.t.openDir(path.Dir(target))
	if err != nil {
		return badEntry(h.Name, "hard link target %q: %v", h.Linkname, err)
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	tname := path.Base(target)
	if err := unix.Fstatat(tfd, tname, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return badEntry(h.Name, "hard link target %q: %v", h.Linkname, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return badEntry(h.Name, "hard link target %q is a directory", h.Linkname)
	}
	// Without AT_SYMLINK_FOLLOW, linkat links a symlink itself.
	return unix.Linkat(tfd, tname, pfd, base, 0)
}

// meta applies owner, xattrs and, for non-directories, mode and times to
// name in pfd (pfd -1: the top itself). Directories get mode and mtime in
// finishDirs.
func (f *flattener) meta(pfd int, name string, h *tar.Header, dir bool) error {
	if pfd < 0 {
		fd, err := f.t.openDir(".")
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		pfd, name = fd, "."
	}
	if h.Uid < 0 || h.Gid < 0 || h.Uid > maxID || h.Gid > maxID {
		return badEntry(h.Name, "owner %d:%d out of range", h.Uid, h.Gid)
	}
	if f.root {
		if err := unix.Fchownat(pfd, name, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	if err := setXattrs(pfd, name, f.xattrs(h)); err != nil {
		return err
	}
	if dir {
		return nil
	}
	if h.Typeflag != tar.TypeSymlink {
		// After chown, which clears setuid and setgid. The entry was made
		// just now and is not a symlink, so fchmodat cannot be redirected.
		if err := unix.Fchmodat(pfd, name, uint32(h.Mode)&0o7777, 0); err != nil {
			return err
		}
	}
	return unix.UtimesNanoAt(pfd, name, times(h.AccessTime, h.ModTime), unix.AT_SYMLINK_NOFOLLOW)
}

// xattrs returns the xattrs of h to apply.
func (f *flattener) xattrs(h *tar.Header) map[string]string {
	var out map[string]string
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || overlayXattr(name) {
			continue
		}
		if !f.root && !strings.HasPrefix(name, "user.") {
			continue // tar(1) does the same without privileges
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = v
	}
	return out
}

// overlayXattr reports whether name is one of overlayfs's own xattrs.
func overlayXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")
}

// whiteout handles ".wh.NAME" and ".wh..wh..opq" at rel.
func (f *flattener) whiteout(h *tar.Header, rel, base string) error {
	parent := path.Dir(rel)
	if base == whOpaque {
		pfd, err := f.t.mkdirAll(parent)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		return f.opaque(pfd, parent)
	}
	if strings.HasPrefix(base, whMeta) {
		return nil
	}
	victim := strings.TrimPrefix(base, whPrefix)
	if victim == "" || victim == "." || victim == ".." {
		return badEntry(h.Name, "whiteout of %q", victim)
	}
	vrel := path.Join(parent, victim)
	if f.inLayer[vrel] {
		return nil // whiteouts hide lower layers, not their own
	}
	pfd, err := f.t.openDir(parent)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil // nothing below to hide
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return f.remove(pfd, victim, vrel)
}

// opaque removes everything in the directory rel (behind dfd) that the
// current layer did not make, descending into the directories it did.
func (f *flattener) opaque(dfd int, rel string) error {
	names, err := listDir(dfd, ".")
	if err != nil {
		return err
	}
	for _, n := range names {
		crel := path.Join(rel, n)
		if !f.inLayer[crel] {
			if err := f.remove(dfd, n, crel); err != nil {
				return err
			}
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		cfd, err := unix.Openat(dfd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		err = f.opaque(cfd, crel)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// remove removes name in pfd (at rel) and all below it.
func (f *flattener) remove(pfd int, name, rel string) error {
	f.removed[rel] = f.seq
	if err := removeAll(pfd, name); err != nil {
		return fmt.Errorf("remove %s: %w", rel, err)
	}
	return nil
}

// finishDirs gives every directory entry still standing its mode and
// mtime, deepest first so a parent's mtime is set after its children.
func (f *flattener) finishDirs() error {
	rels := make([]string, 0, len(f.dirs))
	for rel, a := range f.dirs {
		stale := false
		ancestors(rel, func(p string) bool {
			if s, ok := f.removed[p]; ok && s > a.seq {
				stale = true
			}
			return !stale
		})
		if !stale {
			rels = append(rels, rel)
		}
	}
	slices.SortFunc(rels, func(a, b string) int { return depth(b) - depth(a) })
	for _, rel := range rels {
		a := f.dirs[rel]
		pfd, err := f.t.openDir(path.Dir(rel))
		if err != nil {
			continue // a later entry replaced a parent with a symlink
		}
		name := path.Base(rel)
		if rel == "." {
			name = "."
		}
		var st unix.Stat_t
		err = unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = unix.Fchmodat(pfd, name, a.mode, 0)
			if err == nil {
				err = unix.UtimesNanoAt(pfd, name, times(time.Time{}, a.mtime), unix.AT_SYMLINK_NOFOLLOW)
			}
		}
		unix.Close(pfd)
		if err != nil && err != unix.ENOENT {
			return fmt.Errorf("directory %s: %w", rel, err)
		}
	}
	return nil
}

// writeFile creates the regular file name in dirfd with r's content.
func writeFile(dirfd int, name string, r io.Reader) error {
	fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	w := os.NewFile(uintptr(fd), name)
	_, err = io.Copy(w, r)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return invalidImage("file %s is cut short: %v", name, err)
	}
	return err
}

// times converts tar times for utimensat without UnixNano, which
// overflows outside 1678-2262 (headers may say anything). A zero atime
// takes the mtime; a zero mtime leaves the times as they are.
func times(atime, mtime time.Time) []unix.Timespec {
	if mtime.IsZero() {
		return []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	}
	if atime.IsZero() {
		atime = mtime
	}
	return []unix.Timespec{
		{Sec: atime.Unix(), Nsec: int64(atime.Nanosecond())},
		{Sec: mtime.Unix(), Nsec: int64(mtime.Nanosecond())},
	}
}

// maxID is the largest uid or gid; (uint32)-1 means "no change" to chown.
const maxID = 1<<32 - 2

// Error helpers. Everything wrong with an archive is ErrInvalid.
const (
	codeInvalidImage = "invalid_image"
	codeTooLarge     = "image_too_large"
)

func invalidImage(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalid, codeInvalidImage, "invalid image: "+format, args...)
}

func badEntry(name, format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalid, codeInvalidImage, "invalid image: entry %q: %s", name, fmt.Sprintf(format, args...))
}

func tooLarge(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalid, codeTooLarge, "image too large: "+format, args...)
}
