package rootfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

// sparseSize and sparseAt shape the sparse files below: 64 MiB with
// "hello" in the middle, one data block in a sea of holes.
const (
	sparseSize = 64 << 20
	sparseAt   = 32 << 20
)

// past is the time every entry of a test tree is stamped with.
var past = time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)

// TestCopyTree protects the snapshot of a writable layer: the copy must be
// the tree as it is on disk (owners, setuid bits, hard links, symlinks not
// followed, holes, fifos, sockets, whiteouts, xattrs, mtimes), or the
// layer packed from it is not what the sandbox saw.
func TestCopyTree(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	mkdir(t, src, 0o755, 0, 0)
	in := func(p string) string { return filepath.Join(src, p) }

	mkdir(t, in("private"), 0o700, 1234, 5678)
	mkdir(t, in("private/bin"), 0o755, 0, 0)
	mkfile(t, in("private/bin/su"), "#!/bin/sh\n", 0o4755, 1000, 1000)
	mkdir(t, in("tmp"), 0o1777, 0, 0)
	linked := string(make([]byte, 10000)) // bigger than a block: a double count shows in Bytes
	mkfile(t, in("tmp/a"), linked, 0o644, 0, 0)
	must(t, os.Link(in("tmp/a"), in("private/b")))
	must(t, os.Symlink("/etc/passwd", in("passwd")))
	must(t, os.Symlink("nowhere/at/all", in("dangling")))
	mknod(t, in("fifo"), unix.S_IFIFO|0o640, 0)
	mknod(t, in("sock"), unix.S_IFSOCK|0o755, 0)
	mkdir(t, in("upper"), 0o755, 0, 0)
	mknod(t, in("upper/gone"), unix.S_IFCHR|0o600, 0)
	must(t, os.Link(in("upper/gone"), in("upper/gone2")))
	mkSparse(t, in("sparse"))
	mkfile(t, in("file.txt"), "text\n", 0o644, 0, 0)
	setXattr(t, in("file.txt"), "user.test", "value")
	setXattr(t, in("private"), "user.test", "value")
	setXattr(t, in("upper"), "trusted.overlay.opaque", "y")
	wantFiles := countEntries(t, src)
	sparseAlloc := lstat(t, in("sparse")).Blocks * 512
	stampAll(t, src)

	stats, err := CopyTree(src, dst)
	must(t, err)

	// Times first: reading a copy's content would change its atime.
	walk(t, dst, func(p string, st *unix.Stat_t) {
		if got := time.Unix(st.Mtim.Unix()); !got.Equal(past) {
			t.Errorf("%s: mtime %v, want %v", p, got.UTC(), past)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK { // symlinks' atimes move when read
			if got := time.Unix(st.Atim.Unix()); !got.Equal(past) {
				t.Errorf("%s: atime %v, want %v", p, got.UTC(), past)
			}
		}
	})

	tests := []struct {
		path     string
		typ      uint32
		perm     uint32
		uid, gid uint32
	}{
		{".", unix.S_IFDIR, 0o755, 0, 0},
		{"private", unix.S_IFDIR, 0o700, 1234, 5678},
		{"private/bin", unix.S_IFDIR, 0o755, 0, 0},
		{"private/bin/su", unix.S_IFREG, 0o4755, 1000, 1000},
		{"tmp", unix.S_IFDIR, 0o1777, 0, 0},
		{"tmp/a", unix.S_IFREG, 0o644, 0, 0},
		{"private/b", unix.S_IFREG, 0o644, 0, 0},
		{"passwd", unix.S_IFLNK, 0o777, 0, 0},
		{"dangling", unix.S_IFLNK, 0o777, 0, 0},
		{"fifo", unix.S_IFIFO, 0o640, 0, 0},
		{"sock", unix.S_IFSOCK, 0o755, 0, 0},
		{"upper", unix.S_IFDIR, 0o755, 0, 0},
		{"upper/gone", unix.S_IFCHR, 0o600, 0, 0},
		{"upper/gone2", unix.S_IFCHR, 0o600, 0, 0},
		{"sparse", unix.S_IFREG, 0o644, 0, 0},
		{"file.txt", unix.S_IFREG, 0o644, 0, 0},
	}
	for _, tt := range tests {
		st := lstat(t, filepath.Join(dst, tt.path))
		if typ, perm := st.Mode&unix.S_IFMT, st.Mode&0o7777; typ != tt.typ || perm != tt.perm {
			t.Errorf("%s: type %o mode %o, want type %o mode %o", tt.path, typ, perm, tt.typ, tt.perm)
		}
		if st.Uid != tt.uid || st.Gid != tt.gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", tt.path, st.Uid, st.Gid, tt.uid, tt.gid)
		}
		if tt.typ == unix.S_IFCHR && st.Rdev != 0 {
			t.Errorf("%s: device %d:%d, want a whiteout (0:0)", tt.path, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
	}

	for _, pair := range [][2]string{{"tmp/a", "private/b"}, {"upper/gone", "upper/gone2"}} {
		a, b := lstat(t, filepath.Join(dst, pair[0])), lstat(t, filepath.Join(dst, pair[1]))
		if a.Ino != b.Ino || a.Nlink != 2 {
			t.Errorf("%s, %s: inodes %d, %d with %d links, want one inode with 2 links", pair[0], pair[1], a.Ino, b.Ino, a.Nlink)
		}
		if s := lstat(t, in(pair[0])); s.Ino == a.Ino {
			t.Errorf("%s: the copy is the source's inode, want a new one", pair[0])
		}
	}

	for p, want := range map[string]string{"passwd": "/etc/passwd", "dangling": "nowhere/at/all"} {
		if got, err := os.Readlink(filepath.Join(dst, p)); err != nil || got != want {
			t.Errorf("readlink %s: got %q (%v), want %q", p, got, err, want)
		}
	}

	for _, x := range []struct{ path, name, want string }{
		{"file.txt", "user.test", "value"},
		{"private", "user.test", "value"},
		{"upper", "trusted.overlay.opaque", "y"},
	} {
		if got, err := getXattr(filepath.Join(dst, x.path), x.name); err != nil || got != x.want {
			t.Errorf("%s: xattr %s = %q (%v), want %q", x.path, x.name, got, err, x.want)
		}
	}

	sp := lstat(t, filepath.Join(dst, "sparse"))
	if sp.Size != sparseSize || sp.Blocks*512 >= 1<<20 {
		t.Errorf("sparse: size %d with %d bytes allocated, want size %d with under 1 MiB", sp.Size, sp.Blocks*512, sparseSize)
	}
	checkSparseData(t, filepath.Join(dst, "sparse"))
	for p, want := range map[string]string{"private/bin/su": "#!/bin/sh\n", "tmp/a": linked, "file.txt": "text\n"} {
		if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(b) != want {
			t.Errorf("%s: content %q (%v), want %d bytes of the source", p, b, err, len(want))
		}
	}

	if stats.Files != wantFiles {
		t.Errorf("Files = %d, want %d (every entry, the root and each hard link included)", stats.Files, wantFiles)
	}
	// Data counted once per inode; the sparse file's data is at least its
	// 5 bytes and at most what it allocates (a block), never its holes.
	plain := int64(len("#!/bin/sh\n") + len(linked) + len("text\n"))
	if stats.Bytes < plain+5 || stats.Bytes > plain+sparseAlloc {
		t.Errorf("Bytes = %d, want between %d and %d", stats.Bytes, plain+5, plain+sparseAlloc)
	}
	if stats.Reflink {
		t.Errorf("Reflink = true on %s, which cannot clone", base)
	}
}

// TestCopyTreeRefuses protects layers from device nodes (a sandbox cannot
// make one, so one in its upper directory is an attack or a mistake) and
// the caller's files from a copy over an existing directory.
func TestCopyTreeRefuses(t *testing.T) {
	testutil.RequireRoot(t)
	tests := []struct {
		name string
		mode uint32
		dev  int
	}{
		{"char device 1:3", unix.S_IFCHR | 0o666, int(unix.Mkdev(1, 3))},
		{"block device", unix.S_IFBLK | 0o660, int(unix.Mkdev(7, 0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
			must(t, os.MkdirAll(filepath.Join(src, "dev"), 0o755))
			mknod(t, filepath.Join(src, "dev/node"), tt.mode, tt.dev)
			_, err := CopyTree(src, dst)
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("CopyTree: got %v, want ErrInvalid", err)
			}
			walk(t, dst, func(p string, st *unix.Stat_t) {
				if typ := st.Mode & unix.S_IFMT; typ == unix.S_IFBLK || typ == unix.S_IFCHR {
					t.Errorf("%s: a device node in the copy", p)
				}
			})
		})
	}

	t.Run("existing dst", func(t *testing.T) {
		base := t.TempDir()
		src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
		mkfile(t, filepath.Join(src, "f"), "new", 0o644, 0, 0)
		mkfile(t, filepath.Join(dst, "keep"), "old", 0o644, 0, 0)
		if _, err := CopyTree(src, dst); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("CopyTree into an existing directory: got %v, want it to exist", err)
		}
		ents, err := os.ReadDir(dst)
		must(t, err)
		if len(ents) != 1 || ents[0].Name() != "keep" {
			t.Errorf("dst after a refused copy: got %v, want only keep", ents)
		}
	})
}

// TestScan protects what a layer is sized and checked by before it is
// packed: entries counted, holes measured, the sparsest file named, and
// device nodes other than whiteouts refused.
func TestScan(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	in := func(p string) string { return filepath.Join(dir, p) }
	mkdir(t, in("var"), 0o755, 0, 0)
	mkSparse(t, in("var/big"))
	small, err := os.Create(in("small")) // 1 MiB, one byte at its end
	must(t, err)
	must(t, small.Truncate(1<<20))
	_, err = small.WriteAt([]byte{1}, 1<<20-1)
	must(t, err)
	must(t, small.Close())
	mkfile(t, in("plain"), "plain data", 0o644, 0, 0)
	mknod(t, in("var/whiteout"), unix.S_IFCHR|0o600, 0)
	mknod(t, in("fifo"), unix.S_IFIFO|0o600, 0)
	must(t, os.Symlink("/dev/null", in("null")))

	got, err := Scan(dir)
	must(t, err)

	var wantBytes, wantHoles int64
	for _, p := range []string{"var/big", "small", "plain"} {
		st := lstat(t, in(p))
		wantBytes += st.Blocks * 512
		wantHoles += max(0, st.Size-st.Blocks*512)
	}
	big := lstat(t, in("var/big"))
	want := TreeStats{
		Files:         8, // ., var, var/big, var/whiteout, small, plain, fifo, null
		Bytes:         wantBytes,
		Holes:         wantHoles,
		Sparsest:      "var/big",
		SparsestHoles: big.Size - big.Blocks*512,
	}
	if got != want {
		t.Errorf("Scan = %+v, want %+v", got, want)
	}
	if got.SparsestHoles < sparseSize-(1<<20) {
		t.Errorf("SparsestHoles = %d, want nearly %d: the holes of a %d byte file with 5 bytes of data", got.SparsestHoles, sparseSize, sparseSize)
	}

	for name, dev := range map[string]struct {
		mode uint32
		dev  int
	}{
		"char device 1:3": {unix.S_IFCHR | 0o666, int(unix.Mkdev(1, 3))},
		"block device":    {unix.S_IFBLK | 0o660, int(unix.Mkdev(7, 0))},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.Mkdir(filepath.Join(dir, "dev"), 0o755))
			mknod(t, filepath.Join(dir, "dev/node"), dev.mode, dev.dev)
			if _, err := Scan(dir); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Scan: got %v, want ErrInvalid", err)
			}
		})
	}
}

func mkdir(t *testing.T, p string, perm uint32, uid, gid int) {
	t.Helper()
	must(t, os.Mkdir(p, 0o700))
	chownMod(t, p, perm, uid, gid)
}

func mkfile(t *testing.T, p, content string, perm uint32, uid, gid int) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(content), 0o600))
	chownMod(t, p, perm, uid, gid)
}

// chownMod sets owner, then mode: chown clears setuid bits.
func chownMod(t *testing.T, p string, perm uint32, uid, gid int) {
	t.Helper()
	must(t, os.Lchown(p, uid, gid))
	must(t, unix.Chmod(p, perm))
}

func mknod(t *testing.T, p string, mode uint32, dev int) {
	t.Helper()
	must(t, unix.Mknod(p, mode, dev))
	must(t, unix.Chmod(p, mode&0o7777)) // past the umask
}

// mkSparse makes a sparseSize file holding "hello" at sparseAt and
// nothing else, and checks the filesystem kept it sparse.
func mkSparse(t *testing.T, p string) {
	t.Helper()
	f, err := os.Create(p)
	must(t, err)
	must(t, f.Truncate(sparseSize))
	_, err = f.WriteAt([]byte("hello"), sparseAt)
	must(t, err)
	must(t, f.Close())
	must(t, os.Chmod(p, 0o644))
	if st := lstat(t, p); st.Blocks*512 >= 1<<20 {
		t.Fatalf("%s: %d bytes allocated: this filesystem does not keep holes", p, st.Blocks*512)
	}
}

func checkSparseData(t *testing.T, p string) {
	t.Helper()
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	b := make([]byte, 7)
	_, err = f.ReadAt(b, sparseAt-1)
	must(t, err)
	if string(b) != "\x00hello\x00" {
		t.Errorf("%s at %d: got %q, want %q", p, sparseAt-1, b, "\x00hello\x00")
	}
}

func setXattr(t *testing.T, p, name, value string) {
	t.Helper()
	must(t, unix.Lsetxattr(p, name, []byte(value), 0))
}

func getXattr(p, name string) (string, error) {
	b := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, b)
	if err != nil {
		return "", err
	}
	return string(b[:n]), nil
}

func lstat(t *testing.T, p string) *unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return &st
}

// walk calls fn for dir and every entry under it, following no symlink.
// A missing dir is an empty walk.
func walk(t *testing.T, dir string, fn func(p string, st *unix.Stat_t)) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == dir {
			return nil
		}
		if err != nil {
			return err
		}
		fn(p, lstat(t, p))
		return nil
	})
	must(t, err)
}

func countEntries(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	walk(t, dir, func(string, *unix.Stat_t) { n++ })
	return n
}

// stampAll sets the atime and mtime of everything under dir to past, not
// following symlinks. Done last, and after the walk: adding an entry
// moves its directory's mtime, listing it its atime.
func stampAll(t *testing.T, dir string) {
	t.Helper()
	var paths []string
	walk(t, dir, func(p string, _ *unix.Stat_t) { paths = append(paths, p) })
	ts := []unix.Timespec{unix.NsecToTimespec(past.UnixNano()), unix.NsecToTimespec(past.UnixNano())}
	for _, p := range paths {
		must(t, unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW))
	}
}
