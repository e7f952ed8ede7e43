package rootfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestMergeDiff: two diffs merged into one stack on the layers below
// exactly as the two did, which overlayfs itself checks: the same tree
// through an overlay of base, d1 and d2 as through one of base and the
// merge.
func TestMergeDiff(t *testing.T) {
	testutil.RequireRoot(t) // whiteouts, trusted.* xattrs, overlay mounts
	dir := t.TempDir()
	base, d1, d2 := filepath.Join(dir, "base"), filepath.Join(dir, "d1"), filepath.Join(dir, "d2")
	mkLayer(t, base, dir, []string{"a/x=0", "a/w=0", "b/old=0", "c/old=0", "d/old=0", "e/f=0", "g/old=0", "h/old=0", "keep=0", "gone=0"})
	mkLayer(t, d1, dir, []string{"a/x=1", "a/y=1", "b (whiteout)", "c=file", "d/ (opaque)", "d/k=1",
		"e/f=1", "gone (whiteout)", "h/ (opaque)", "h/k=1", "link -> a/x"})
	mkLayer(t, d2, dir, []string{"a/x=2", "a/w (whiteout)", "b/n=2", "c/m=2", "d/l=2", "e (whiteout)",
		"g/ (opaque)", "g/n=2", "h (whiteout)", "new=2", "gone=back"})
	must(t, os.Link(filepath.Join(d2, "new"), filepath.Join(d2, "a", "new-too")))
	setXattr(t, filepath.Join(d2, "new"), "user.k", "v")

	merged := filepath.Join(dir, "merged")
	if _, err := CopyTree(d1, merged); err != nil {
		t.Fatal(err)
	}
	if err := MergeDiff(merged, d2); err != nil {
		t.Fatal(err)
	}
	for p, w := range map[string]string{
		"a/x": "file 2", "a/y": "file 1", "a/w": "whiteout", "b/n": "file 2", "c/m": "file 2",
		"d/k": "file 1", "d/l": "file 2", "e": "whiteout", "g/n": "file 2", "h": "whiteout",
		"new": "file 2", "link": "symlink -> a/x", "gone": "file back",
	} {
		if g := whatIs(t, filepath.Join(merged, p)); g != w {
			t.Errorf("%s: %s, want %s", p, g, w)
		}
	}
	for p, want := range map[string]bool{"a": false, "b": true, "c": true, "d": true, "g": true} {
		if got := isOpaque(filepath.Join(merged, p)); got != want {
			t.Errorf("%s opaque: %v, want %v", p, got, want)
		}
	}
	var s1, s2 unix.Stat_t
	must(t, unix.Lstat(filepath.Join(merged, "new"), &s1))
	must(t, unix.Lstat(filepath.Join(merged, "a", "new-too"), &s2))
	if s1.Ino != s2.Ino {
		t.Error("a hard link in the diff is two files in the merge")
	}
	if v, err := unix.Lgetxattr(filepath.Join(merged, "new"), "user.k", make([]byte, 8)); err != nil || v != 1 {
		t.Errorf("xattr: %d, %v", v, err)
	}

	// What overlayfs shows: base, d1, d2 stacked, and base, merged.
	want := overlayView(t, filepath.Join(dir, "m1"), d2, d1, base)
	got := overlayView(t, filepath.Join(dir, "m2"), merged, base)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: merged stack shows %q, the two diffs %q", k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: merged stack shows %q, the two diffs nothing", k, v)
		}
	}
}

// A diff with an overlay redirect names a path in the layers below: it
// cannot be merged, and says so.
func TestMergeDiffRefusesRedirects(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	d1, d2 := filepath.Join(dir, "d1"), filepath.Join(dir, "d2")
	mkLayer(t, d1, dir, []string{"a/x=1"})
	mkLayer(t, d2, dir, []string{"sub/moved/y=2"})
	setXattr(t, filepath.Join(d2, "sub", "moved"), "trusted.overlay.redirect", "/a")
	if err := MergeDiff(d1, d2); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "redirect") {
		t.Fatalf("merge of a diff with a redirect: %v, want ErrInvalid", err)
	}
}

func isOpaque(p string) bool {
	b := make([]byte, 1)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", b)
	return err == nil && n == 1 && b[0] == 'y'
}

// overlayView mounts a read-only overlay of lowers (top first) at mnt and
// maps each path in it to what is there.
func overlayView(t *testing.T, mnt string, lowers ...string) map[string]string {
	t.Helper()
	must(t, os.Mkdir(mnt, 0o755))
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lowers, ":")); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	m := map[string]string{}
	must(t, filepath.WalkDir(mnt, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(mnt, p)
		if rel != "." {
			m[rel] = whatIs(t, p)
		}
		return nil
	}))
	return m
}
