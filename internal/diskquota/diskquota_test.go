package diskquota

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

const mib = 1 << 20

// fill writes 1 MiB chunks to path until a write or the final fsync
// fails, and returns how much it wrote and the error.
func fill(t *testing.T, path string, max int64) (int64, error) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, mib)
	for i := range buf {
		buf[i] = byte(i*7 + 1) // not zeros: no compression or holes
	}
	var n int64
	for n < max {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	return n, f.Sync()
}

func quotaErr(err error) bool { return errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.ENOSPC) }

func base(t *testing.T, mnt string) string {
	t.Helper()
	b := filepath.Join(mnt, "sandboxes")
	if err := os.Mkdir(b, 0o700); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBtrfsBytes(t *testing.T) {
	b := base(t, testutil.BtrfsDir(t, 512*mib))
	q := Detect(b)
	if q.Mechanism() != Btrfs || q.Inodes() {
		t.Fatalf("Detect on btrfs: got %q (inodes %v, reason %q), want btrfs without inode limits", q.Mechanism(), q.Inodes(), q.Reason())
	}
	a, c, plain := filepath.Join(b, "a"), filepath.Join(b, "c"), filepath.Join(b, "plain")
	if err := q.Create(a, Limit{Bytes: 16 * mib}); err != nil {
		t.Fatal(err)
	}
	if err := q.Create(c, Limit{Bytes: 16 * mib}); err != nil {
		t.Fatal(err)
	}
	if err := q.Create(plain, Limit{}); err != nil {
		t.Fatal(err)
	}
	if err := q.Create(a, Limit{Bytes: mib}); !errors.Is(err, os.ErrExist) {
		t.Fatalf("Create of an existing dir: got %v, want ErrExist", err)
	}

	// A sweep for stale qgroups leaves live subvolumes' qgroups alone.
	if n, err := q.ClearStale(); n != 0 || err != nil {
		t.Fatalf("ClearStale with only live subvolumes: %d, %v", n, err)
	}
	n, err := fill(t, filepath.Join(a, "big"), 64*mib)
	if !quotaErr(err) {
		t.Fatalf("writing 64 MiB under a 16 MiB limit: wrote %d, got %v, want EDQUOT or ENOSPC", n, err)
	}
	if n < 12*mib || n > 17*mib {
		t.Fatalf("stopped after %d bytes, want about 16 MiB", n)
	}
	if u, err := q.Usage(a); err != nil || u < 12*mib || u > 17*mib {
		t.Fatalf("Usage = %d, %v; want about 16 MiB", u, err)
	}
	// The full one harms nobody: its sibling and the unlimited dir write on.
	if n, err := fill(t, filepath.Join(c, "big"), 8*mib); err != nil {
		t.Fatalf("second limited dir: wrote %d: %v", n, err)
	}
	if n, err := fill(t, filepath.Join(plain, "big"), 64*mib); err != nil {
		t.Fatalf("unlimited dir: wrote %d: %v", n, err)
	}
	// Freeing space under the limit lets writes go on.
	if err := os.Remove(filepath.Join(a, "big")); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	if n, err := fill(t, filepath.Join(a, "again"), 4*mib); err != nil {
		t.Fatalf("after freeing space: wrote %d: %v", n, err)
	}

	for _, d := range []string{a, c, plain} {
		if err := q.Remove(d); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Fatalf("%s after Remove: %v", d, err)
		}
	}
	if err := q.Remove(a); err != nil {
		t.Fatalf("Remove twice: %v", err)
	}
	// Nothing left behind: no subvolume and, once the cleaner dropped
	// them, no qgroup but the top level's.
	// A commit wakes the cleaner, which drops deleted subvolumes.
	if out, err := exec.Command("btrfs", "filesystem", "sync", b).CombinedOutput(); err != nil {
		t.Fatalf("btrfs filesystem sync: %v: %s", err, out)
	}
	if out, err := exec.Command("btrfs", "subvolume", "sync", b).CombinedOutput(); err != nil {
		t.Fatalf("btrfs subvolume sync: %v: %s", err, out)
	}
	if out, err := exec.Command("btrfs", "subvolume", "list", b).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("subvolumes left: %v: %s", err, out)
	}
	// The kernel destroys a dropped subvolume's qgroup itself, usually:
	// the next removal (or agent start) sweeps up the rest.
	if _, err := q.ClearStale(); err != nil {
		t.Fatalf("ClearStale: %v", err)
	}
	out, err := exec.Command("btrfs", "qgroup", "show", b).CombinedOutput()
	if err != nil {
		t.Fatalf("btrfs qgroup show: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "0/") && f[0] != "0/5" {
			t.Fatalf("qgroup left behind: %s", out)
		}
	}
}

// btrfs has no inode count, but each inode's metadata is charged to the
// qgroup: a tree of empty files stops at the byte limit too.
func TestBtrfsFilesBounded(t *testing.T) {
	b := base(t, testutil.BtrfsDir(t, 512*mib))
	q := Detect(b)
	d := filepath.Join(b, "files")
	if err := q.Create(d, Limit{Bytes: 2 * mib}); err != nil {
		t.Fatal(err)
	}
	var err error
	n := 0
	for ; n < 1_000_000; n++ {
		var f *os.File
		if f, err = os.Create(filepath.Join(d, fmt.Sprintf("f%07d-with-a-longish-name", n))); err != nil {
			break
		}
		f.Close()
	}
	if !quotaErr(err) {
		t.Fatalf("created %d empty files under a 2 MiB limit: got %v, want EDQUOT or ENOSPC", n, err)
	}
	if n > 2*mib/100 {
		t.Fatalf("created %d empty files under a 2 MiB limit, want fewer than %d", n, 2*mib/100)
	}
	t.Logf("%d empty files under a 2 MiB limit", n)
	// Inode limits themselves are refused, never ignored.
	err = q.Create(filepath.Join(b, "inodes"), Limit{Bytes: mib, Inodes: 100})
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != CodeUnsupported {
		t.Fatalf("inode limit on btrfs: got %v (code %q), want ErrUnavailable %s", err, errdefs.Code(err), CodeUnsupported)
	}
	if _, err := os.Lstat(filepath.Join(b, "inodes")); !os.IsNotExist(err) {
		t.Fatalf("a refused Create left %v", err)
	}
	if err := q.Remove(d); err != nil {
		t.Fatal(err)
	}
}

func TestNoQuota(t *testing.T) {
	testutil.RequireRoot(t)
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	b := base(t, mnt)
	q := Detect(b)
	if q.Mechanism() != None || !strings.Contains(q.Reason(), "tmpfs") {
		t.Fatalf("Detect on tmpfs: got %q, reason %q; want none, naming tmpfs", q.Mechanism(), q.Reason())
	}
	err := q.Create(filepath.Join(b, "x"), Limit{Bytes: mib})
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != CodeUnsupported || !strings.Contains(err.Error(), "tmpfs") {
		t.Fatalf("limited Create on tmpfs: got %v (code %q)", err, errdefs.Code(err))
	}
	if _, err := os.Lstat(filepath.Join(b, "x")); !os.IsNotExist(err) {
		t.Fatalf("a refused Create left %v", err)
	}
	if err := q.Create(filepath.Join(b, "y"), Limit{}); err != nil {
		t.Fatalf("unlimited Create on tmpfs: %v", err)
	}
	if err := q.Remove(filepath.Join(b, "y")); err != nil {
		t.Fatal(err)
	}
	if err := q.Create(filepath.Join(b, "z"), Limit{Bytes: -1}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("negative limit: got %v, want ErrInvalid", err)
	}
	if err := q.Create(filepath.Join(mnt, "elsewhere", "z"), Limit{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("path outside the base: got %v, want ErrInvalid", err)
	}
}

func TestProjectQuota(t *testing.T) {
	for _, kind := range []Mechanism{XFS, Ext4} {
		t.Run(string(kind), func(t *testing.T) {
			b := base(t, testutil.ProjectQuotaDir(t, string(kind), 512*mib))
			q := Detect(b)
			if q.Mechanism() != kind || !q.Inodes() {
				t.Fatalf("Detect: got %q (inodes %v, reason %q), want %s with inode limits", q.Mechanism(), q.Inodes(), q.Reason(), kind)
			}
			a, c := filepath.Join(b, "a"), filepath.Join(b, "c")
			if err := q.Create(a, Limit{Bytes: 16 * mib, Inodes: 100}); err != nil {
				t.Fatal(err)
			}
			if err := q.Create(c, Limit{Bytes: 16 * mib, Inodes: 100}); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(a, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			id, err := q.prj.projectOf(a)
			if err != nil {
				t.Fatal(err)
			}
			var fx fsxattr
			q.prj.getXattr(filepath.Join(a, "sub"), &fx)
			// As the overlay writes: without CAP_SYS_RESOURCE, which ext4
			// lets pass hard limits (Bind).
			var n int64
			err = OnThread(-1, true, func() error {
				var err error
				n, err = fill(t, filepath.Join(a, "sub", "big"), 64*mib)
				return err
			})
			if !quotaErr(err) || n < 12*mib || n > 17*mib {
				l, lerr := q.prj.get(id)
				t.Fatalf("64 MiB under a 16 MiB limit: wrote %d, got %v; want EDQUOT near 16 MiB (project %d: %+v, %v; sub: projid %d, xflags %#x)",
					n, err, id, l, lerr, fx.projid, fx.xflags)
			}
			if n, err := fill(t, filepath.Join(c, "big"), 8*mib); err != nil {
				t.Fatalf("second limited dir: wrote %d: %v", n, err)
			}
			i := 0
			err = OnThread(-1, true, func() error {
				for ; i < 1000; i++ {
					f, err := os.Create(filepath.Join(a, fmt.Sprintf("f%d", i)))
					if err != nil {
						return err
					}
					f.Close()
				}
				return nil
			})
			if !quotaErr(err) || i > 100 {
				t.Fatalf("created %d files under a 100 inode limit: %v", i, err)
			}
			// The sandbox's path: an overlay whose upper and work dirs are
			// in a limited dir, written through by root (as exec and file
			// calls do) is held to the limit.
			ov := filepath.Join(b, "ov")
			lim := Limit{Bytes: 16 * mib, Inodes: 100}
			if err := q.Create(ov, lim); err != nil {
				t.Fatal(err)
			}
			lower, merged := t.TempDir(), t.TempDir()
			for _, d := range []string{"upper", "work"} {
				if err := os.Mkdir(filepath.Join(ov, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			err = q.Bind(lim, -1, func() error {
				return unix.Mount("overlay", merged, "overlay", 0,
					"lowerdir="+lower+",upperdir="+filepath.Join(ov, "upper")+",workdir="+filepath.Join(ov, "work"))
			})
			if err != nil {
				t.Fatalf("mount overlay: %v", err)
			}
			n, err = fill(t, filepath.Join(merged, "big"), 64*mib)
			unix.Unmount(merged, 0)
			if !quotaErr(err) || n < 12*mib || n > 17*mib {
				t.Fatalf("through an overlay: 64 MiB under a 16 MiB limit: wrote %d, got %v; want EDQUOT near 16 MiB", n, err)
			}
			for _, d := range []string{a, c, ov} {
				if err := q.Remove(d); err != nil {
					t.Fatal(err)
				}
			}
			if l, err := q.prj.get(id); err != nil || l.bytes != 0 || l.inodes != 0 {
				t.Fatalf("project %d after Remove: %+v, %v; want no limits", id, l, err)
			}
		})
	}
}

func TestDefaultInodes(t *testing.T) {
	for _, c := range []struct{ bytes, want int64 }{
		{0, 0}, {mib, 1024}, {50 * mib, 3200}, {10 << 30, 655360},
	} {
		if got := DefaultInodes(c.bytes); got != c.want {
			t.Errorf("DefaultInodes(%d) = %d, want %d", c.bytes, got, c.want)
		}
	}
}
