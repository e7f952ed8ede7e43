package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/warrenhq/warren/internal/errdefs"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz seed corpora")

// seedLayers are pairs of layers (lower, upper) that walk the paths of
// Flatten an attacker would try.
func seedLayers(t testing.TB) [][2][]byte {
	b := func(entries ...ent) []byte { return tarBytes(t, entries...) }
	empty := b()
	return [][2][]byte{
		{b(ent{name: "a/b", body: "x"}, ent{name: "l", typ: tar.TypeLink, link: "a/b"}), b(ent{name: "a/.wh.b"})},
		{b(ent{name: "../../etc/passwd", body: "x"}), empty},
		{b(ent{name: "evil", typ: tar.TypeSymlink, link: "/"}), b(ent{name: "evil/etc/x", body: "x"})},
		{b(ent{name: "evil", typ: tar.TypeSymlink, link: "../../.."}), b(ent{name: "evil/x", body: "x"}, ent{name: "evil/.wh.y"})},
		{b(ent{name: "dev/null", typ: tar.TypeChar, major: 1, mode: 0o666}), empty},
		{b(ent{name: "d/", typ: tar.TypeDir}, ent{name: "d/f", body: "f"}), b(ent{name: "d/.wh..wh..opq"}, ent{name: "d/g", body: "g"})},
		{b(ent{name: "d/", typ: tar.TypeDir}), b(ent{name: "d/.wh.."})},
		{b(ent{name: "x", typ: tar.TypeLink, link: "../../../etc/shadow"}), empty},
		{b(ent{name: "f", body: "f", xattrs: map[string]string{"user.a": "b", "trusted.overlay.opaque": "y"}}), b(ent{name: "f", typ: tar.TypeDir})},
		{b(ent{name: "ro/", typ: tar.TypeDir, mode: 0o500}), b(ent{name: "ro/x", body: "x"}, ent{name: ".wh.ro"})},
		{empty, []byte("not a tar at all")},
	}
}

// FuzzFlatten feeds two arbitrary layers to Flatten: it must never panic,
// must fail only with ErrInvalid, and must never write outside the root.
func FuzzFlatten(f *testing.F) {
	for _, s := range seedLayers(f) {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, lower, upper []byte) {
		parent := t.TempDir()
		root := filepath.Join(parent, "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		lim := Limits{MaxLayers: 2, MaxEntries: 1000, MaxBytes: 1 << 20}
		err := Flatten(context.Background(), root, []Layer{memLayer(lower), memLayer(upper)}, lim)
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("error not classified as ErrInvalid: %v", err)
		}
		onlyChild(t, parent, "root")
		removeTree(root)
	})
}

// FuzzOpenDockerArchive feeds arbitrary bytes as a docker-archive.
func FuzzOpenDockerArchive(f *testing.F) {
	f.Add(tarBytes(f, ent{name: "manifest.json", body: `[{"Config":"c.json","RepoTags":["a:1"],"Layers":["l.tar"]}]`},
		ent{name: "c.json", body: `{"os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:` + fmt.Sprintf("%064d", 0) + `"]}}`},
		ent{name: "l.tar", body: string(tarBytes(f, ent{name: "x", body: "x"}))}))
	f.Add(tarBytes(f, ent{name: "manifest.json", typ: tar.TypeSymlink, link: "manifest.json"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "a.tar")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		img, err := OpenDockerArchive(p, "", DefaultLimits)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("error not classified: %v", err)
			}
			return
		}
		root := t.TempDir()
		if err := Flatten(context.Background(), root, img.Layers, Limits{MaxEntries: 1000, MaxBytes: 1 << 20}); err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("flatten: error not classified: %v", err)
		}
	})
}

// TestWriteFuzzSeeds keeps testdata/fuzz/FuzzFlatten in step with
// seedLayers: go test -run TestWriteFuzzSeeds -update-seeds.
func TestWriteFuzzSeeds(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update-seeds to rewrite the corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzFlatten")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range seedLayers(t) {
		var buf bytes.Buffer
		fmt.Fprintf(&buf, "go test fuzz v1\n[]byte(%q)\n[]byte(%q)\n", s[0], s[1])
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
