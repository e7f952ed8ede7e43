package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// MergeDiff applies the diff src onto the diff dst, so that dst alone
// stacks on the layers under both as dst and then src did: both are
// overlayfs upper directories (a sandbox's writes, or a diff layer
// mounted), with whiteouts (character device 0/0) and opaque directories
// (trusted.overlay.opaque). It is how a chain of snapshot diffs is
// squashed into one. Overlay semantics, entry by entry of src:
//
//   - a directory that is not opaque, over a directory of dst: merged,
//     its entries applied in turn; the metadata is src's, and dst's
//     opaque mark stays;
//   - a directory that is not opaque over a whiteout or a file of dst:
//     copied and marked opaque, since dst's entry hid everything below;
//   - anything else (a file, a symlink, a whiteout, an opaque directory,
//     a directory where dst has none): it replaces whatever dst has.
//
// Entries are copied as CopyTree copies them (owners, modes, xattrs,
// times, holes, hard links within src); nothing is followed. A diff that
// uses overlay redirects or metacopy (renamed directories, metadata-only
// copy-ups) refers to the layers below by path and cannot be merged
// (ErrInvalid): warren mounts overlays with both off.
func MergeDiff(dst, src string) error {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: src, Err: err}
	}
	defer unix.Close(sfd)
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dst, Err: err}
	}
	defer unix.Close(dfd)
	m := &merger{c: &copier{root: dfd, links: map[[2]uint64]string{}, reflink: true, buf: make([]byte, 1<<20)}}
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: src, Err: err}
	}
	return m.dir(sfd, dfd, ".", &st)
}

type merger struct{ c *copier }

// dir merges the directory sfd (rel, stat st) into dfd, then gives dfd
// sfd's metadata.
func (m *merger) dir(sfd, dfd int, rel string, st *unix.Stat_t) error {
	if err := refuseRedirects(sfd, rel); err != nil {
		return err
	}
	names, err := readNames(sfd)
	if err != nil {
		return fmt.Errorf("merge %s: %w", rel, err)
	}
	for _, name := range names {
		if err := m.entry(sfd, dfd, name, filepath.Join(rel, name)); err != nil {
			return err
		}
	}
	wasOpaque := opaque(dfd)
	if err := clearXattrs(dfd); err != nil {
		return fmt.Errorf("merge %s: %w", rel, err)
	}
	if err := m.c.meta(sfd, dfd, rel, st); err != nil {
		return err
	}
	if wasOpaque && !opaque(sfd) {
		return markOpaque(dfd, rel)
	}
	return nil
}

func (m *merger) entry(sfd, dfd int, name, rel string) error {
	var st, dt unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("merge %s: %w", rel, err)
	}
	derr := unix.Fstatat(dfd, name, &dt, unix.AT_SYMLINK_NOFOLLOW)
	if derr != nil && !errors.Is(derr, unix.ENOENT) {
		return fmt.Errorf("merge %s: %w", rel, derr)
	}
	srcDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if srcDir {
		s, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("merge %s: %w", rel, err)
		}
		srcOpaque := opaque(s)
		unix.Close(s)
		if !srcOpaque && derr == nil && dt.Mode&unix.S_IFMT == unix.S_IFDIR {
			s, d, err := openDirs(sfd, dfd, name, rel)
			if err != nil {
				return err
			}
			defer unix.Close(s)
			defer unix.Close(d)
			return m.dir(s, d, rel, &st)
		}
		if err := removeIn(dfd, name, rel); err != nil {
			return err
		}
		if err := m.copy(sfd, dfd, name, rel); err != nil {
			return err
		}
		if !srcOpaque && derr == nil {
			// dst's whiteout or file hid the layers below; the directory
			// now in its place must too.
			d, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("merge %s: %w", rel, err)
			}
			defer unix.Close(d)
			return markOpaque(d, rel)
		}
		return nil
	}
	if err := removeIn(dfd, name, rel); err != nil {
		return err
	}
	return m.copy(sfd, dfd, name, rel)
}

// copy copies the entry name of sfd into dfd as CopyTree would, refusing
// redirects below it.
func (m *merger) copy(sfd, dfd int, name, rel string) error {
	if err := refuseRedirectsAt(sfd, name, rel); err != nil {
		return err
	}
	return m.c.entry(sfd, dfd, name, rel)
}

// refuseRedirects refuses a directory fd that carries an overlay redirect
// or metacopy xattr, or any of whose entries does.
func refuseRedirects(fd int, rel string) error {
	if hasRedirect(procFd(fd)) {
		return invalid("merge", rel, "uses overlay redirects or metacopy")
	}
	names, err := readNames(fd)
	if _, serr := unix.Seek(fd, 0, 0); serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("merge %s: %w", rel, err)
	}
	for _, name := range names {
		if hasRedirect(atPath(fd, name)) {
			return invalid("merge", filepath.Join(rel, name), "uses overlay redirects or metacopy")
		}
	}
	return nil
}

// refuseRedirectsAt is refuseRedirects for a whole subtree name of dirfd.
func refuseRedirectsAt(dirfd int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("merge %s: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if st.Mode&unix.S_IFMT == unix.S_IFREG && hasRedirect(atPath(dirfd, name)) {
			return invalid("merge", rel, "uses overlay redirects or metacopy")
		}
		return nil
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("merge %s: %w", rel, err)
	}
	defer unix.Close(fd)
	if err := refuseRedirects(fd, rel); err != nil {
		return err
	}
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("merge %s: %w", rel, err)
	}
	for _, n := range names {
		if err := refuseRedirectsAt(fd, n, filepath.Join(rel, n)); err != nil {
			return err
		}
	}
	return nil
}

// hasRedirect says whether the file at p (not followed) has an overlay
// redirect or metacopy xattr.
func hasRedirect(p string) bool {
	size, err := unix.Llistxattr(p, nil)
	if err != nil || size == 0 {
		return false
	}
	buf := make([]byte, size)
	if size, err = unix.Llistxattr(p, buf); err != nil {
		return false
	}
	for _, name := range splitNul(buf[:size]) {
		for _, ns := range []string{"trusted.overlay.", "user.overlay."} {
			if attr, ok := strings.CutPrefix(name, ns); ok && (attr == "redirect" || attr == "metacopy") {
				return true
			}
		}
	}
	return false
}

// markOpaque marks the open directory fd opaque.
func markOpaque(fd int, rel string) error {
	if err := unix.Fsetxattr(fd, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		return fmt.Errorf("merge %s: mark opaque: %w", rel, err)
	}
	return nil
}
