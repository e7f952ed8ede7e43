package rootfs

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/warrenhq/warren/internal/testutil"
)

// TestStripResidue: a snapshot leaves out the build residue the sandbox
// wrote (histories, caches, temp files) but keeps the directories that
// hold it, what it deleted (whiteouts), what a link points at, and what
// the layers below brought.
func TestStripResidue(t *testing.T) {
	testutil.RequireRoot(t) // whiteouts are device nodes
	dir := t.TempDir()
	upper, lower := filepath.Join(dir, "upper"), filepath.Join(dir, "lower")
	mkLayer(t, lower, dir, []string{"root/.bash_history=image's", "tmp/shipped=kept", "etc/f=x"})
	mkLayer(t, upper, dir, []string{
		"root/.ash_history=answer", "root/.cache/pip/x=y", "root/.cache/z=w", "root/notes=keep",
		"home/u/.python_history=h", "home/u/work=keep", "home/evil -> /root", "home/link2 -> $OUT",
		"tmp/a=1", "tmp/.hidden/b=2", "tmp/gone (whiteout)", "var/tmp/c=3",
		"var/lib/apt/lists/deb=4", "var/cache/apt/archives/x.deb=5", "var/cache/apt/archives/partial/",
		"etc/f=changed",
	})
	mkfile(t, filepath.Join(dir, ".bash_history"), "outside", 0o644, 0, 0) // at $OUT: must not be reached
	got, err := StripAll(upper, []string{lower}, []string{"/etc/f"}, Residue)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/home/u/.python_history", "/root/.ash_history", "/root/.cache",
		"/tmp/.hidden", "/tmp/a", "/var/cache/apt/archives/x.deb", "/var/lib/apt/lists/deb", "/var/tmp/c"}
	if !slices.Equal(got, want) {
		t.Errorf("residue stripped:\n got %q\nwant %q", got, want)
	}
	for p, w := range map[string]string{
		"root/.ash_history": "missing", "root/.cache": "missing", "root/notes": "file keep",
		"home/u/.python_history": "missing", "home/u/work": "file keep", "home/evil": "symlink -> /root",
		"tmp": "dir 0755 0:0", "tmp/a": "missing", "tmp/.hidden": "missing", "tmp/gone": "whiteout",
		"var/tmp": "dir 0755 0:0", "var/cache/apt/archives/partial": "dir 0755 0:0",
		"etc/f":              "whiteout", // declared
		"root/.bash_history": "missing",  // the image's: not the sandbox's residue
	} {
		if g := whatIs(t, filepath.Join(upper, p)); g != w {
			t.Errorf("%s: %s, want %s", p, g, w)
		}
	}
	if g := whatIs(t, filepath.Join(dir, ".bash_history")); g != "file outside" {
		t.Errorf("outside upper: %s", g)
	}
	if g := whatIs(t, filepath.Join(lower, "root/.bash_history")); g != "file image's" {
		t.Errorf("the lower layer: %s", g)
	}
	// Nothing to strip: nothing stripped, and again is the same.
	if got, err := StripAll(upper, []string{lower}, nil, Residue); err != nil || len(got) != 0 {
		t.Errorf("second pass: %q, %v", got, err)
	}
}
