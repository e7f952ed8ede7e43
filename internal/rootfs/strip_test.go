package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestStrip protects the stacked result of a stripped snapshot: p is gone
// from upper with everything under it, a whiteout hides it exactly where
// a lower layer still has it, and nothing is followed out of upper.
func TestStrip(t *testing.T) {
	testutil.RequireRoot(t) // whiteouts are device nodes
	tests := []struct {
		name   string
		upper  []string   // layer specs, as in mkLayer
		lowers [][]string // top first
		path   string
		err    error             // kind
		want   map[string]string // upper path -> what is there, as in whatIs
	}{
		{
			name:  "file only in upper",
			upper: []string{"etc/f=x", "etc/g=y"},
			path:  "/etc/f",
			want:  map[string]string{"etc/f": "missing", "etc/g": "file y"},
		},
		{
			name:  "tree only in upper",
			upper: []string{"var/cache/a/b/c=x", "var/cache/d=y", "var/cache/e -> /", "var/keep=z"},
			path:  "/var/cache",
			want:  map[string]string{"var/cache": "missing", "var/keep": "file z"},
		},
		{
			name:  "in no layer",
			upper: []string{"etc/"},
			path:  "/nope/x",
			want:  map[string]string{"nope": "missing", "etc": "dir 0755 0:0"},
		},
		{
			name:   "file in upper and lower",
			upper:  []string{"etc/f=new"},
			lowers: [][]string{{"etc/f=old"}},
			path:   "/etc/f",
			want:   map[string]string{"etc/f": "whiteout"},
		},
		{
			name:   "tree in upper and lower",
			upper:  []string{"opt/app/x=1", "opt/app/sub/y=2"},
			lowers: [][]string{{"opt/app/z=3"}},
			path:   "/opt/app",
			want:   map[string]string{"opt/app": "whiteout", "opt": "dir 0755 0:0"},
		},
		{
			name:   "only in the lower under the top",
			lowers: [][]string{{"etc/"}, {"etc/f=x"}},
			path:   "/etc/f",
			want:   map[string]string{"etc/f": "whiteout"},
		},
		{
			name:   "whiteout in upper, file in lower",
			upper:  []string{"etc/f (whiteout)"},
			lowers: [][]string{{"etc/f=x"}},
			path:   "/etc/f",
			want:   map[string]string{"etc/f": "whiteout"},
		},
		{
			name:   "already a whiteout in the lower",
			lowers: [][]string{{"etc/f (whiteout)"}},
			path:   "/etc/f",
			want:   map[string]string{"etc": "missing"},
		},
		{
			name:   "final symlink in upper to outside",
			upper:  []string{"link -> $OUT"},
			lowers: [][]string{{"etc/"}},
			path:   "/link",
			want:   map[string]string{"link": "missing"},
		},
		{
			name:   "final symlink in upper and lower",
			upper:  []string{"bin -> usr/bin"},
			lowers: [][]string{{"bin -> $OUT"}},
			path:   "/bin",
			want:   map[string]string{"bin": "whiteout"},
		},
		{
			name:  "symlink on the way in upper",
			upper: []string{"a -> $OUT"},
			path:  "/a/secret",
			err:   errdefs.ErrInvalid,
			want:  map[string]string{"a": "symlink -> $OUT"},
		},
		{
			name:  "symlink to a directory on the way in upper",
			upper: []string{"a -> $OUT"},
			path:  "/a/dir",
			err:   errdefs.ErrInvalid,
			want:  map[string]string{"a": "symlink -> $OUT"},
		},
		{
			name:  "relative symlink deeper on the way in upper",
			upper: []string{"x/y -> ../../outside", "x/z=keep"},
			path:  "/x/y/secret",
			err:   errdefs.ErrInvalid,
			want:  map[string]string{"x/y": "symlink -> ../../outside", "x/z": "file keep"},
		},
		{
			name:   "symlink on the way in a lower",
			upper:  []string{"etc/"},
			lowers: [][]string{{"etc/alt -> $OUT"}},
			path:   "/etc/alt/secret",
			err:    errdefs.ErrInvalid,
			want:   map[string]string{"etc/alt": "missing"},
		},
		// What the stack already hides needs no whiteout, and must not
		// be brought back by one.
		{
			name:   "a whiteout in upper hides a parent",
			upper:  []string{"root (whiteout)"},
			lowers: [][]string{{"root/.cache/x=1"}},
			path:   "/root/.cache",
			want:   map[string]string{"root": "whiteout"},
		},
		{
			name:   "a file in upper hides a parent",
			upper:  []string{"root=f"},
			lowers: [][]string{{"root/.cache/x=1"}},
			path:   "/root/.cache",
			want:   map[string]string{"root": "file f"},
		},
		{
			name:   "an opaque directory in upper hides the lowers",
			upper:  []string{"root/ (opaque)", "root/.cache/y=2"},
			lowers: [][]string{{"root/.cache/x=1"}},
			path:   "/root/.cache",
			want:   map[string]string{"root/.cache": "missing"},
		},
		{
			name:   "a higher lower deletes the parent",
			lowers: [][]string{{"root (whiteout)"}, {"root/.cache/x=1"}},
			path:   "/root/.cache",
			want:   map[string]string{"root": "missing"},
		},
		{
			name:   "a higher lower has a file at the parent",
			lowers: [][]string{{"root=f"}, {"root/.cache/x=1"}},
			path:   "/root/.cache",
			want:   map[string]string{"root": "missing"},
		},
		{
			name:   "a higher lower's opaque directory hides the lower below",
			lowers: [][]string{{"root/ (opaque)"}, {"root/.cache/x=1"}},
			path:   "/root/.cache",
			want:   map[string]string{"root": "missing"},
		},
		{
			name:   "a higher lower's plain directory merges the lower below",
			lowers: [][]string{{"root/"}, {"root/.cache/x=1"}},
			path:   "/root/.cache",
			want:   map[string]string{"root/.cache": "whiteout"},
		},
		{
			name:  "root",
			upper: []string{"f=x"},
			path:  "/",
			err:   errdefs.ErrInvalid,
			want:  map[string]string{"f": "file x"},
		},
		{
			name:  "dot-dot to the root",
			upper: []string{"f=x"},
			path:  "/f/..",
			err:   errdefs.ErrInvalid,
			want:  map[string]string{"f": "file x"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLayers(t, tt.upper, tt.lowers...)
			err := Strip(l.upper, l.lowers, tt.path)
			checkKind(t, err, tt.err)
			// Also: $OUT/secret and $OUT/dir are still there.
			l.checkUnchanged(t)
			for p, want := range tt.want {
				want = strings.ReplaceAll(want, "$OUT", l.outside)
				if got := whatIs(t, filepath.Join(l.upper, p)); got != want {
					t.Errorf("upper/%s: got %s, want %s", p, got, want)
				}
			}
		})
	}
}

// TestStripMakesParentsLikeLower protects ownership and modes in the
// stacked result: a directory Strip makes in upper to hold a whiteout
// hides the lower layers' one, so it must look like the topmost of them,
// as overlayfs's own copy-up would.
func TestStripMakesParentsLikeLower(t *testing.T) {
	testutil.RequireRoot(t)
	tests := []struct {
		name   string
		lowers [][]string
		dirs   []lowerAttrs
		path   string
		want   map[string]string // upper path -> what is there
	}{
		{
			name:   "one missing parent",
			lowers: [][]string{{"root/.cache/x=1"}},
			dirs:   []lowerAttrs{{0, "root", 0o700, 0, 0}},
			path:   "/root/.cache",
			want:   map[string]string{"root": "dir 0700 0:0", "root/.cache": "whiteout"},
		},
		{
			name:   "a chain of parents, setgid kept",
			lowers: [][]string{{"home/u/.cache/pip/x=1"}},
			dirs: []lowerAttrs{
				{0, "home", 0o751, 0, 50},
				{0, "home/u", 0o2750, 1000, 1000},
				{0, "home/u/.cache", 0o700, 1000, 1000},
			},
			path: "/home/u/.cache/pip",
			want: map[string]string{"home": "dir 0751 0:50", "home/u": "dir 2750 1000:1000",
				"home/u/.cache": "dir 0700 1000:1000", "home/u/.cache/pip": "whiteout"},
		},
		{
			name:   "the topmost lower's directory",
			lowers: [][]string{{"srv/"}, {"srv/data=x"}},
			dirs:   []lowerAttrs{{0, "srv", 0o750, 33, 33}, {1, "srv", 0o755, 0, 0}},
			path:   "/srv/data",
			want:   map[string]string{"srv": "dir 0750 33:33", "srv/data": "whiteout"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLayers(t, nil, tt.lowers...)
			for _, d := range tt.dirs {
				chownMod(t, filepath.Join(l.lowers[d.layer], d.path), d.mode, d.uid, d.gid)
			}
			l.before = l.snapshot(t)
			must(t, Strip(l.upper, l.lowers, tt.path))
			for p, want := range tt.want {
				if got := whatIs(t, filepath.Join(l.upper, p)); got != want {
					t.Errorf("upper/%s: got %s, want %s", p, got, want)
				}
			}
			l.checkUnchanged(t)
		})
	}
}

// TestCleanStripPath protects what the API accepts as a path to strip:
// absolute, never the root, cleaned.
func TestCleanStripPath(t *testing.T) {
	tests := []struct {
		in, want string // want "" for ErrInvalid
	}{
		{"/root/.cache", "/root/.cache"},
		{"/a//b/./c/", "/a/b/c"},
		{"/a/../b", "/b"},
		{"/../../etc", "/etc"},
		{"/", ""},
		{"//", ""},
		{"/a/..", ""},
		{"/..", ""},
		{"", ""},
		{"root/.cache", ""},
		{"./x", ""},
		{"../x", ""},
		{"/a\x00b", ""},
	}
	for _, tt := range tests {
		got, err := CleanStripPath(tt.in)
		if tt.want == "" {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("CleanStripPath(%q) = %q, %v, want ErrInvalid", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("CleanStripPath(%q) = %q, %v, want %q", tt.in, got, err, tt.want)
		}
	}
}

// lowerAttrs is the mode and owner to give a directory in lower layer
// number layer.
type lowerAttrs struct {
	layer    int
	path     string
	mode     uint32
	uid, gid int
}

// layers is an overlay upper directory copy with its lower layers, beside
// a host directory ("outside") that Strip must never change. What the
// lowers hold must not change either.
type layers struct {
	upper   string
	lowers  []string
	outside string
	before  map[string]string // snapshot of outside and the lowers
}

// newLayers makes upper and the lowers (top first) from specs as in
// mkLayer; "$OUT" in a symlink target is the outside directory, which
// holds a file "secret" and a directory "dir".
func newLayers(t *testing.T, upper []string, lowers ...[]string) *layers {
	t.Helper()
	base := t.TempDir()
	l := &layers{upper: filepath.Join(base, "upper"), outside: filepath.Join(base, "outside")}
	mkfile(t, filepath.Join(l.outside, "secret"), "host secret", 0o644, 0, 0)
	must(t, os.Mkdir(filepath.Join(l.outside, "dir"), 0o755))
	mkLayer(t, l.upper, l.outside, upper)
	for i, specs := range lowers {
		dir := filepath.Join(base, fmt.Sprintf("lower%d", i))
		mkLayer(t, dir, l.outside, specs)
		l.lowers = append(l.lowers, dir)
	}
	l.before = l.snapshot(t)
	return l
}

// mkLayer makes dir with entries: "d/" a directory, "d/ (opaque)" an
// opaque one, "f=content" a file, "name -> target" a symlink, "name
// (whiteout)" a whiteout; parents are made 0755 as needed.
func mkLayer(t *testing.T, dir, outside string, specs []string) {
	t.Helper()
	must(t, os.Mkdir(dir, 0o755))
	for _, spec := range specs {
		p := filepath.Join(dir, strings.TrimSuffix(strings.Fields(spec)[0], "/"))
		if !strings.Contains(spec, "=") {
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		}
		switch name, target, ok := strings.Cut(spec, " -> "); {
		case ok:
			must(t, os.Symlink(strings.ReplaceAll(target, "$OUT", outside), filepath.Join(dir, name)))
		case strings.HasSuffix(spec, " (whiteout)"):
			mknod(t, p, unix.S_IFCHR|0o600, 0)
		case strings.HasSuffix(spec, "/ (opaque)"):
			must(t, os.Mkdir(p, 0o755))
			setXattr(t, p, "trusted.overlay.opaque", "y")
		case strings.HasSuffix(spec, "/"):
			must(t, os.Mkdir(p, 0o755))
		default:
			name, content, _ := strings.Cut(spec, "=")
			mkfile(t, filepath.Join(dir, name), content, 0o644, 0, 0)
		}
	}
}

func (l *layers) snapshot(t *testing.T) map[string]string {
	t.Helper()
	m := snapshot(t, l.outside)
	for _, d := range l.lowers {
		for k, v := range snapshot(t, d) {
			m[k] = v
		}
	}
	return m
}

// checkUnchanged fails t if anything outside upper changed.
func (l *layers) checkUnchanged(t *testing.T) {
	t.Helper()
	if after := l.snapshot(t); !mapsEqual(after, l.before) {
		t.Errorf("outside or a lower layer changed:\ngot  %v\nwant %v", after, l.before)
	}
}

// whatIs says what is at p, not following a symlink: "missing",
// "whiteout", "dir MODE UID:GID", "file CONTENT", "symlink -> TARGET",
// or the type and device of anything else.
func whatIs(t *testing.T, p string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); errors.Is(err, unix.ENOENT) {
		return "missing"
	} else if err != nil {
		t.Fatal(err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return fmt.Sprintf("dir %04o %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
	case unix.S_IFREG:
		b, err := os.ReadFile(p)
		must(t, err)
		return "file " + string(b)
	case unix.S_IFLNK:
		target, err := os.Readlink(p)
		must(t, err)
		return "symlink -> " + target
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			return "whiteout"
		}
	}
	return fmt.Sprintf("type %o device %d:%d", st.Mode&unix.S_IFMT, unix.Major(st.Rdev), unix.Minor(st.Rdev))
}
