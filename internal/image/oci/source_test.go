package oci

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warrenhq/warren/internal/errdefs"
)

// writeArchive writes imgs as a docker-archive tarball and returns its path.
func writeArchive(t testing.TB, imgs map[string]v1.Image) string {
	t.Helper()
	refs := map[name.Reference]v1.Image{}
	for tag, img := range imgs {
		tg, err := name.NewTag(tag)
		if err != nil {
			t.Fatal(err)
		}
		refs[tg] = img
	}
	p := filepath.Join(t.TempDir(), "app.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := tarball.MultiRefWrite(refs, f); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeLayout writes imgs as an OCI layout, each annotated with its ref.
func writeLayout(t testing.TB, imgs map[string]v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for ref, img := range imgs {
		var opts []layout.Option
		if ref != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{refAnnotation: ref}))
		}
		if err := lp.AppendImage(img, opts...); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

var appConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "APP=1"},
	WorkingDir: "/srv",
	User:       "1000:1000",
	Entrypoint: []string{"/bin/app"},
	Cmd:        []string{"--serve"},
}

func TestOpenDockerArchive(t *testing.T) {
	img := v1Image(t, appConfig, []ent{{name: "a", body: "1"}}, []ent{{name: "b", body: "2"}})
	p := writeArchive(t, map[string]v1.Image{"app:1.0": img})
	got, err := OpenDockerArchive(p, "", DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if got.Tag != "1.0" || len(got.Layers) != 2 || got.Config.WorkingDir != "/srv" {
		t.Errorf("got tag %q, %d layers, workdir %q", got.Tag, len(got.Layers), got.Config.WorkingDir)
	}
	id, _ := img.ConfigName()
	if got.ID != id.String() {
		t.Errorf("ID %s, want %s", got.ID, id)
	}

	other := v1Image(t, v1.Config{}, []ent{{name: "c", body: "3"}})
	multi := writeArchive(t, map[string]v1.Image{"app:1.0": img, "other:2": other})
	if _, err := OpenDockerArchive(multi, "", DefaultLimits); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "2 images") {
		t.Errorf("two images, no ref: got %v", err)
	}
	got, err = OpenDockerArchive(multi, "other:2", DefaultLimits)
	if err != nil || got.Tag != "2" || len(got.Layers) != 1 {
		t.Errorf("ref other:2: got %+v, %v", got, err)
	}
	if _, err := OpenDockerArchive(multi, "nope:1", DefaultLimits); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown ref: got %v, want ErrNotFound", err)
	}
	if _, err := OpenDockerArchive(p, "", Limits{MaxLayers: 1}); errdefs.Code(err) != codeTooLarge {
		t.Errorf("layer limit: got %v", err)
	}
}

func TestOpenDockerArchiveBad(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, entries ...ent) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, tarBytes(t, entries...), 0o644)
		return p
	}
	huge := filepath.Join(dir, "huge.tar")
	{
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "manifest.json", Size: maxMetaBytes + 1, Mode: 0o644})
		tw.Write(bytes.Repeat([]byte(" "), maxMetaBytes+1))
		tw.Close()
		os.WriteFile(huge, buf.Bytes(), 0o644)
	}
	garbage := filepath.Join(dir, "garbage.tar")
	os.WriteFile(garbage, bytes.Repeat([]byte("not a tar"), 200), 0o644)
	loop := write("loop.tar",
		ent{name: "manifest.json", body: `[{"Config":"c.json","RepoTags":["a:1"],"Layers":["l1"]}]`},
		ent{name: "c.json", typ: tar.TypeSymlink, link: "d.json"},
		ent{name: "d.json", typ: tar.TypeSymlink, link: "c.json"},
	)
	for name, tc := range map[string]struct{ path, want string }{
		"no manifest":    {write("nomanifest.tar", ent{name: "x", body: "x"}), "no manifest.json"},
		"bad json":       {write("badjson.tar", ent{name: "manifest.json", body: "{"}), "manifest.json"},
		"empty manifest": {write("empty.tar", ent{name: "manifest.json", body: "[]"}), "no image"},
		"missing config": {write("noconfig.tar", ent{name: "manifest.json", body: `[{"Config":"c.json","Layers":["l"]}]`}), "no file c.json"},
		"huge manifest":  {huge, "larger than"},
		"garbage":        {garbage, "not a readable tar"},
		"link loop":      {loop, "links to follow"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := OpenDockerArchive(tc.path, "", DefaultLimits)
			wantInvalid(t, err, tc.want)
		})
	}
}

func TestOpenLayout(t *testing.T) {
	img := v1Image(t, appConfig, []ent{{name: "a", body: "1"}})
	dir := writeLayout(t, map[string]v1.Image{"1.0": img})
	got, err := OpenLayout(dir, "", DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if got.Tag != "1.0" || len(got.Layers) != 1 || got.Config.User != "1000:1000" {
		t.Errorf("got %+v", got)
	}

	other := v1Image(t, v1.Config{}, []ent{{name: "c", body: "3"}})
	multi := writeLayout(t, map[string]v1.Image{"1.0": img, "docker.io/library/other:2": other})
	if _, err := OpenLayout(multi, "", DefaultLimits); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "2 images") {
		t.Errorf("two images, no ref: got %v", err)
	}
	got, err = OpenLayout(multi, "2", DefaultLimits)
	if err != nil || got.Tag != "2" {
		t.Errorf("ref 2: got %+v, %v", got, err)
	}
	if _, err := OpenLayout(multi, "3", DefaultLimits); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown ref: got %v", err)
	}

	// A multi-platform index: the linux/amd64 image is picked.
	arm := mutate.ConfigMediaType(other, "")
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	pdir := filepath.Join(t.TempDir(), "multiarch")
	lp, err := layout.Write(pdir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	got, err = OpenLayout(pdir, "", DefaultLimits)
	if err != nil || got.Config.WorkingDir != "/srv" {
		t.Errorf("multi-platform: got %+v, %v", got, err)
	}
}

func TestOpenLayoutBad(t *testing.T) {
	img := v1Image(t, appConfig, []ent{{name: "a", body: "1"}})
	for name, tc := range map[string]struct {
		mutate func(dir string)
		want   string
	}{
		"no oci-layout": {func(d string) { os.Remove(filepath.Join(d, "oci-layout")) }, "oci-layout"},
		"no index":      {func(d string) { os.Remove(filepath.Join(d, "index.json")) }, "index.json"},
		"bad index":     {func(d string) { os.WriteFile(filepath.Join(d, "index.json"), []byte("{"), 0o644) }, "index"},
		"huge index": {func(d string) {
			os.WriteFile(filepath.Join(d, "index.json"), bytes.Repeat([]byte(" "), maxMetaBytes+1), 0o644)
		}, "larger than"},
		"missing blobs": {func(d string) { os.RemoveAll(filepath.Join(d, "blobs")) }, "missing"},
		"symlinked blob": {func(d string) {
			ents, _ := os.ReadDir(filepath.Join(d, "blobs/sha256"))
			for _, e := range ents {
				p := filepath.Join(d, "blobs/sha256", e.Name())
				os.Remove(p)
				os.Symlink("/etc/passwd", p)
			}
		}, "not a regular file"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := writeLayout(t, map[string]v1.Image{"1": img})
			tc.mutate(dir)
			_, err := OpenLayout(dir, "", DefaultLimits)
			wantInvalid(t, err, tc.want)
		})
	}
}

func TestUnpackLayout(t *testing.T) {
	for name, tc := range map[string]struct {
		entries []ent
		want    string
	}{
		"symlink":    {[]ent{{name: "blobs", typ: tar.TypeSymlink, link: "/etc"}}, "only directories and regular files"},
		"hard link":  {[]ent{{name: "x", body: "x"}, {name: "y", typ: tar.TypeLink, link: "x"}}, "only directories"},
		"dotdot":     {[]ent{{name: "../x", body: "x"}}, "escapes"},
		"device":     {[]ent{{name: "x", typ: tar.TypeChar}}, "only directories"},
		"duplicate":  {[]ent{{name: "x", body: "x"}, {name: "x", body: "y"}}, "exists"},
		"empty":      {nil, "empty"},
		"file on it": {[]ent{{name: "x", body: "x"}, {name: "x/y", body: "y"}}, "oci-layout archive"},
	} {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "layout")
			os.Mkdir(dir, 0o755)
			err := UnpackLayout(bytes.NewReader(tarBytes(t, tc.entries...)), dir, 1<<20)
			wantInvalid(t, err, tc.want)
			onlyChild(t, parent, "layout")
		})
	}
	t.Run("too large", func(t *testing.T) {
		err := UnpackLayout(bytes.NewReader(tarBytes(t, ent{name: "x", body: strings.Repeat("x", 100)})), t.TempDir(), 50)
		if errdefs.Code(err) != codeTooLarge {
			t.Fatalf("got %v, want %s", err, codeTooLarge)
		}
	})
}

func TestTagOf(t *testing.T) {
	for in, want := range map[string]string{
		"1.0": "1.0", "docker.io/library/app:1.0": "1.0", "localhost:5000/app": "", "app@sha256:abc": "", "": "",
	} {
		if got := tagOf(in); got != want {
			t.Errorf("tagOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestVersionFor(t *testing.T) {
	id := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct{ tag, want string }{
		{"1.0", "1.0"},
		{"latest", "latest"},
		{"", "abababababab"},
		{"_private", "abababababab"}, // a valid tag, not a valid version
	} {
		if got := versionFor(&Image{Tag: tc.tag, ID: id}); got != tc.want {
			t.Errorf("versionFor(tag %q) = %q, want %q", tc.tag, got, tc.want)
		}
	}
	m := envMap([]string{"A=1", "B=x=y", "NOEQ", "A=2", "=bad"})
	if len(m) != 2 || m["A"] != "2" || m["B"] != "x=y" {
		t.Errorf("envMap = %v", m)
	}
	if got := envList(map[string]string{"B": "2", "A": "1"}); strings.Join(got, ",") != "A=1,B=2" {
		t.Errorf("envList = %v", got)
	}
}
