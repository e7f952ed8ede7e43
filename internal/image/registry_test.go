package image_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

func newBlobs(t *testing.T) *blob.Dir {
	t.Helper()
	d, err := blob.NewDir(t.TempDir())
	must(t, err)
	return d
}

func putBlob(t *testing.T, bs blob.Store, content string) string {
	t.Helper()
	d, _, err := bs.Put(context.Background(), strings.NewReader(content))
	must(t, err)
	return d
}

// putCounter counts the blobs actually written (Puts).
type putCounter struct {
	blob.Store
	puts atomic.Int64
}

func (p *putCounter) Put(ctx context.Context, r io.Reader) (string, int64, error) {
	p.puts.Add(1)
	return p.Store.Put(ctx, r)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newRegistry returns a registry over a memory store and a counted Dir.
func newRegistry(t *testing.T) (*image.Registry, *putCounter) {
	t.Helper()
	testutil.RequireBinary(t, "mkfs.erofs")
	bs := &putCounter{Store: newBlobs(t)}
	return image.NewRegistry(store.Memory(), bs, image.WithWorkDir(t.TempDir()), image.WithGCGrace(0), image.WithLogger(quiet)), bs
}

// tree writes files (path -> content) under a new directory.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, body := range files {
		full := filepath.Join(dir, p)
		must(t, os.MkdirAll(filepath.Dir(full), 0o755))
		must(t, os.WriteFile(full, []byte(body), 0o644))
	}
	return dir
}

func mkLayer(t *testing.T, r *image.Registry, kind, ref string, files map[string]string) api.Layer {
	t.Helper()
	name, version, _ := strings.Cut(ref, "@")
	l, err := r.BuildLayer(context.Background(), image.LayerSpec{Name: name, Version: version, Kind: kind}, tree(t, files))
	if err != nil {
		t.Fatalf("build %s: %v", ref, err)
	}
	return l
}

func wantCode(t *testing.T, what string, err, kind error, code string) {
	t.Helper()
	if !errors.Is(err, kind) || (code != "" && errdefs.Code(err) != code) {
		t.Errorf("%s: got %v (code %q), want %v %s", what, err, errdefs.Code(err), kind, code)
	}
}

func TestValidateName(t *testing.T) {
	good := []string{"busybox", "team/env", "a", "py3.12-slim", "x/y/z", strings.Repeat("a", 255)}
	bad := []string{"", "Busybox", "-x", ".x", "/x", "x/", "a//b", "a/../b", "a/./b", "a b", "a\x00", "é",
		"debian:12", "env@v2", strings.Repeat("a", 256)}
	for _, n := range good {
		if err := image.ValidateName(n); err != nil {
			t.Errorf("ValidateName(%q): %v, want ok", n, err)
		}
	}
	for _, n := range bad {
		if err := image.ValidateName(n); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ValidateName(%q): got %v, want ErrInvalid", n, err)
		}
	}
}

func TestParseRef(t *testing.T) {
	if r, err := image.ParseRef("debian-python@12", false); err != nil || r.Name != "debian-python" || r.Version != "12" {
		t.Errorf("ParseRef: got %+v, %v", r, err)
	}
	if r, err := image.ParseRef("team/x", true); err != nil || r.Name != "team/x" || r.Version != "" {
		t.Errorf("ParseRef(latest): got %+v, %v", r, err)
	}
	for _, s := range []string{"x", "x@", "x@-1", "x@a b", "x@1@2", "@1", "X@1"} {
		if _, err := image.ParseRef(s, false); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseRef(%q): got %v, want ErrInvalid", s, err)
		}
	}
}

func TestCompareVersions(t *testing.T) {
	ordered := []string{"1", "1.2", "1.9", "1.10", "2", "2a", "2b", "10", "010a", "12-rc1", "12.0"}
	for i := 0; i+1 < len(ordered); i++ {
		if c := image.CompareVersions(ordered[i], ordered[i+1]); c >= 0 {
			t.Errorf("CompareVersions(%q, %q) = %d, want < 0", ordered[i], ordered[i+1], c)
		}
		if c := image.CompareVersions(ordered[i+1], ordered[i]); c <= 0 {
			t.Errorf("CompareVersions(%q, %q) = %d, want > 0", ordered[i+1], ordered[i], c)
		}
	}
	if image.CompareVersions("7", "7") != 0 {
		t.Error("CompareVersions(7, 7) != 0")
	}
}

func TestBuildLayer(t *testing.T) {
	ctx := context.Background()
	r, bs := newRegistry(t)
	l := mkLayer(t, r, api.LayerBase, "base@1", map[string]string{"etc/os-release": "ID=test\n", "bin/tool": "#!/bin/sh\n"})
	if l.Ref != "base@1" || l.Kind != api.LayerBase || l.Size == 0 || l.Chunks == 0 || l.CreatedAt.IsZero() {
		t.Fatalf("BuildLayer: got %+v", l)
	}
	got, err := r.GetLayer(ctx, "base@1")
	must(t, err)
	if got.Digest != l.Digest || got.ImageDigest != l.ImageDigest {
		t.Fatalf("GetLayer: got %+v, want %+v", got, l)
	}
	if latest, err := r.GetLayer(ctx, "base"); err != nil || latest.Ref != "base@1" {
		t.Fatalf("GetLayer(latest): got %+v, %v", latest, err)
	}

	// The manifest alone lets a node assemble the image.
	m, err := image.ReadManifest(ctx, bs, l.Digest)
	must(t, err)
	if m.Image != l.ImageDigest || m.Size != l.Size || len(m.Chunks) != l.Chunks || m.Kind != api.LayerBase || m.ChunkSize != image.ChunkSize {
		t.Fatalf("manifest %+v does not match layer %+v", m, l)
	}
	c := image.NewCache(t.TempDir(), bs)
	f, err := c.Fetch(ctx, l.Digest)
	must(t, err)
	b, err := os.ReadFile(f.Path)
	must(t, err)
	if blob.FromBytes(b) != l.ImageDigest {
		t.Fatalf("assembled image: digest %s, want %s", blob.FromBytes(b), l.ImageDigest)
	}

	// Same name@version again: refused before any blob is written.
	before := bs.puts.Load()
	_, err = r.BuildLayer(ctx, image.LayerSpec{Name: "base", Version: "1", Kind: api.LayerBase}, tree(t, map[string]string{"x": "y"}))
	wantCode(t, "build existing", err, errdefs.ErrConflict, api.CodeLayerExists)
	if bs.puts.Load() != before {
		t.Errorf("a refused build wrote %d blobs", bs.puts.Load()-before)
	}
	if _, err := r.GetLayer(ctx, "nope@1"); !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != api.CodeLayerNotFound {
		t.Errorf("GetLayer missing: got %v", err)
	}
}

// TestPublishRaceOneWinner: two publishes of one name@version at once end
// with exactly one layer, and the loser gets layer_exists.
func TestPublishRaceOneWinner(t *testing.T) {
	r, _ := newRegistry(t)
	src := tree(t, map[string]string{"a": "same"})
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.BuildLayer(context.Background(), image.LayerSpec{Name: "raced", Version: "1", Kind: api.LayerToolkit}, src)
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
		} else {
			wantCode(t, "losing publish", err, errdefs.ErrConflict, api.CodeLayerExists)
		}
	}
	if ok != 1 {
		t.Fatalf("%d publishes succeeded, want 1 (%v)", ok, errs)
	}
}

// failingStore fails every Put after the first n.
type failingStore struct {
	blob.Store
	n atomic.Int64
}

func (f *failingStore) Put(ctx context.Context, r io.Reader) (string, int64, error) {
	if f.n.Add(-1) < 0 {
		return "", 0, errors.New("disk on fire")
	}
	return f.Store.Put(ctx, r)
}

// TestHalfWrittenLayerInvisible: a publish that fails after writing some
// chunks leaves no layer, and a retry completes it.
func TestHalfWrittenLayerInvisible(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs")
	ctx := context.Background()
	fs := &failingStore{Store: newBlobs(t)}
	fs.n.Store(2)
	st := store.Memory()
	r := image.NewRegistry(st, fs, image.WithWorkDir(t.TempDir()), image.WithLogger(quiet))
	big := make([]byte, 3<<20)
	rand.Read(big)
	src := tree(t, map[string]string{"big": string(big)})
	spec := image.LayerSpec{Name: "half", Version: "1", Kind: api.LayerBase}
	if _, err := r.BuildLayer(ctx, spec, src); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("BuildLayer over a failing store: got %v", err)
	}
	if _, err := r.GetLayer(ctx, "half@1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("half-written layer is visible: %v", err)
	}
	if pins, _ := st.List(ctx, "/gc/"); len(pins) != 0 {
		t.Errorf("failed publish left %d GC records", len(pins))
	}
	fs.n.Store(1 << 30)
	l, err := r.BuildLayer(ctx, spec, src)
	must(t, err)
	if _, err := image.NewCache(t.TempDir(), fs).Fetch(ctx, l.Digest); err != nil {
		t.Fatalf("Fetch after retry: %v", err)
	}
}

func tarball(t *testing.T, gz bool, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, h := range entries {
		must(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	must(t, tw.Close())
	if zw != nil {
		must(t, zw.Close())
	}
	return buf.Bytes()
}

func TestBuildLayerFromTar(t *testing.T) {
	ctx := context.Background()
	r, bs := newRegistry(t)
	file := &tar.Header{Name: "opt/tool/run.sh", Typeflag: tar.TypeReg, Mode: 0o755, Size: 5, Uid: 1000, Gid: 1000, ModTime: time.Unix(1e9, 0)}
	for i, gz := range []bool{false, true} {
		spec := image.LayerSpec{Name: "tk", Version: []string{"1", "2"}[i], Kind: api.LayerToolkit}
		l, err := r.BuildLayerFromTar(ctx, spec, bytes.NewReader(tarball(t, gz, file)))
		if err != nil {
			t.Fatalf("BuildLayerFromTar(gzip=%v): %v", gz, err)
		}
		if l.Kind != api.LayerToolkit || l.Size == 0 {
			t.Fatalf("got %+v", l)
		}
	}

	good := tarball(t, true, file)
	cases := []struct {
		name string
		body []byte
		spec image.LayerSpec
	}{
		{"empty body", nil, image.LayerSpec{}},
		{"not a tar", []byte(strings.Repeat("garbage ", 200)), image.LayerSpec{}},
		{"truncated gzip", good[:len(good)/2], image.LayerSpec{}},
		{"bad gzip checksum", append(append([]byte{}, good[:len(good)-8]...), 1, 2, 3, 4, 5, 6, 7, 8), image.LayerSpec{}},
		{"no entries", tarball(t, false), image.LayerSpec{}},
		{"device node", tarball(t, false, &tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o600}), image.LayerSpec{}},
		{"bad kind", good, image.LayerSpec{Kind: "tool"}},
		{"bad name", good, image.LayerSpec{Name: "Tools"}},
		{"bad version", good, image.LayerSpec{Version: "-1"}},
		{"diff without parent", good, image.LayerSpec{Kind: api.LayerDiff}},
		{"parent of a base", good, image.LayerSpec{Kind: api.LayerBase, Parent: "tk@1"}},
	}
	for i, tc := range cases {
		spec := image.LayerSpec{Name: "bad", Version: string(rune('a' + i)), Kind: api.LayerBase}
		if tc.spec.Kind != "" {
			spec.Kind = tc.spec.Kind
		}
		if tc.spec.Name != "" {
			spec.Name = tc.spec.Name
		}
		if tc.spec.Version != "" {
			spec.Version = tc.spec.Version
		}
		spec.Parent = tc.spec.Parent
		before := bs.puts.Load()
		_, err := r.BuildLayerFromTar(ctx, spec, bytes.NewReader(tc.body))
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", tc.name, err)
		}
		if bs.puts.Load() != before {
			t.Errorf("%s: wrote %d blobs", tc.name, bs.puts.Load()-before)
		}
	}
	_, err := r.BuildLayer(ctx, image.LayerSpec{Name: "missing", Version: "1", Kind: api.LayerBase}, filepath.Join(t.TempDir(), "nope"))
	wantCode(t, "missing dir", err, errdefs.ErrInvalid, "build_source_not_found")
	if l, _ := r.ListLayers(ctx); len(l) != 2 {
		t.Errorf("ListLayers after refused builds: %d layers, want 2", len(l))
	}
}

// TestDiffLayer: a diff names its parent in its manifest, and the parent
// cannot be deleted under it.
func TestDiffLayer(t *testing.T) {
	ctx := context.Background()
	r, bs := newRegistry(t)
	base := mkLayer(t, r, api.LayerBase, "b@1", map[string]string{"a": "1"})
	d, err := r.BuildLayer(ctx, image.LayerSpec{Name: "snap", Version: "1", Kind: api.LayerDiff, Parent: "b@1"}, tree(t, map[string]string{"a": "2"}))
	must(t, err)
	if d.Parent != base.Digest {
		t.Fatalf("diff parent: got %s, want %s", d.Parent, base.Digest)
	}
	m, err := image.ReadManifest(ctx, bs, d.Digest)
	must(t, err)
	if m.Parent != base.Digest {
		t.Fatalf("manifest parent: got %s, want %s", m.Parent, base.Digest)
	}
	wantCode(t, "delete a diff's parent", r.DeleteLayer(ctx, "b@1", nil), errdefs.ErrConflict, api.CodeLayerInUse)
	must(t, r.DeleteLayer(ctx, "snap@1", nil))
	must(t, r.DeleteLayer(ctx, "b@1", nil))
}

func TestEnvironments(t *testing.T) {
	ctx := context.Background()
	r, _ := newRegistry(t)
	base := mkLayer(t, r, api.LayerBase, "debian-python@12", map[string]string{"etc/os": "debian"})
	ws := mkLayer(t, r, api.LayerWorkspace, "swe-task-0042@1", map[string]string{"work/task.py": "print(1)"})
	h7 := mkLayer(t, r, api.LayerToolkit, "harness@7", map[string]string{"opt/harness/v": "7"})
	tools := mkLayer(t, r, api.LayerToolkit, "tools@1", map[string]string{"opt/tools/v": "1"})

	env, err := r.CreateEnv(ctx, api.CreateEnvironmentRequest{
		Name: "swe-task-0042", Version: "1", Base: "debian-python@12", Workspace: "swe-task-0042",
		Toolkits: []string{"harness@7", "tools@1"}, Env: map[string]string{"PYTHONUNBUFFERED": "1"},
		Workdir: "/work/", User: "1000:1000", Entrypoint: []string{"python3"},
	})
	must(t, err)
	wantLayers := []string{base.Digest, ws.Digest, h7.Digest, tools.Digest}
	if len(env.Layers) != 4 || env.Workdir != "/work" || env.Layers[1].Ref != "swe-task-0042@1" {
		t.Fatalf("CreateEnv: got %+v", env)
	}
	for i, l := range env.Layers {
		if l.Digest != wantLayers[i] {
			t.Errorf("layer %d: got %s, want %s (base, workspace, toolkits in order)", i, l.Ref, wantLayers[i])
		}
	}
	if env.Size != base.Size+ws.Size+h7.Size+tools.Size {
		t.Errorf("Size: got %d", env.Size)
	}

	// The node's view: an image with the layer digests and defaults.
	img, err := r.Get(ctx, "swe-task-0042@1")
	must(t, err)
	if img.Name != "swe-task-0042@1" || len(img.Layers) != 4 || img.Layers[3] != tools.Digest ||
		img.Env["PYTHONUNBUFFERED"] != "1" || img.Workdir != "/work" || img.User != "1000:1000" {
		t.Fatalf("Get: got %+v", img)
	}
	_, err = r.Get(ctx, "swe-task-0042@9")
	wantCode(t, "Get missing", err, errdefs.ErrNotFound, api.CodeImageNotFound)
	_, err = r.GetEnv(ctx, "swe-task-0042@9")
	wantCode(t, "GetEnv missing", err, errdefs.ErrNotFound, api.CodeEnvNotFound)

	_, err = r.CreateEnv(ctx, api.CreateEnvironmentRequest{Name: "swe-task-0042", Version: "1", Base: "debian-python@12"})
	wantCode(t, "create existing", err, errdefs.ErrConflict, api.CodeEnvExists)

	bad := []struct {
		name string
		req  api.CreateEnvironmentRequest
		kind error
		code string
	}{
		{"no base", api.CreateEnvironmentRequest{Name: "e", Version: "1"}, errdefs.ErrInvalid, ""},
		{"no version", api.CreateEnvironmentRequest{Name: "e", Base: "debian-python@12"}, errdefs.ErrInvalid, ""},
		{"base of wrong kind", api.CreateEnvironmentRequest{Name: "e", Version: "1", Base: "harness@7"}, errdefs.ErrInvalid, ""},
		{"toolkit of wrong kind", api.CreateEnvironmentRequest{Name: "e", Version: "1", Base: "debian-python@12", Toolkits: []string{"swe-task-0042@1"}}, errdefs.ErrInvalid, ""},
		{"toolkit twice", api.CreateEnvironmentRequest{Name: "e", Version: "1", Base: "debian-python@12", Toolkits: []string{"harness@7", "harness@7"}}, errdefs.ErrInvalid, ""},
		{"missing layer", api.CreateEnvironmentRequest{Name: "e", Version: "1", Base: "debian-python@13"}, errdefs.ErrNotFound, api.CodeLayerNotFound},
		{"relative workdir", api.CreateEnvironmentRequest{Name: "e", Version: "1", Base: "debian-python@12", Workdir: "work"}, errdefs.ErrInvalid, ""},
		{"bad env", api.CreateEnvironmentRequest{Name: "e", Version: "1", Base: "debian-python@12", Env: map[string]string{"A=B": "1"}}, errdefs.ErrInvalid, ""},
		{"bad user", api.CreateEnvironmentRequest{Name: "e", Version: "1", Base: "debian-python@12", User: "root; rm -rf"}, errdefs.ErrInvalid, ""},
		{"missing from", api.CreateEnvironmentRequest{From: "nope@1"}, errdefs.ErrNotFound, api.CodeEnvNotFound},
	}
	for _, tc := range bad {
		_, err := r.CreateEnv(ctx, tc.req)
		wantCode(t, tc.name, err, tc.kind, tc.code)
	}

	// Deriving: harness@8 replaces harness@7 in place, the rest is shared.
	h8 := mkLayer(t, r, api.LayerToolkit, "harness@8", map[string]string{"opt/harness/v": "8"})
	env2, err := r.CreateEnv(ctx, api.CreateEnvironmentRequest{From: "swe-task-0042@1", Toolkits: []string{"harness@8"}, Env: map[string]string{"X": "y"}})
	must(t, err)
	if env2.Ref != "swe-task-0042@2" || env2.Layers[2].Digest != h8.Digest || env2.Layers[3].Digest != tools.Digest ||
		env2.Layers[0].Digest != base.Digest || env2.Workdir != "/work" || env2.Env["PYTHONUNBUFFERED"] != "1" || env2.Env["X"] != "y" {
		t.Fatalf("derived env: got %+v", env2)
	}
	if img, _ := r.Get(ctx, "swe-task-0042"); img.Name != "swe-task-0042@2" {
		t.Errorf("latest: got %s, want swe-task-0042@2", img.Name)
	}

	list, err := r.ListEnvs(ctx)
	must(t, err)
	if len(list) != 2 || list[0].Ref != "swe-task-0042@1" || list[1].Ref != "swe-task-0042@2" {
		t.Fatalf("ListEnvs: got %+v", list)
	}
	layers, err := r.ListLayers(ctx)
	must(t, err)
	used := map[string][]string{}
	for _, l := range layers {
		used[l.Ref] = l.UsedBy
	}
	if u := used["harness@7"]; len(u) != 1 || u[0] != "swe-task-0042@1" {
		t.Errorf("harness@7 used by %v", u)
	}
	if u := used["debian-python@12"]; len(u) != 2 {
		t.Errorf("debian-python@12 used by %v, want both versions", u)
	}

	// An explicit layer stack, bottom first.
	img, err = r.ResolveLayers(ctx, []string{"debian-python@12", "harness"})
	must(t, err)
	if img.Name != "debian-python@12+harness@8" || len(img.Layers) != 2 || img.Layers[1] != h8.Digest {
		t.Fatalf("ResolveLayers: got %+v", img)
	}
	_, err = r.ResolveLayers(ctx, []string{"debian-python@12", "nope@1"})
	wantCode(t, "ResolveLayers missing", err, errdefs.ErrNotFound, api.CodeLayerNotFound)
	_, err = r.ResolveLayers(ctx, []string{"harness@8", "harness@8"})
	wantCode(t, "ResolveLayers twice", err, errdefs.ErrInvalid, "")

	must(t, r.DeleteEnv(ctx, "swe-task-0042@2"))
	wantCode(t, "DeleteEnv again", r.DeleteEnv(ctx, "swe-task-0042@2"), errdefs.ErrNotFound, api.CodeEnvNotFound)
	wantCode(t, "DeleteEnv latest", r.DeleteEnv(ctx, "swe-task-0042"), errdefs.ErrInvalid, "")
}

// TestToolkitUpgradeIsO1: publishing harness@8 and re-pointing 100
// environments at it builds one layer and writes no other blob.
func TestToolkitUpgradeIsO1(t *testing.T) {
	ctx := context.Background()
	r, bs := newRegistry(t)
	mkLayer(t, r, api.LayerBase, "base@1", map[string]string{"etc/os": "x"})
	mkLayer(t, r, api.LayerToolkit, "harness@7", map[string]string{"opt/h": "7"})
	const n = 100
	for i := range n {
		name := "task-" + string(rune('a'+i/26)) + string(rune('a'+i%26))
		mkLayer(t, r, api.LayerWorkspace, name+"@1", map[string]string{"work/id": name})
		_, err := r.CreateEnv(ctx, api.CreateEnvironmentRequest{Name: name, Version: "1", Base: "base@1", Workspace: name + "@1", Toolkits: []string{"harness@7"}})
		must(t, err)
	}
	blobsBefore, _ := bs.List(ctx)
	putsBefore := bs.puts.Load()

	h8 := mkLayer(t, r, api.LayerToolkit, "harness@8", map[string]string{"opt/h": "8"})
	layerPuts := bs.puts.Load() - putsBefore
	if want := int64(h8.Chunks + 1); layerPuts > want {
		t.Fatalf("building harness@8 wrote %d blobs, want at most %d (its chunks and manifest)", layerPuts, want)
	}

	envs, err := r.ListEnvs(ctx)
	must(t, err)
	putsBefore = bs.puts.Load()
	start := time.Now()
	for _, e := range envs {
		got, err := r.CreateEnv(ctx, api.CreateEnvironmentRequest{From: e.Ref, Toolkits: []string{"harness@8"}})
		must(t, err)
		if top := got.Layers[len(got.Layers)-1]; top.Digest != h8.Digest || got.Version != "2" {
			t.Fatalf("%s: got %+v", got.Ref, got)
		}
	}
	elapsed := time.Since(start)
	if d := bs.puts.Load() - putsBefore; d != 0 {
		t.Fatalf("re-pointing %d environments wrote %d blobs, want 0", n, d)
	}
	blobsAfter, _ := bs.List(ctx)
	if got, want := len(blobsAfter), len(blobsBefore)+int(layerPuts); got != want {
		t.Errorf("blob store: %d blobs, want %d (the one new layer's only)", got, want)
	}
	t.Logf("re-pointed %d environments in %v, 0 blobs written; harness@8 build wrote %d blobs", n, elapsed, layerPuts)
}

// TestDeleteAndGC: delete refusals by reference, then collection of what
// only the deleted layer used, keeping what other layers share.
func TestDeleteAndGC(t *testing.T) {
	ctx := context.Background()
	r, bs := newRegistry(t)
	shared := make([]byte, 2<<20)
	rand.Read(shared)
	keep := mkLayer(t, r, api.LayerBase, "keep@1", map[string]string{"shared.bin": string(shared), "k": "keep"})
	gone := mkLayer(t, r, api.LayerToolkit, "gone@1", map[string]string{"shared.bin": string(shared), "g": "gone"})
	_, err := r.CreateEnv(ctx, api.CreateEnvironmentRequest{Name: "e", Version: "1", Base: "keep@1", Toolkits: []string{"gone@1"}})
	must(t, err)

	wantCode(t, "delete used by env", r.DeleteLayer(ctx, "gone@1", nil), errdefs.ErrConflict, api.CodeLayerInUse)
	must(t, r.DeleteEnv(ctx, "e@1"))
	live := map[string][]string{gone.Digest: {"n1-aaaaaaaaaaaaaaaa"}}
	err = r.DeleteLayer(ctx, "gone@1", live)
	wantCode(t, "delete used by sandbox", err, errdefs.ErrConflict, api.CodeLayerInUse)
	if err == nil || !strings.Contains(err.Error(), "n1-aaaaaaaaaaaaaaaa") {
		t.Errorf("in-use error does not name the sandbox: %v", err)
	}
	wantCode(t, "delete latest", r.DeleteLayer(ctx, "gone", nil), errdefs.ErrInvalid, "")

	// A sandbox still using the layer's digest keeps its blobs.
	must(t, r.DeleteLayer(ctx, "gone@1", nil))
	res, err := r.GC(ctx, live)
	must(t, err)
	if res.Deleted != 0 {
		t.Fatalf("GC with the layer still live deleted %d blobs", res.Deleted)
	}
	// The sandbox is gone: the layer's own chunks go, shared ones stay.
	mGone, err := image.ReadManifest(ctx, bs, gone.Digest)
	must(t, err)
	mKeep, err := image.ReadManifest(ctx, bs, keep.Digest)
	must(t, err)
	kept := map[string]bool{keep.Digest: true}
	for _, c := range mKeep.Chunks {
		kept[c.Digest] = true
	}
	wantGone := map[string]bool{gone.Digest: true}
	for _, c := range mGone.Chunks {
		if !kept[c.Digest] {
			wantGone[c.Digest] = true
		}
	}
	res, err = r.GC(ctx, nil)
	must(t, err)
	if res.Deleted != len(wantGone) || res.Live != len(kept) {
		t.Fatalf("GC: got %+v, want %d deleted and %d live", res, len(wantGone), len(kept))
	}
	for d := range wantGone {
		if _, err := bs.Stat(ctx, d); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("blob %s of the deleted layer survived GC", d)
		}
	}
	if _, err := image.NewCache(t.TempDir(), bs).Fetch(ctx, keep.Digest); err != nil {
		t.Fatalf("the kept layer no longer assembles: %v", err)
	}
	if res, _ := r.GC(ctx, nil); res.Deleted != 0 {
		t.Errorf("second GC deleted %d", res.Deleted)
	}
}

// TestGCGrace: unreferenced but young blobs stay.
func TestGCGrace(t *testing.T) {
	ctx := context.Background()
	bs := newBlobs(t)
	r := image.NewRegistry(store.Memory(), bs, image.WithGCGrace(time.Hour), image.WithLogger(quiet))
	d := putBlob(t, bs, "stray")
	res, err := r.GC(ctx, nil)
	must(t, err)
	if res.Young != 1 || res.Deleted != 0 {
		t.Fatalf("GC of a young stray: %+v", res)
	}
	p, _ := bs.Path(d)
	old := time.Now().Add(-2 * time.Hour)
	must(t, os.Chtimes(p, old, old))
	if res, _ := r.GC(ctx, nil); res.Deleted != 1 {
		t.Fatalf("GC of an old stray: %+v", res)
	}
}

func TestEnsureBusybox(t *testing.T) {
	requireBusybox(t)
	testutil.RequireBinary(t, "mkfs.erofs")
	ctx := context.Background()
	bs := newBlobs(t)
	st := store.Memory()
	work := t.TempDir()

	img, err := image.NewRegistry(st, bs, image.WithLogger(quiet)).EnsureBusybox(ctx, work)
	must(t, err)
	if img.Name != "busybox@1" || len(img.Layers) != 1 || img.Size == 0 {
		t.Fatalf("EnsureBusybox: got %+v", img)
	}
	m, err := image.ReadManifest(ctx, bs, img.Layers[0])
	if err != nil || m.Size != img.Size || m.Kind != api.LayerBase {
		t.Fatalf("busybox manifest: %+v, %v", m, err)
	}
	if left, _ := os.ReadDir(work); len(left) != 0 {
		t.Errorf("work dir: %d entries left behind", len(left))
	}
	again, err := image.NewRegistry(st, bs, image.WithLogger(quiet)).EnsureBusybox(ctx, work)
	must(t, err)
	if !again.CreatedAt.Equal(img.CreatedAt) || again.Layers[0] != img.Layers[0] {
		t.Errorf("second EnsureBusybox: got %+v, want the first image %+v", again, img)
	}
}

// TestEnsureBusyboxRace: registries sharing one store and blob store stand
// for processes racing at first start; all must end with one image and
// one layer.
func TestEnsureBusyboxRace(t *testing.T) {
	requireBusybox(t)
	testutil.RequireBinary(t, "mkfs.erofs")
	ctx := context.Background()
	bs := newBlobs(t)
	st := store.Memory()
	const racers = 3
	imgs := make([]api.Image, racers)
	errs := make([]error, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			imgs[i], errs[i] = image.NewRegistry(st, bs, image.WithLogger(quiet)).EnsureBusybox(ctx, filepath.Join(t.TempDir(), "work"))
		}()
	}
	wg.Wait()
	for i := range racers {
		if errs[i] != nil {
			t.Fatalf("racer %d: %v", i, errs[i])
		}
		if imgs[i].Layers[0] != imgs[0].Layers[0] || !imgs[i].CreatedAt.Equal(imgs[0].CreatedAt) {
			t.Errorf("racer %d got %+v, racer 0 got %+v", i, imgs[i], imgs[0])
		}
	}
	m, err := image.ReadManifest(ctx, bs, imgs[0].Layers[0])
	must(t, err)
	if l, _ := bs.List(ctx); len(l) > len(m.Chunks)+1 {
		t.Errorf("blob store: got %d blobs, want at most %d (the build is reproducible)", len(l), len(m.Chunks)+1)
	}
}
