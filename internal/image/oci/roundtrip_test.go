package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/testutil"
)

// fakeStore keeps layers as EROFS files in a directory and environments
// in memory: what the importer needs of image.Registry, minus chunking.
type fakeStore struct {
	dir    string
	mu     sync.Mutex
	layers map[string]api.Layer // by ref
	files  map[string]string    // EROFS file by digest
	envs   map[string]api.Environment
}

func newFakeStore(t testing.TB) *fakeStore {
	return &fakeStore{dir: t.TempDir(), layers: map[string]api.Layer{}, files: map[string]string{}, envs: map[string]api.Environment{}}
}

func (s *fakeStore) BuildLayer(ctx context.Context, spec image.LayerSpec, srcDir string, opts ...image.BuildOption) (api.Layer, error) {
	ref := spec.Name + "@" + spec.Version
	s.mu.Lock()
	_, dup := s.layers[ref]
	s.mu.Unlock()
	if dup {
		return api.Layer{}, errdefs.New(errdefs.ErrConflict, api.CodeLayerExists, "layer %s exists", ref)
	}
	f, err := os.CreateTemp(s.dir, "layer-*.erofs")
	if err != nil {
		return api.Layer{}, err
	}
	f.Close()
	if err := image.BuildEROFS(ctx, srcDir, f.Name(), opts...); err != nil {
		return api.Layer{}, err
	}
	return s.PublishLayer(ctx, spec, f.Name())
}

func (s *fakeStore) PublishLayer(ctx context.Context, spec image.LayerSpec, file string) (api.Layer, error) {
	ref := spec.Name + "@" + spec.Version
	s.mu.Lock()
	_, dup := s.layers[ref]
	s.mu.Unlock()
	if dup {
		return api.Layer{}, errdefs.New(errdefs.ErrConflict, api.CodeLayerExists, "layer %s exists", ref)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return api.Layer{}, err
	}
	f, err := os.CreateTemp(s.dir, "layer-*")
	if err != nil {
		return api.Layer{}, err
	}
	f.Write(b)
	f.Close()
	sum := sha256.Sum256(b)
	l := api.Layer{Ref: ref, Name: spec.Name, Version: spec.Version, Kind: spec.Kind, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.layers[ref] = l
	s.files[l.Digest] = f.Name()
	return l, nil
}

func (s *fakeStore) CreateEnv(ctx context.Context, req api.CreateEnvironmentRequest) (api.Environment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref := req.Name + "@" + req.Version
	if _, ok := s.envs[ref]; ok {
		return api.Environment{}, errdefs.New(errdefs.ErrConflict, api.CodeEnvExists, "environment %s exists", ref)
	}
	env := api.Environment{Ref: ref, Name: req.Name, Version: req.Version, Env: req.Env, Workdir: req.Workdir,
		User: req.User, Entrypoint: req.Entrypoint, CreatedAt: testTime}
	for _, r := range append([]string{req.Base}, req.Toolkits...) {
		l, ok := s.layers[r]
		if !ok {
			return api.Environment{}, errdefs.New(errdefs.ErrNotFound, api.CodeLayerNotFound, "layer %s not found", r)
		}
		env.Layers = append(env.Layers, api.EnvLayer{Ref: l.Ref, Kind: l.Kind, Digest: l.Digest, Size: l.Size})
	}
	s.envs[ref] = env
	return env, nil
}

func (s *fakeStore) GetEnv(ctx context.Context, ref string) (api.Environment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	env, ok := s.envs[ref]
	if !ok {
		return api.Environment{}, errdefs.New(errdefs.ErrNotFound, api.CodeEnvNotFound, "environment %s not found", ref)
	}
	return env, nil
}

func (s *fakeStore) Fetch(ctx context.Context, digest string) (backend.Layer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.files[digest]
	if !ok {
		return backend.Layer{}, errdefs.New(errdefs.ErrNotFound, api.CodeLayerNotFound, "layer %s not found", digest)
	}
	return backend.Layer{Digest: digest, Path: p}, nil
}

// rig is an importer and exporter over a fakeStore, mounting layers the
// node's way.
type rig struct {
	store *fakeStore
	svc   *Service
}

func newRig(t *testing.T) *rig {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "mkfs.erofs")
	testutil.RequireKernelFeature(t, "erofs")
	st := newFakeStore(t)
	mounts := image.NewMounts(filepath.Join(t.TempDir(), "mnt"))
	t.Cleanup(func() { mounts.Prune() })
	return &rig{store: st, svc: &Service{
		Importer: Importer{Store: st, WorkDir: filepath.Join(t.TempDir(), "work"), Limits: DefaultLimits, MaxUpload: 1 << 30},
		Layers:   NodeLayers{Cache: st, Mounts: mounts},
	}}
}

// tree snapshots the files of env's only layer.
func (r *rig) tree(t *testing.T, env api.Environment) []string {
	t.Helper()
	if len(env.Layers) != 1 {
		t.Fatalf("%s has %d layers, want 1", env.Ref, len(env.Layers))
	}
	dir, release, err := r.svc.Layers.MountLayer(context.Background(), env.Layers[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	return snapshot(t, dir, true)[1:] // the top's mtime is the build's
}

// export exports env and unpacks the layout into a new directory.
func (r *rig) export(t *testing.T, ref string) string {
	t.Helper()
	var buf bytes.Buffer
	if err := r.svc.ExportEnv(context.Background(), ref, FormatOCILayout, &buf); err != nil {
		t.Fatalf("export %s: %v", ref, err)
	}
	out := filepath.Join(t.TempDir(), "out")
	os.Mkdir(out, 0o755)
	if err := UnpackLayout(&buf, out, 0); err != nil {
		t.Fatalf("unpack exported layout: %v", err)
	}
	return out
}

// richImage exercises everything import must keep or apply.
func richImage(t testing.TB) v1.Image {
	cap := "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
	return v1Image(t, appConfig,
		[]ent{
			{name: "bin/", typ: tar.TypeDir},
			{name: "bin/busybox", body: "#!/bin/true\n", mode: 0o755},
			{name: "bin/sh", typ: tar.TypeSymlink, link: "busybox"},
			{name: "bin/ln", typ: tar.TypeLink, link: "bin/busybox"},
			{name: "etc/", typ: tar.TypeDir},
			{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n"},
			{name: "etc/abs", typ: tar.TypeSymlink, link: "/etc/passwd"},
			{name: "home/u/", typ: tar.TypeDir, mode: 0o750, uid: 1000, gid: 1000},
			{name: "home/u/secret", body: "s", mode: 0o600, uid: 1000, gid: 1000,
				xattrs: map[string]string{"user.k": "v", "trusted.t": "x"}},
			{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
			{name: "usr/bin/su", body: "su", mode: 0o4755},
			{name: "gone/", typ: tar.TypeDir},
			{name: "gone/x", body: "x"},
			{name: "opq/", typ: tar.TypeDir},
			{name: "opq/a", body: "a"},
			{name: "opq/b", body: "b"},
		},
		[]ent{
			{name: ".wh.gone"},
			{name: "opq/", typ: tar.TypeDir, mode: 0o700},
			{name: "opq/.wh..wh..opq"},
			{name: "opq/c", body: "c"},
			{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\nu:x:1000:1000::/home/u:/bin/sh\n"},
			{name: "usr/bin/ping", body: "ping", mode: 0o755, xattrs: map[string]string{"security.capability": cap}},
		},
	)
}

func TestImportExportRoundTrip(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	archive := writeArchive(t, map[string]v1.Image{"app:1.0": richImage(t)})
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env, err := r.svc.ImportImage(ctx, FormatDockerArchive, "app", "", f)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if env.Ref != "app@1.0" {
		t.Errorf("ref %s, want app@1.0 (from the tag)", env.Ref)
	}
	if env.Workdir != "/srv" || env.User != "1000:1000" || env.Env["APP"] != "1" ||
		!slices.Equal(env.Entrypoint, []string{"/bin/app", "--serve"}) {
		t.Errorf("defaults not carried over: %+v", env)
	}
	first := r.tree(t, env)
	joined := strings.Join(first, "\n")
	for _, want := range []string{
		"bin/ln -rwxr-xr-x 0:0 2024-05-06T07:08:09Z link=bin/busybox",
		"bin/sh Lrwxrwxrwx 0:0 2024-05-06T07:08:09Z -> busybox",
		"etc/abs Lrwxrwxrwx 0:0 2024-05-06T07:08:09Z -> /etc/passwd",
		"home/u drwxr-x--- 1000:1000",
		"home/u/secret -rw------- 1000:1000 2024-05-06T07:08:09Z s xattrs=trusted.t=x,user.k=v",
		"tmp dtrwxrwxrwx 0:0",
		"usr/bin/su urwxr-xr-x",
		"usr/bin/ping -rwxr-xr-x 0:0 2024-05-06T07:08:09Z ping xattrs=security.capability=",
		"opq drwx------",
		"opq/c -rw-r--r--",
		`u:x:1000:1000::/home/u:/bin/sh\n`,
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("imported tree lacks %q:\n%s", want, joined)
		}
	}
	for _, gone := range []string{"gone ", "gone/x", "opq/a", "opq/b", ".wh."} {
		if strings.Contains(joined, gone) {
			t.Errorf("imported tree has %q:\n%s", gone, joined)
		}
	}

	out := r.export(t, env.Ref)
	if _, err := exec.LookPath("skopeo"); err == nil || testutil.Strict() {
		testutil.RequireBinary(t, "skopeo")
		cmd := exec.Command("skopeo", "inspect", "oci:"+out)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("skopeo inspect: %v\n%s", err, b)
		}
		var info struct {
			Layers []string
			Env    []string
			Os     string
		}
		if err := json.Unmarshal(b, &info); err != nil {
			t.Fatalf("skopeo inspect output: %v\n%s", err, b)
		}
		t.Logf("skopeo inspect: %s", b)
		if len(info.Layers) != 1 || info.Os != "linux" || !slices.Contains(info.Env, "APP=1") {
			t.Errorf("skopeo inspect: %s", b)
		}
	} else {
		t.Log("skopeo not installed: not checked with it")
	}

	env2, err := r.svc.ImportDir(ctx, ImportRequest{Name: "again"}, out)
	if err != nil {
		t.Fatalf("re-import: %v", err)
	}
	if env2.Ref != "again@1.0" || env2.Workdir != env.Workdir || env2.User != env.User ||
		!slices.Equal(env2.Entrypoint, env.Entrypoint) || env2.Env["PATH"] != env.Env["PATH"] {
		t.Errorf("re-imported env %+v, want the defaults of %+v", env2, env)
	}
	if second := r.tree(t, env2); !slices.Equal(first, second) {
		t.Errorf("trees differ after a round trip:\n--- first\n%s\n--- second\n%s", joined, strings.Join(second, "\n"))
	}

	// The same name again is a conflict, found before any work is done.
	f.Seek(0, io.SeekStart)
	if _, err := r.svc.ImportImage(ctx, FormatDockerArchive, "app", "", f); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second import: got %v, want ErrConflict", err)
	}
	// An explicit version wins over the tag.
	f.Seek(0, io.SeekStart)
	if env3, err := r.svc.ImportImage(ctx, FormatDockerArchive, "app@7", "", f); err != nil || env3.Ref != "app@7" {
		t.Errorf("import as app@7: %+v, %v", env3, err)
	}
}

// A diff layer as overlayfs leaves it (0/0 character devices for
// whiteouts, trusted.overlay.opaque on opaque directories) exports as OCI
// whiteouts, and the export flattens back to what the overlay showed.
func TestExportOverlayWhiteouts(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	base := t.TempDir()
	for _, p := range []string{"keep", "gone", "opq/old", "sub/gone2"} {
		os.MkdirAll(filepath.Dir(filepath.Join(base, p)), 0o755)
		os.WriteFile(filepath.Join(base, p), []byte(p), 0o644)
	}
	diff := t.TempDir()
	os.MkdirAll(filepath.Join(diff, "opq"), 0o755)
	os.MkdirAll(filepath.Join(diff, "sub"), 0o755)
	os.WriteFile(filepath.Join(diff, "opq/new"), []byte("new"), 0o644)
	for _, p := range []string{"gone", "sub/gone2"} {
		if err := unix.Mknod(filepath.Join(diff, p), unix.S_IFCHR|0o600, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Setxattr(filepath.Join(diff, "opq"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	lb, err := r.store.BuildLayer(ctx, image.LayerSpec{Name: "base", Version: "1", Kind: api.LayerBase}, base)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := r.store.BuildLayer(ctx, image.LayerSpec{Name: "diff", Version: "1", Kind: api.LayerToolkit}, diff)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.CreateEnv(ctx, api.CreateEnvironmentRequest{Name: "stack", Version: "1", Base: lb.Ref, Toolkits: []string{ld.Ref}}); err != nil {
		t.Fatal(err)
	}
	out := r.export(t, "stack@1")

	// The top layer's entries, as written.
	p, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	idx, _ := p.ImageIndex()
	im, _ := idx.IndexManifest()
	img, err := p.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if im.Manifests[0].Annotations[refAnnotation] != "1" {
		t.Errorf("index annotations %v", im.Manifests[0].Annotations)
	}
	ls, _ := img.Layers()
	if len(ls) != 2 {
		t.Fatalf("%d layers, want 2", len(ls))
	}
	rc, err := ls[1].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatalf("layer is not gzip: %v", err)
	}
	var names []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeChar || strings.Contains(strings.Join(slices.Collect(mapsKeys(h.PAXRecords)), ","), "overlay") {
			t.Errorf("%s: overlay mark left in the OCI layer", h.Name)
		}
		names = append(names, h.Name)
	}
	want := []string{".wh.gone", "opq/", "opq/.wh..wh..opq", "opq/new", "sub/", "sub/.wh.gone2"}
	if !slices.Equal(names, want) {
		t.Errorf("diff layer entries %q, want %q", names, want)
	}

	// And it flattens back to the overlay's view.
	src, err := OpenLayout(out, "", DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	flat := t.TempDir()
	if err := Flatten(ctx, flat, src.Layers, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range snapshot(t, flat, false)[1:] {
		got = append(got, strings.Fields(line)[0])
	}
	if w := []string{"keep", "opq", "opq/new", "sub"}; !slices.Equal(got, w) {
		t.Errorf("flattened export %q, want %q", got, w)
	}
}

func TestExportErrors(t *testing.T) {
	st := newFakeStore(t)
	svc := &Service{Importer: Importer{Store: st, WorkDir: t.TempDir()}, Layers: NodeLayers{Cache: st, Mounts: image.NewMounts(t.TempDir())}}
	ctx := context.Background()
	var buf bytes.Buffer
	if err := svc.ExportEnv(ctx, "nope@1", FormatOCILayout, &buf); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown env: got %v", err)
	}
	if err := svc.ExportEnv(ctx, "nope@1", "docker-archive", &buf); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bad format: got %v", err)
	}
	st.envs["broken@1"] = api.Environment{Ref: "broken@1", Layers: []api.EnvLayer{{Ref: "x@1", Digest: "sha256:" + strings.Repeat("0", 64)}}}
	if err := svc.ExportEnv(ctx, "broken@1", FormatOCILayout, &buf); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing layer: got %v", err)
	}
	if buf.Len() != 0 {
		t.Errorf("%d bytes written before the error", buf.Len())
	}
	if err := (&Service{Importer: Importer{Store: st}}).ExportEnv(ctx, "x@1", FormatOCILayout, &buf); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("no layer source: got %v", err)
	}
}

func TestImportErrors(t *testing.T) {
	st := newFakeStore(t)
	im := &Importer{Store: st, WorkDir: t.TempDir(), Limits: DefaultLimits, MaxUpload: 1 << 20}
	ctx := context.Background()
	for name, tc := range map[string]struct {
		req  ImportRequest
		body []byte
		kind error
	}{
		"bad format":   {ImportRequest{Format: "zip", Name: "a"}, nil, errdefs.ErrInvalid},
		"bad name":     {ImportRequest{Format: FormatDockerArchive, Name: "A!"}, nil, errdefs.ErrInvalid},
		"no name":      {ImportRequest{Format: FormatDockerArchive}, nil, errdefs.ErrInvalid},
		"empty body":   {ImportRequest{Format: FormatDockerArchive, Name: "a"}, nil, errdefs.ErrInvalid},
		"garbage":      {ImportRequest{Format: FormatDockerArchive, Name: "a"}, bytes.Repeat([]byte("x"), 4096), errdefs.ErrInvalid},
		"too large":    {ImportRequest{Format: FormatDockerArchive, Name: "a"}, make([]byte, 2<<20), errdefs.ErrInvalid},
		"layout empty": {ImportRequest{Format: FormatOCILayout, Name: "a"}, nil, errdefs.ErrInvalid},
		"layout not a tar": {ImportRequest{Format: FormatOCILayout, Name: "a"}, bytes.Repeat([]byte("y"), 4096),
			errdefs.ErrInvalid},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := im.Import(ctx, tc.req, bytes.NewReader(tc.body))
			if !errors.Is(err, tc.kind) {
				t.Fatalf("got %v, want %v", err, tc.kind)
			}
		})
	}
	if ents, _ := os.ReadDir(im.WorkDir); len(ents) != 0 {
		t.Errorf("work directory not cleaned up: %v", ents)
	}
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
