package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

func flattenInto(t *testing.T, lim Limits, layers ...[]ent) (string, error) {
	t.Helper()
	parent := t.TempDir()
	root := filepath.Join(parent, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	err := Flatten(context.Background(), root, layersOf(t, layers...), lim)
	onlyChild(t, parent, "root")
	return root, err
}

func mustFlatten(t *testing.T, layers ...[]ent) string {
	t.Helper()
	root, err := flattenInto(t, DefaultLimits, layers...)
	if err != nil {
		t.Fatalf("Flatten: %v", err)
	}
	return root
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func TestFlattenWhiteouts(t *testing.T) {
	root := mustFlatten(t,
		[]ent{
			{name: "etc/", typ: tar.TypeDir},
			{name: "etc/keep", body: "keep"},
			{name: "etc/gone", body: "gone"},
			{name: "opq/", typ: tar.TypeDir},
			{name: "opq/lower", body: "lower"},
			{name: "opq/sub/", typ: tar.TypeDir},
			{name: "opq/sub/deep", body: "deep"},
			{name: "dir/", typ: tar.TypeDir},
			{name: "dir/a", body: "a"},
		},
		[]ent{
			{name: "etc/.wh.gone"},
			{name: "opq/", typ: tar.TypeDir},
			// An entry of this layer listed before the marker survives it.
			{name: "opq/before", body: "before"},
			{name: "opq/.wh..wh..opq"},
			{name: "opq/after", body: "after"},
			{name: ".wh.dir"},
			{name: ".wh..wh.plnk"}, // AUFS bookkeeping: ignored
		},
	)
	for _, p := range []string{"etc/gone", "opq/lower", "opq/sub", "dir", ".wh.dir", "etc/.wh.gone", "opq/.wh..wh..opq", ".wh..wh.plnk"} {
		if exists(filepath.Join(root, p)) {
			t.Errorf("%s exists after the whiteout", p)
		}
	}
	for p, want := range map[string]string{"etc/keep": "keep", "opq/before": "before", "opq/after": "after"} {
		if got := readFile(t, filepath.Join(root, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
}

func TestFlattenOpaqueKeepsSameLayerSubtree(t *testing.T) {
	root := mustFlatten(t,
		[]ent{{name: "a/b/old", body: "old"}, {name: "a/x", body: "x"}},
		[]ent{{name: "a/b/", typ: tar.TypeDir}, {name: "a/b/new", body: "new"}, {name: "a/.wh..wh..opq"}},
	)
	if exists(filepath.Join(root, "a/b/old")) || exists(filepath.Join(root, "a/x")) {
		t.Error("lower content of an opaque directory survived")
	}
	if !exists(filepath.Join(root, "a/b/new")) {
		t.Error("the opaque layer's own a/b/new is gone")
	}
}

func TestFlattenReplaceAndLinks(t *testing.T) {
	root := mustFlatten(t,
		[]ent{
			{name: "x/", typ: tar.TypeDir},
			{name: "x/in", body: "in"},
			{name: "f", body: "first"},
			{name: "bin/", typ: tar.TypeDir, mode: 0o555},
			{name: "bin/tool", body: "#!/bin/sh\n", mode: 0o4755},
			{name: "bin/alias", typ: tar.TypeLink, link: "bin/tool"},
			{name: "lib", typ: tar.TypeSymlink, link: "/usr/lib"},
			{name: "usr/lib/", typ: tar.TypeDir},
		},
		[]ent{
			{name: "x", body: "now a file"}, // a file replaces a directory
			{name: "f", typ: tar.TypeSymlink, link: "x"},
			{name: "lib/libc.so", body: "libc"}, // through the absolute symlink, in-root
			{name: "bin/tool2", body: "2", mode: 0o700},
			{name: "p", typ: tar.TypeFifo, mode: 0o600},
		},
	)
	if got := readFile(t, filepath.Join(root, "x")); got != "now a file" {
		t.Errorf("x = %q", got)
	}
	if target, _ := os.Readlink(filepath.Join(root, "f")); target != "x" {
		t.Errorf("f -> %q, want x", target)
	}
	if got := readFile(t, filepath.Join(root, "usr/lib/libc.so")); got != "libc" {
		t.Errorf("usr/lib/libc.so = %q", got)
	}
	a, _ := os.Stat(filepath.Join(root, "bin/tool"))
	b, _ := os.Stat(filepath.Join(root, "bin/alias"))
	if !os.SameFile(a, b) {
		t.Error("bin/alias is not a hard link to bin/tool")
	}
	if a.Mode()&os.ModeSetuid == 0 || a.Mode().Perm() != 0o755 {
		t.Errorf("bin/tool mode %v, want setuid 0755", a.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(root, "bin")); fi.Mode().Perm() != 0o555 {
		t.Errorf("bin mode %v, want 0555 (applied after the last layer)", fi.Mode())
	}
	if fi, _ := os.Lstat(filepath.Join(root, "p")); fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("p is %v, want a fifo", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(root, "x")); !fi.ModTime().Equal(testTime) {
		t.Errorf("x mtime %v, want %v", fi.ModTime(), testTime)
	}
}

func TestFlattenOwnersAndXattrs(t *testing.T) {
	testutil.RequireRoot(t)
	root := mustFlatten(t, []ent{
		{name: "d/", typ: tar.TypeDir, uid: 7, gid: 8, xattrs: map[string]string{"user.dir": "yes"}},
		{name: "d/f", body: "f", uid: 1000, gid: 1001, mode: 0o2755, xattrs: map[string]string{
			"user.color":             "blue",
			"trusted.warren":         "t",
			"security.capability":    "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
			"trusted.overlay.opaque": "y", // dropped: overlay's own
		}},
		{name: "d/l", typ: tar.TypeSymlink, link: "f", uid: 5, gid: 6},
	})
	snap := strings.Join(snapshot(t, root, true), "\n")
	for _, want := range []string{
		"d drwxr-xr-x 7:8",
		"xattrs=user.dir=yes",
		"d/f grwxr-xr-x 1000:1001",
		"trusted.warren=t",
		"user.color=blue",
		"security.capability=",
		"d/l Lrwxrwxrwx 5:6",
	} {
		if !strings.Contains(snap, want) {
			t.Errorf("tree lacks %q:\n%s", want, snap)
		}
	}
	if strings.Contains(snap, "overlay") {
		t.Errorf("an overlay xattr was applied:\n%s", snap)
	}
}

func TestFlattenHostile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layers [][]ent
		want   string
	}{
		{"dotdot", [][]ent{{{name: "../../etc/passwd", body: "root::0:0::/:/bin/sh"}}}, "escapes the image root"},
		{"dotdot inside", [][]ent{{{name: "a/../../x", body: "x"}}}, "escapes the image root"},
		{"char device", [][]ent{{{name: "dev/null", typ: tar.TypeChar, major: 1}}}, "device nodes"},
		{"whiteout device", [][]ent{{{name: "x", typ: tar.TypeChar}}}, "device nodes"},
		{"block device", [][]ent{{{name: "sda", typ: tar.TypeBlock, major: 8}}}, "device nodes"},
		{"whiteout dotdot", [][]ent{{{name: "a/", typ: tar.TypeDir}}, {{name: "a/.wh.."}}}, "whiteout"},
		{"whiteout empty", [][]ent{{{name: ".wh."}}}, "whiteout"},
		{"hard link out", [][]ent{{{name: "l", typ: tar.TypeLink, link: "../../etc/passwd"}}}, "escapes"},
		{"hard link missing", [][]ent{{{name: "l", typ: tar.TypeLink, link: "/etc/passwd"}}}, "hard link target"},
		{"hard link dir", [][]ent{{{name: "d/", typ: tar.TypeDir}, {name: "l", typ: tar.TypeLink, link: "d"}}}, "is a directory"},
		{"file under file", [][]ent{{{name: "f", body: "f"}, {name: "f/g", body: "g"}}}, "not a directory"},
		{"root not a dir", [][]ent{{{name: ".", body: "x"}}}, "root must be a directory"},
		{"bad type", [][]ent{{{name: "x", typ: 'Z'}}}, "unsupported"},
		{"empty symlink", [][]ent{{{name: "x", typ: tar.TypeSymlink}}}, "symlink"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := flattenInto(t, DefaultLimits, tc.layers...)
			wantInvalid(t, err, tc.want)
		})
	}
}

// A symlink planted by one layer must not carry a later write out of the
// root, whether absolute or climbing with "..".
func TestFlattenSymlinkEscapes(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	inRoot := strings.TrimPrefix(outside, "/") + "/"
	for _, link := range []string{outside, "../../../../../../../.." + outside, "/"} {
		t.Run(link, func(t *testing.T) {
			// The link's target exists inside the root too: writes through
			// it must land there.
			root := mustFlatten(t,
				[]ent{{name: inRoot, typ: tar.TypeDir}, {name: inRoot + "victim"}, {name: "evil", typ: tar.TypeSymlink, link: link}},
				[]ent{{name: "evil/planted", body: "x"}, {name: "evil/.wh.victim"}},
			)
			if exists(filepath.Join(outside, "planted")) || !exists(victim) {
				t.Fatal("the archive reached outside the root")
			}
			dir := filepath.Join(root, outside)
			if link == "/" {
				dir = root
			}
			if !exists(filepath.Join(dir, "planted")) {
				t.Errorf("planted is not in %s", dir)
			}
			if link != "/" && exists(filepath.Join(dir, "victim")) {
				t.Errorf("the whiteout through the link did not remove the in-root victim")
			}
		})
	}
	t.Run("dangling", func(t *testing.T) {
		_, err := flattenInto(t, DefaultLimits,
			[]ent{{name: "evil", typ: tar.TypeSymlink, link: outside + "/sub"}},
			[]ent{{name: "evil/.wh.victim"}, {name: "evil/planted", body: "x"}},
		)
		wantInvalid(t, err, "parent")
		if exists(filepath.Join(outside, "sub")) || !exists(victim) {
			t.Fatal("the archive reached outside the root")
		}
	})
}

func TestFlattenLimits(t *testing.T) {
	big := []ent{{name: "a", body: strings.Repeat("x", 100)}, {name: "b", body: strings.Repeat("y", 100)}}
	_, err := flattenInto(t, Limits{MaxBytes: 150}, big)
	wantInvalid(t, err, "too large")
	if errdefs.Code(err) != codeTooLarge {
		t.Errorf("code %q, want %q", errdefs.Code(err), codeTooLarge)
	}
	many := make([]ent, 50)
	for i := range many {
		many[i] = ent{name: "f" + strings.Repeat("x", i)}
	}
	_, err = flattenInto(t, Limits{MaxEntries: 20}, many)
	wantInvalid(t, err, "more than 20 entries")
	_, err = flattenInto(t, Limits{MaxLayers: 1}, big, big)
	wantInvalid(t, err, "2 layers")
}

func TestFlattenCorrupt(t *testing.T) {
	good := tarBytes(t, ent{name: "a", body: strings.Repeat("x", 2000)}, ent{name: "b", body: "b"})
	for name, data := range map[string][]byte{
		"truncated in a file": good[:1024],
		"garbage header":      bytes.Repeat([]byte{0x5a}, 1024),
		"bad checksum":        append(append([]byte{}, good[:148]...), append([]byte("99999999"), good[156:]...)...),
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			err := Flatten(context.Background(), root, []Layer{memLayer(data)}, DefaultLimits)
			wantInvalid(t, err, "")
		})
	}
	t.Run("open fails", func(t *testing.T) {
		err := Flatten(context.Background(), t.TempDir(), []Layer{failLayer{}}, DefaultLimits)
		wantInvalid(t, err, "layer 0")
	})
}

type failLayer struct{}

func (failLayer) Uncompressed() (io.ReadCloser, error) {
	return nil, errors.New("gzip: invalid header")
}

func TestFlattenCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Flatten(ctx, t.TempDir(), layersOf(t, []ent{{name: "a"}}), DefaultLimits)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestCleanName(t *testing.T) {
	for in, want := range map[string]string{
		"a/b": "a/b", "./a/": "a", "/abs/x": "abs/x", "a/../b": "b", ".": ".", "./": ".", "//x//y": "x/y",
	} {
		got, err := cleanName(in)
		if err != nil || got != want {
			t.Errorf("cleanName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "..", "../x", "a/../../x", "x\x00y"} {
		if _, err := cleanName(in); err == nil {
			t.Errorf("cleanName(%q): want an error", in)
		}
	}
}

func TestRemovedDirDoesNotKeepOldMode(t *testing.T) {
	root := mustFlatten(t,
		[]ent{{name: "d/", typ: tar.TypeDir, mode: 0o700}},
		[]ent{{name: ".wh.d"}, {name: "d/f", body: "f"}}, // d comes back implicitly
	)
	fi, err := os.Stat(filepath.Join(root, "d"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("d mode %v, want 0755 (not the whited-out directory's 0700)", fi.Mode().Perm())
	}
	snap := snapshot(t, root, false)
	if !slices.ContainsFunc(snap, func(s string) bool { return strings.HasPrefix(s, "d/f ") }) {
		t.Errorf("d/f missing: %v", snap)
	}
}
