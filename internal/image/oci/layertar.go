package oci

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// WriteLayerTar writes the tree under dir, one warren layer as mounted,
// to w as an OCI layer tar: entries named relative to dir ("etc/",
// "etc/passwd"), sorted within each directory, with numeric owners, modes,
// mtimes (to the second), symlinks, hard links (within the layer) and
// xattrs.
//
// overlayfs marks in a diff layer become OCI whiteouts: a 0/0 character
// device NAME becomes an empty ".wh.NAME", and a directory with
// trusted.overlay.opaque=y gets a ".wh..wh..opq" entry; overlay's other
// xattrs are dropped. A layer using overlay redirects or metacopy cannot
// be expressed in OCI and is ErrInvalid. Sockets are skipped. Reading
// trusted.* xattrs needs root.
func WriteLayerTar(ctx context.Context, dir string, w io.Writer) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("export layer: %w", err)
	}
	defer unix.Close(fd)
	lw := &layerWriter{ctx: ctx, tw: tar.NewWriter(w), links: map[fileID]string{}}
	// The top directory has no entry of its own, as in images docker
	// builds, but it may be opaque.
	x, err := lw.xattrs(fd, ".", "/")
	if err != nil {
		return err
	}
	if x.opaque {
		if err := lw.marker(whOpaque); err != nil {
			return err
		}
	}
	if err := lw.dir(fd, ""); err != nil {
		return err
	}
	return lw.tw.Close()
}

type fileID struct{ dev, ino uint64 }

type layerWriter struct {
	ctx   context.Context
	tw    *tar.Writer
	links map[fileID]string // first name of each multiply-linked file
}

// dir writes the entries of the directory dfd, named prefix+name.
func (lw *layerWriter) dir(dfd int, prefix string) error {
	names, err := listDir(dfd, ".")
	if err != nil {
		return fmt.Errorf("export layer: %s: %w", prefix, err)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := lw.ctx.Err(); err != nil {
			return err
		}
		if err := lw.entry(dfd, n, prefix+n); err != nil {
			return err
		}
	}
	return nil
}

func (lw *layerWriter) entry(dfd int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("export layer: %s: %w", rel, err)
	}
	h := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, 0),
	}
	typ := st.Mode & unix.S_IFMT
	if typ == unix.S_IFSOCK {
		return nil
	}
	if typ == unix.S_IFCHR && st.Rdev == 0 {
		// An overlay whiteout.
		dirPart, base := splitRel(rel)
		return lw.marker(dirPart + whPrefix + base)
	}
	x, err := lw.xattrs(dfd, name, rel)
	if err != nil {
		return err
	}
	for k, v := range x.keep {
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+k] = v
	}
	switch typ {
	case unix.S_IFDIR:
		h.Typeflag, h.Name = tar.TypeDir, rel+"/"
		if err := lw.tw.WriteHeader(h); err != nil {
			return err
		}
		if x.opaque {
			if err := lw.marker(rel + "/" + whOpaque); err != nil {
				return err
			}
		}
		cfd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("export layer: %s: %w", rel, err)
		}
		defer unix.Close(cfd)
		return lw.dir(cfd, rel+"/")
	case unix.S_IFREG:
		if st.Nlink > 1 {
			id := fileID{dev: st.Dev, ino: st.Ino}
			if first, ok := lw.links[id]; ok {
				h.Typeflag, h.Linkname, h.PAXRecords = tar.TypeLink, first, nil
				return lw.tw.WriteHeader(h)
			}
			lw.links[id] = rel
		}
		h.Typeflag, h.Size = tar.TypeReg, st.Size
		return lw.file(dfd, name, h)
	case unix.S_IFLNK:
		h.Typeflag = tar.TypeSymlink
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return fmt.Errorf("export layer: %s: %w", rel, err)
		}
		h.Linkname = string(buf[:n])
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
	case unix.S_IFCHR, unix.S_IFBLK:
		h.Typeflag = tar.TypeChar
		if typ == unix.S_IFBLK {
			h.Typeflag = tar.TypeBlock
		}
		h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	default:
		return nil
	}
	return lw.tw.WriteHeader(h)
}

func (lw *layerWriter) file(dfd int, name string, h *tar.Header) error {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("export layer: %s: %w", h.Name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if err := lw.tw.WriteHeader(h); err != nil {
		return err
	}
	// Layers are read-only: the size cannot change under us.
	if _, err := io.CopyN(lw.tw, f, h.Size); err != nil {
		return fmt.Errorf("export layer: %s: %w", h.Name, err)
	}
	return nil
}

// marker writes an empty whiteout file.
func (lw *layerWriter) marker(name string) error {
	return lw.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, ModTime: time.Unix(0, 0)})
}

type entryXattrs struct {
	keep   map[string]string
	opaque bool
}

// xattrs reads name's xattrs and sorts out overlay's own.
func (lw *layerWriter) xattrs(dfd int, name, rel string) (entryXattrs, error) {
	all, err := getXattrs(procPath(dfd, name))
	if err != nil {
		return entryXattrs{}, fmt.Errorf("export layer: %s: xattrs: %w", rel, err)
	}
	var x entryXattrs
	for k, v := range all {
		if !overlayXattr(k) {
			if x.keep == nil {
				x.keep = map[string]string{}
			}
			x.keep[k] = v
			continue
		}
		switch strings.TrimPrefix(strings.TrimPrefix(k, "trusted."), "user.") {
		case "overlay.opaque":
			x.opaque = x.opaque || v == "y"
		case "overlay.redirect", "overlay.metacopy":
			return entryXattrs{}, errdefs.New(errdefs.ErrInvalid, "not_exportable",
				"export layer: %s uses overlayfs %s, which an OCI layer cannot express", rel, k)
		}
	}
	return x, nil
}

// splitRel splits "a/b/c" into "a/b/" and "c".
func splitRel(rel string) (string, string) {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i+1], rel[i+1:]
	}
	return "", rel
}
