package client_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// ociServer answers import and export like the apiserver, recording what
// it was sent.
type ociServer struct {
	query   map[string]string
	path    string
	body    []byte
	export  []byte
	failing bool
}

func (s *ociServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.path = r.URL.EscapedPath()
	s.query = map[string]string{}
	for k, v := range r.URL.Query() {
		s.query[k] = v[0]
	}
	if s.failing {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Error{Code: "invalid_image", Message: "invalid image: entry \"dev/null\": device nodes are not allowed"}})
		return
	}
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/images:import":
		s.body, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Environment{Ref: s.query["name"] + "@1"})
	case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/export"):
		w.Header().Set("Content-Type", "application/x-tar")
		w.Write(s.export)
	default:
		http.NotFound(w, r)
	}
}

func newOCIClient(t *testing.T) (*ociServer, *client.Client) {
	s := &ociServer{}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, client.New(srv.URL, "tok")
}

func layoutTar(t *testing.T, files map[string]string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		io.WriteString(tw, body)
	}
	tw.Close()
	return buf.Bytes()
}

func TestImportImage(t *testing.T) {
	s, c := newOCIClient(t)
	ctx := context.Background()
	archive := filepath.Join(t.TempDir(), "app.tar")
	os.WriteFile(archive, []byte("ARCHIVE-BYTES"), 0o644)
	var seen int64
	env, err := c.ImportImageFromPath(ctx, client.FormatDockerArchive, archive, "app", client.ImportOptions{
		Ref: "app:1", Progress: func(n int64) { seen = n },
	})
	if err != nil {
		t.Fatal(err)
	}
	if env.Ref != "app@1" || string(s.body) != "ARCHIVE-BYTES" || s.query["format"] != "docker-archive" || s.query["ref"] != "app:1" {
		t.Errorf("env %+v; server got body %q query %v", env, s.body, s.query)
	}
	if seen != int64(len("ARCHIVE-BYTES")) {
		t.Errorf("progress saw %d bytes", seen)
	}

	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "blobs/sha256"), 0o755)
	os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	os.WriteFile(filepath.Join(dir, "index.json"), []byte(`{}`), 0o644)
	if _, err := c.ImportImageFromPath(ctx, client.FormatOCILayout, dir, "lay", client.ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(s.body))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if s.query["format"] != "oci-layout" || !strings.Contains(strings.Join(names, " "), "oci-layout") {
		t.Errorf("layout upload: query %v, entries %v", s.query, names)
	}
	if n, err := client.LayoutSize(dir); err != nil || n != int64(len(`{"imageLayoutVersion":"1.0.0"}`)+2) {
		t.Errorf("LayoutSize = %d, %v", n, err)
	}

	// Local mistakes are caught before uploading.
	if _, err := c.ImportImageFromPath(ctx, client.FormatOCILayout, archive, "x", client.ImportOptions{}); err == nil {
		t.Error("a file as an OCI layout: no error")
	}
	if _, err := c.ImportImageFromPath(ctx, client.FormatOCILayout, t.TempDir(), "x", client.ImportOptions{}); err == nil {
		t.Error("a directory without oci-layout: no error")
	}
	if _, err := c.ImportImageFromPath(ctx, client.FormatDockerArchive, dir, "x", client.ImportOptions{}); err == nil {
		t.Error("a directory as a docker-archive: no error")
	}
	if _, err := c.ImportImageFromPath(ctx, "zip", archive, "x", client.ImportOptions{}); err == nil {
		t.Error("unknown format: no error")
	}

	s.failing = true
	_, err = c.ImportImageFromPath(ctx, client.FormatDockerArchive, archive, "app", client.ImportOptions{})
	if !client.IsInvalid(err) || !strings.Contains(err.Error(), "device nodes") {
		t.Errorf("server refusal: got %v", err)
	}
}

func TestExportEnvToDir(t *testing.T) {
	s, c := newOCIClient(t)
	ctx := context.Background()
	s.export = layoutTar(t, map[string]string{"oci-layout": "{}", "index.json": "{}", "blobs/sha256/abc": "blob"})
	out := filepath.Join(t.TempDir(), "out")
	var got int64
	if err := c.ExportEnvToDir(ctx, "team/app@1", out, func(n int64) { got = n }); err != nil {
		t.Fatal(err)
	}
	if s.path != "/v1/environments/team%2Fapp@1/export" || s.query["format"] != "oci-layout" {
		t.Errorf("server got %s %v", s.path, s.query)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "blobs/sha256/abc")); string(b) != "blob" || got != int64(len(s.export)) {
		t.Errorf("blob %q, progress %d", b, got)
	}
	if err := c.ExportEnvToDir(ctx, "app@1", out, nil); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("export into a non-empty dir: %v", err)
	}

	// A hostile stream cannot write outside the directory.
	s.export = layoutTar(t, map[string]string{"../escape": "x"})
	parent := t.TempDir()
	if err := c.ExportEnvToDir(ctx, "app@1", filepath.Join(parent, "out"), nil); err == nil {
		t.Error("an escaping entry: no error")
	}
	if _, err := os.Stat(filepath.Join(parent, "escape")); err == nil {
		t.Fatal("an entry escaped the export directory")
	}
	// A truncated stream is an error, not a short layout.
	full := layoutTar(t, map[string]string{"index.json": strings.Repeat("x", 4096)})
	s.export = full[:1024]
	if err := c.ExportEnvToDir(ctx, "app@1", filepath.Join(t.TempDir(), "o"), nil); err == nil {
		t.Error("a truncated stream: no error")
	}

	s.failing = true
	if err := c.ExportEnv(ctx, "app@1", client.FormatOCILayout, io.Discard); !client.IsInvalid(err) {
		t.Errorf("server refusal: %v", err)
	}
	if err := c.ExportEnv(ctx, "", client.FormatOCILayout, io.Discard); err == nil {
		t.Error("empty ref: no error")
	}
}
