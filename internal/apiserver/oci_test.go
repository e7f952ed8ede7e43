package apiserver_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/image/oci"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

var _ apiserver.OCI = (*oci.Service)(nil)

// fakeOCI records calls and answers as told.
type fakeOCI struct {
	format, name, ref string
	body              []byte
	importErr         error
	export            func(w io.Writer) error
}

func (f *fakeOCI) ImportImage(_ context.Context, format, name, ref string, body io.Reader) (api.Environment, error) {
	f.format, f.name, f.ref = format, name, ref
	f.body, _ = io.ReadAll(body)
	if f.importErr != nil {
		return api.Environment{}, f.importErr
	}
	return api.Environment{Ref: name + "@1", Name: name, Version: "1"}, nil
}

func (f *fakeOCI) ExportEnv(_ context.Context, ref, format string, w io.Writer) error {
	f.ref, f.format = ref, format
	return f.export(w)
}

func newOCIHarness(t *testing.T, o apiserver.OCI) *harness {
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node:   nodetest.New(t, nil),
		Images: imagetest.Busybox,
		OCI:    o,
		Tokens: apiserver.StaticToken(token),
		Log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	t.Cleanup(srv.Close)
	return &harness{t: t, url: srv.URL}
}

func TestOCIRoutes(t *testing.T) {
	f := &fakeOCI{}
	h := newOCIHarness(t, f)

	resp, b := h.do("POST", "/v1/images:import?name=app&format=docker-archive&ref=app:1", "application/x-tar", strings.NewReader("ARCHIVE"))
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Location") != "/v1/environments/app@1" {
		t.Fatalf("import: %d %s (Location %q)", resp.StatusCode, b, resp.Header.Get("Location"))
	}
	if f.format != "docker-archive" || f.name != "app" || f.ref != "app:1" || string(f.body) != "ARCHIVE" {
		t.Errorf("import got format %q name %q ref %q body %q", f.format, f.name, f.ref, f.body)
	}
	env := decode[api.Environment](t, b)
	if env.Ref != "app@1" {
		t.Errorf("import answered %+v", env)
	}

	for q, want := range map[string]string{"?format=oci-layout": "name", "?name=app": "format"} {
		resp, b := h.do("POST", "/v1/images:import"+q, "application/x-tar", strings.NewReader("x"))
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), want) {
			t.Errorf("import%s: %d %s, want 400 about %s", q, resp.StatusCode, b, want)
		}
	}

	f.importErr = errdefs.New(errdefs.ErrInvalid, "invalid_image", "invalid image: entry \"../x\": path escapes the image root")
	resp, b = h.do("POST", "/v1/images:import?name=app&format=docker-archive", "application/x-tar", strings.NewReader("x"))
	if e := decode[api.ErrorBody](t, b); resp.StatusCode != http.StatusBadRequest || e.Error.Code != "invalid_image" {
		t.Errorf("bad archive: %d %s", resp.StatusCode, b)
	}
	f.importErr = errdefs.New(errdefs.ErrConflict, api.CodeEnvExists, "environment app@1 already exists")
	resp, b = h.do("POST", "/v1/images:import?name=app&format=docker-archive", "application/x-tar", strings.NewReader("x"))
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("existing env: %d %s", resp.StatusCode, b)
	}

	// Export streams; a name with "/" travels escaped in one segment.
	f.export = func(w io.Writer) error { _, err := io.WriteString(w, "TAR"); return err }
	resp, b = h.do("GET", "/v1/environments/team%2Fapp@1/export", "", nil)
	if resp.StatusCode != http.StatusOK || string(b) != "TAR" || resp.Header.Get("Content-Type") != "application/x-tar" {
		t.Errorf("export: %d %q %q", resp.StatusCode, b, resp.Header.Get("Content-Type"))
	}
	if f.ref != "team/app@1" || f.format != "oci-layout" {
		t.Errorf("export got ref %q format %q", f.ref, f.format)
	}
	// An error before the first byte is a proper answer...
	f.export = func(io.Writer) error {
		return errdefs.New(errdefs.ErrNotFound, api.CodeEnvNotFound, "environment nope@1 not found")
	}
	resp, b = h.do("GET", "/v1/environments/nope@1/export?format=oci-layout", "", nil)
	if e := decode[api.ErrorBody](t, b); resp.StatusCode != http.StatusNotFound || e.Error.Code != api.CodeEnvNotFound {
		t.Errorf("export of a missing env: %d %s", resp.StatusCode, b)
	}
	// ...one after it cuts the stream.
	f.export = func(w io.Writer) error {
		w.Write(bytes.Repeat([]byte("x"), 100))
		return errors.New("disk on fire")
	}
	req, _ := http.NewRequest("GET", h.url+"/v1/environments/app@1/export", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Error("a stream cut short read as complete")
		}
	}
}

func TestOCIRoutesUnconfigured(t *testing.T) {
	h := newOCIHarness(t, nil)
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/images:import?name=a&format=docker-archive"},
		{"GET", "/v1/environments/a@1/export"},
	} {
		resp, b := h.do(c.method, c.path, "", strings.NewReader("x"))
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s %s: %d %s, want 503", c.method, c.path, resp.StatusCode, b)
		}
	}
	resp, _ := h.do("POST", "/v1/images:import?name=a&format=x", "", nil, "Authorization", "Bearer wrong")
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("bad token: %d, want 401", resp.StatusCode)
	}
}

// dockerArchive builds a one-layer docker-archive tagged tag.
func dockerArchive(t *testing.T, tag string, entries map[string]string) []byte {
	t.Helper()
	var lb bytes.Buffer
	tw := tar.NewWriter(&lb)
	for n, body := range entries {
		tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		io.WriteString(tw, body)
	}
	tw.Close()
	layer, err := tarball.LayerFromReader(bytes.NewReader(lb.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"A=1"}, WorkingDir: "/w"})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tarball.Write(ref, img, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// The real thing: a registry over a memory store and a directory blob
// store, import over HTTP, export over HTTP, layers mounted the node's
// way.
func TestOCIImportExportOverHTTP(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "mkfs.erofs")
	testutil.RequireKernelFeature(t, "erofs")
	bs, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := image.NewRegistry(store.Memory(), bs, image.WithWorkDir(t.TempDir()), image.WithLogger(log))
	mounts := image.NewMounts(filepath.Join(t.TempDir(), "mnt"))
	t.Cleanup(func() { mounts.Prune() })
	svc := &oci.Service{
		Importer: oci.Importer{Store: reg, WorkDir: t.TempDir(), Limits: oci.DefaultLimits, MaxUpload: 64 << 20},
		Layers:   oci.NodeLayers{Cache: image.NewCache(t.TempDir(), bs), Mounts: mounts},
	}
	agent := nodetest.New(t, func(c *node.Config) { c.Images = reg })
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: agent, Images: reg, Layers: reg, OCI: svc, Tokens: apiserver.StaticToken(token), Log: log,
	}))
	t.Cleanup(srv.Close)
	h := &harness{t: t, url: srv.URL}

	archive := dockerArchive(t, "app:2.1", map[string]string{"etc/hello": "hi\n"})
	resp, b := h.do("POST", "/v1/images:import?name=app&format=docker-archive", "application/x-tar", bytes.NewReader(archive))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("import: %d %s", resp.StatusCode, b)
	}
	env := decode[api.Environment](t, b)
	if env.Ref != "app@2.1" || env.Workdir != "/w" || env.Env["A"] != "1" || len(env.Layers) != 1 || env.Layers[0].Kind != api.LayerBase {
		t.Errorf("imported %+v", env)
	}
	if _, err := reg.GetLayer(context.Background(), "app@2.1"); err != nil {
		t.Errorf("base layer app@2.1: %v", err)
	}

	resp, b = h.do("POST", "/v1/images:import?name=app&format=docker-archive", "application/x-tar", bytes.NewReader(archive))
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("import again: %d %s, want 409", resp.StatusCode, b)
	}
	hostile := dockerArchive(t, "evil:1", map[string]string{"../../../etc/evil": "x"})
	resp, b = h.do("POST", "/v1/images:import?name=evil&format=docker-archive", "application/x-tar", bytes.NewReader(hostile))
	if e := decode[api.ErrorBody](t, b); resp.StatusCode != http.StatusBadRequest || e.Error.Code != "invalid_image" {
		t.Errorf("hostile import: %d %s", resp.StatusCode, b)
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Fatal("/etc/evil was written")
	}
	resp, b = h.do("POST", "/v1/images:import?name=bad&format=docker-archive", "application/x-tar", bytes.NewReader(archive[:len(archive)/2]))
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("truncated archive: %d %s", resp.StatusCode, b)
	}

	resp, b = h.do("GET", "/v1/environments/app@2.1/export?format=oci-layout", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("export: %d %s", resp.StatusCode, b)
	}
	out := filepath.Join(t.TempDir(), "out")
	os.Mkdir(out, 0o755)
	if err := oci.UnpackLayout(bytes.NewReader(b), out, 0); err != nil {
		t.Fatal(err)
	}
	img, err := oci.OpenLayout(out, "2.1", oci.DefaultLimits)
	if err != nil {
		t.Fatalf("exported layout: %v", err)
	}
	if img.Config.WorkingDir != "/w" || len(img.Layers) != 1 {
		t.Errorf("exported image: %+v", img)
	}
	resp, b = h.do("GET", "/v1/environments/nope@1/export", "", nil)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("export of a missing env: %d %s", resp.StatusCode, b)
	}
}
