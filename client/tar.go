package client

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// PackDir writes the tree under dir to w as a tar stream with entries named
// relative to dir ("a.txt", "sub/", "sub/b"); dir itself has no entry.
// Symbolic links inside are stored as links; if dir itself is a link it is
// followed. Ownership is not recorded (the sandbox side decides it).
// Sockets are skipped; devices and FIFOs are an error.
func PackDir(w io.Writer, dir string) error { return packDir(w, dir, false) }

// packDir is PackDir; with owners set it records numeric uids and gids.
func packDir(w io.Writer, dir string, owners bool) error {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return packEntry(tw, p, filepath.ToSlash(rel), d, owners)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func packEntry(tw *tar.Writer, p, name string, d fs.DirEntry, owners bool) error {
	info, err := d.Info()
	if err != nil {
		return err
	}
	mode := info.Mode()
	link := ""
	switch {
	case mode.Type() == fs.ModeSocket:
		return nil // not archivable; tar(1) skips them too
	case mode.Type() == fs.ModeSymlink:
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	case mode.IsDir(), mode.IsRegular():
	default:
		return fmt.Errorf("%s: cannot copy a %s", p, fileKind(mode))
	}
	hdr, err := tar.FileInfoHeader(info, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	if mode.IsDir() {
		hdr.Name += "/"
	}
	if !owners {
		hdr.Uid, hdr.Gid = 0, 0
	}
	hdr.Uname, hdr.Gname = "", ""
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !mode.IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if n, err := io.CopyN(tw, f, hdr.Size); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: file shrank while being copied (%d of %d bytes)", p, n, hdr.Size)
		}
		return err
	}
	return nil
}

func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// ExtractTar unpacks the tar stream r into the existing directory dir,
// treating it as untrusted: every operation goes through an os.Root on dir,
// so no entry name, ".." or symbolic link (in the archive or already on disk)
// can create or modify anything outside dir. Absolute names and names with
// ".." are refused, as are devices and FIFOs; set-id and sticky bits are
// dropped, a zero mode reads as 0644 (0755 for directories); ownership is
// not applied. Existing files an entry names are replaced, never written
// through.
func ExtractTar(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	return extract(root, r, func(name string) (string, error) { return name, nil }, true, nil)
}

// cleanEntryName validates a tar entry name from a stranger and returns it
// clean and relative ("." for the archive's top).
func cleanEntryName(name string) (string, error) {
	if name == "" {
		return "", errors.New("empty entry name")
	}
	if strings.HasPrefix(name, "/") || strings.Contains(name, "\\") || strings.ContainsRune(name, 0) {
		return "", refuse(name, "absolute or malformed name")
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", refuse(name, `".." in name`)
		}
	}
	return path.Clean(name), nil
}

// entryName cleans an archive entry's name from a stranger and maps it
// with mapName (see extract): it returns both.
func entryName(name string, mapName func(string) (string, error)) (clean, mapped string, err error) {
	if clean, err = cleanEntryName(name); err != nil {
		return "", "", err
	}
	mapped, err = mapName(clean)
	return clean, mapped, err
}

type dirMeta struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

// extract unpacks r into root. mapName turns a clean entry name into the
// name to create under root ("." for root itself) or refuses it. applyTop
// says whether an entry for "." may change root's own mode and times.
//
// links, if not nil, takes every symbolic link instead of creating it at
// once: entries under a link's name are refused, and links.finish creates
// the links last, per its policy.
func extract(root *os.Root, r io.Reader, mapName func(string) (string, error), applyTop bool, links *linkSet) error {
	zr := &zeroTail{r: r}
	tr := tar.NewReader(zr)
	var dirs []dirMeta
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// archive/tar also reports a stream cut at an entry boundary
			// as a clean end; only the two zero blocks say it is whole.
			if zr.zeros < 2*512 {
				return fmt.Errorf("read archive: %w (no end-of-archive marker)", io.ErrUnexpectedEOF)
			}
			break
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		_, name, err := entryName(hdr.Name, mapName)
		if err != nil {
			return err
		}
		if links != nil {
			if err := links.take(hdr, name, mapName); err != errNotLink {
				if err != nil {
					return err
				}
				continue
			}
		}
		if err := extractEntry(root, tr, hdr, name, mapName, applyTop, &dirs); err != nil {
			var r *refusal
			if errors.As(err, &r) {
				return err
			}
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	if links != nil {
		if err := links.finish(root); err != nil {
			return err
		}
	}
	// Directory modes last (deepest first), so a read-only directory does
	// not stop its own children from being written.
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if err := root.Chmod(d.name, d.mode); err != nil {
			return err
		}
		if !d.mtime.IsZero() {
			_ = root.Chtimes(d.name, d.mtime, d.mtime)
		}
	}
	return nil
}

// ensureDir makes name a directory, replacing a non-directory in the way.
func ensureDir(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		if err := root.Remove(name); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	return root.MkdirAll(name, 0o755)
}

// prepareLeaf creates name's parent and removes whatever non-directory is at
// name, so the new entry replaces it instead of writing through a link.
func prepareLeaf(root *os.Root, name, entry string) error {
	if name == "." {
		return refuse(entry, "not a directory at the top")
	}
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	fi, err := root.Lstat(name)
	switch {
	case err == nil && fi.IsDir():
		return refuse(entry, "a directory is in the way")
	case err == nil:
		return root.Remove(name)
	case errors.Is(err, fs.ErrNotExist):
		return nil
	}
	return err
}

func writeFile(root *os.Root, name string, r io.Reader, perm fs.FileMode) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// extractEntry creates one entry under root; directories' metadata is
// recorded in dirs, to be applied last.
func extractEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string, mapName func(string) (string, error), applyTop bool, dirs *[]dirMeta) error {
	perm := fs.FileMode(hdr.Mode) & fs.ModePerm
	if perm == 0 { // unset (or hostile): do not lock the user out
		perm = 0o644
		if hdr.Typeflag == tar.TypeDir {
			perm = 0o755
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name != "." {
			if err := ensureDir(root, name); err != nil {
				return err
			}
		} else if !applyTop {
			return nil
		}
		*dirs = append(*dirs, dirMeta{name, perm, hdr.ModTime})
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		if err := prepareLeaf(root, name, hdr.Name); err != nil {
			return err
		}
		if err := writeFile(root, name, tr, perm); err != nil {
			return err
		}
		if !hdr.ModTime.IsZero() {
			_ = root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		}
	case tar.TypeSymlink:
		if hdr.Linkname == "" {
			return refuse(hdr.Name, "empty link target")
		}
		if err := prepareLeaf(root, name, hdr.Name); err != nil {
			return err
		}
		// The target is not checked: a link may point anywhere, but every
		// later operation goes through root, which will not follow it out.
		return root.Symlink(hdr.Linkname, name)
	case tar.TypeLink:
		_, old, err := entryName(hdr.Linkname, mapName)
		if err != nil {
			return err
		}
		if err := prepareLeaf(root, name, hdr.Name); err != nil {
			return err
		}
		return root.Link(old, name)
	case tar.TypeChar, tar.TypeBlock:
		return refuse(hdr.Name, "device node")
	case tar.TypeFifo:
		return refuse(hdr.Name, "named pipe")
	default:
		return refuse(hdr.Name, "unsupported type %q", hdr.Typeflag)
	}
	return nil
}

// refusal is an archive entry ExtractTar will not create.
type refusal struct{ entry, why string }

func (r *refusal) Error() string { return fmt.Sprintf("refusing entry %q: %s", r.entry, r.why) }

func refuse(entry, format string, args ...any) error {
	return &refusal{entry, fmt.Sprintf(format, args...)}
}

// zeroTail counts the zero bytes at the end of what has been read, to tell
// a tar's end-of-archive marker from a stream that was cut short.
type zeroTail struct {
	r     io.Reader
	zeros int
}

func (z *zeroTail) Read(p []byte) (int, error) {
	n, err := z.r.Read(p)
	for _, b := range p[:n] {
		if b == 0 {
			z.zeros++
		} else {
			z.zeros = 0
		}
	}
	return n, err
}
