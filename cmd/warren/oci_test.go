package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client/clienttest"
)

// ociFake answers import and export on top of the clienttest server.
type ociFake struct {
	query  map[string]string
	body   []byte
	export []byte
	refuse bool
}

func (f *ociFake) intercept(w http.ResponseWriter, r *http.Request) bool {
	isImport := r.Method == "POST" && r.URL.Path == "/v1/images:import"
	isExport := r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/export")
	if !isImport && !isExport {
		return false
	}
	f.query = map[string]string{"path": r.URL.Path}
	for k, v := range r.URL.Query() {
		f.query[k] = v[0]
	}
	if f.refuse {
		clienttest.WriteError(w, http.StatusBadRequest, "invalid_image", `invalid image: entry "../x": path escapes the image root`, 0)
		return true
	}
	if isImport {
		f.body, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Environment{Ref: f.query["name"] + "@1.0", Layers: []api.EnvLayer{{Ref: f.query["name"] + "@1.0"}}, Size: 4096})
		return true
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Write(f.export)
	return true
}

func TestImageImport(t *testing.T) {
	f := &ociFake{}
	srv := newServer(t, clienttest.WithIntercept(f.intercept))
	archive := filepath.Join(t.TempDir(), "app.tar")
	os.WriteFile(archive, []byte("ARCHIVE"), 0o644)

	r := cli(t, srv, nil, "", "image", "import", "docker-archive:"+archive, "--name", "app", "--ref", "app:1.0")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if f.query["format"] != "docker-archive" || f.query["name"] != "app" || f.query["ref"] != "app:1.0" || string(f.body) != "ARCHIVE" {
		t.Errorf("server got %v %q", f.query, f.body)
	}
	if !strings.HasPrefix(r.stdout, "app@1.0\t") {
		t.Errorf("stdout %q", r.stdout)
	}
	// stderr is not a terminal: one summary line, no carriage returns.
	if strings.Contains(r.stderr, "\r") || !strings.Contains(r.stderr, "uploading 7B done") || !strings.Contains(r.stderr, "imported app@1.0") {
		t.Errorf("stderr %q", r.stderr)
	}

	layout := t.TempDir()
	os.WriteFile(filepath.Join(layout, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	os.WriteFile(filepath.Join(layout, "index.json"), []byte(`{}`), 0o644)
	for _, src := range []string{"oci-layout:" + layout, layout} {
		r = cli(t, srv, nil, "", "image", "import", src, "--name", "lay", "-q", "-o", "json")
		if r.code != 0 || f.query["format"] != "oci-layout" || r.stderr != "" {
			t.Fatalf("%s: exit %d, query %v, stderr %q", src, r.code, f.query, r.stderr)
		}
		var env api.Environment
		if err := json.Unmarshal([]byte(r.stdout), &env); err != nil || env.Ref != "lay@1.0" {
			t.Errorf("json output %q: %v", r.stdout, err)
		}
	}

	for _, args := range [][]string{
		{"image", "import", "docker-archive:" + archive},          // no --name
		{"image", "import", "zip:" + archive, "--name", "a"},      // unknown transport
		{"image", "import", "docker-archive:", "--name", "a"},     // empty path
		{"image", "import", "a", "b", "--name", "a"},              // two sources
		{"image", "import", archive, "--name", "a", "-o", "yaml"}, // bad output
	} {
		if r := cli(t, srv, nil, "", args...); r.code != 2 {
			t.Errorf("%q: exit %d, want 2 (usage); stderr %q", args, r.code, r.stderr)
		}
	}
	if r := cli(t, srv, nil, "", "image", "import", "docker-archive:/nonexistent.tar", "--name", "a"); r.code != 1 || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("missing file: exit %d, stderr %q", r.code, r.stderr)
	}

	f.refuse = true
	r = cli(t, srv, nil, "", "image", "import", archive, "--name", "evil")
	if r.code != 1 || !strings.Contains(r.stderr, "escapes the image root") {
		t.Errorf("refused import: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestEnvExport(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range map[string]string{"oci-layout": "{}", "index.json": "{}", "blobs/sha256/aa": "blob"} {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), ModTime: time.Now()})
		io.WriteString(tw, body)
	}
	tw.Close()
	f := &ociFake{export: buf.Bytes()}
	srv := newServer(t, clienttest.WithIntercept(f.intercept))

	out := filepath.Join(t.TempDir(), "out")
	r := cli(t, srv, nil, "", "image", "export", "app@1", "--format", "oci-layout", out)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if f.query["path"] != "/v1/environments/app@1/export" || f.query["format"] != "oci-layout" {
		t.Errorf("server got %v", f.query)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "blobs/sha256/aa")); string(b) != "blob" {
		t.Errorf("layout not unpacked: %q", b)
	}
	if strings.TrimSpace(r.stdout) != out {
		t.Errorf("stdout %q", r.stdout)
	}
	if r := cli(t, srv, nil, "", "image", "export", "app@1", out); r.code != 1 || !strings.Contains(r.stderr, "not empty") {
		t.Errorf("non-empty dir: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := cli(t, srv, nil, "", "image", "export", "app@1", "--format", "docker-archive", t.TempDir()); r.code != 2 {
		t.Errorf("bad format: exit %d", r.code)
	}

	// The env verb is the same command.
	env := newEnvExportCmd(&app{})
	if !strings.HasPrefix(env.Use, "export ") {
		t.Errorf("env export Use %q", env.Use)
	}
}

func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	p := newProgressBar(&buf, "uploading", 200, false)
	p.tty = true // draw as on a terminal
	p.update(100)
	if got := buf.String(); !strings.Contains(got, "\ruploading [===============>              ]  50%  100B / 200B") {
		t.Errorf("drawn %q", got)
	}
	p.finish(true)
	if got := buf.String(); !strings.Contains(got, "100%  200B / 200B") || !strings.HasSuffix(got, "\x1b[K\n") {
		t.Errorf("finished %q", got)
	}
	buf.Reset()
	q := newProgressBar(&buf, "downloading", 0, false)
	q.update(5 << 20)
	q.finish(true)
	if got := buf.String(); got != "downloading 5.0MiB done\n" {
		t.Errorf("not a terminal: %q", got)
	}
}
