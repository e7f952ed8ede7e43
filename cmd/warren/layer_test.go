package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

// layerServer serves a real registry over a fake-backend node; it returns
// a function running the CLI against it.
func layerServer(t *testing.T) func(args ...string) result {
	t.Helper()
	testutil.RequireBinary(t, "mkfs.erofs")
	bs, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := image.NewRegistry(store.Memory(), bs, image.WithWorkDir(t.TempDir()), image.WithGCGrace(0), image.WithLogger(log))
	agent := nodetest.New(t, func(c *node.Config) { c.Images = reg })
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: agent, Images: reg, Layers: reg, Tokens: apiserver.StaticToken("tok"), Log: log,
	}))
	t.Cleanup(srv.Close)
	return func(args ...string) result {
		vars := map[string]string{"WARREN_ADDR": srv.URL, "WARREN_TOKEN": "tok"}
		var out, errOut bytes.Buffer
		a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(k string) string { return vars[k] }}
		code := run(context.Background(), args, a)
		return result{code, out.String(), errOut.String()}
	}
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, body := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLayerAndEnvVerbs(t *testing.T) {
	cli := layerServer(t)
	mustOK := func(args ...string) string {
		t.Helper()
		r := cli(args...)
		if r.code != 0 {
			t.Fatalf("warren %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
		}
		return r.stdout
	}
	mustOK("layer", "build", "--kind", "base", "--name", "debian-python", "--version", "12", writeFiles(t, map[string]string{"etc/os-release": "ID=debian\n"}))
	mustOK("layer", "build", "--kind", "workspace", "--name", "swe-task-0042", "--version", "1", writeFiles(t, map[string]string{"work/task.py": "print(42)\n"}))

	// A .tar.gz is passed through as is.
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "opt/harness/VERSION", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("7\n"))
	tw.Close()
	zw.Close()
	tgz := filepath.Join(t.TempDir(), "harness.tar.gz")
	if err := os.WriteFile(tgz, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out := mustOK("layer", "build", "--kind", "toolkit", "--name", "harness", "--version", "7", tgz, "-o", "json")
	var l api.Layer
	if err := json.Unmarshal([]byte(out), &l); err != nil || l.Ref != "harness@7" || l.Kind != "toolkit" {
		t.Fatalf("layer build -o json: %q, %v", out, err)
	}
	mustOK("layer", "build", "--kind", "toolkit", "--name", "harness", "--version", "8", writeFiles(t, map[string]string{"opt/harness/VERSION": "8\n"}))

	out = mustOK("env", "create", "swe-task-0042@1", "--base", "debian-python@12", "--workspace", "swe-task-0042@1",
		"--toolkit", "harness@7", "--env", "PYTHONUNBUFFERED=1", "--workdir", "/work", "--user", "1000")
	if !strings.HasPrefix(out, "swe-task-0042@1\t") {
		t.Errorf("env create: %q", out)
	}
	out = mustOK("env", "update", "swe-task-0042@1", "--toolkit", "harness@8")
	if !strings.HasPrefix(out, "swe-task-0042@2\t") || !strings.Contains(out, "harness@8") {
		t.Errorf("env update: %q", out)
	}
	out = mustOK("env", "ls")
	if !strings.Contains(out, "NAME") || !strings.Contains(out, "debian-python@12,swe-task-0042@1,harness@7") {
		t.Errorf("env ls: %q", out)
	}
	out = mustOK("env", "get", "swe-task-0042")
	if !strings.Contains(out, "swe-task-0042@2") || !strings.Contains(out, "harness@8 (toolkit") || !strings.Contains(out, "/work") {
		t.Errorf("env get latest: %q", out)
	}
	out = mustOK("layer", "ls")
	if !strings.Contains(out, "USED BY") || !strings.Contains(out, "swe-task-0042@1,swe-task-0042@2") {
		t.Errorf("layer ls: %q", out)
	}
	out = mustOK("layer", "get", "harness@7")
	if !strings.Contains(out, "swe-task-0042@1") || !strings.Contains(out, "Prefetch trace:") {
		t.Errorf("layer get: %q", out)
	}

	// A sandbox from the environment, picked with --env NAME@VERSION.
	id := strings.TrimSpace(mustOK("sandbox", "create", "--env", "swe-task-0042@1", "--env", "X=1"))
	out = mustOK("sandbox", "get", id, "-o", "json")
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.Image != "swe-task-0042@1" || sb.Env["X"] != "1" ||
		sb.Env["PYTHONUNBUFFERED"] != "1" || sb.User != "1000" || len(sb.Layers) != 3 {
		t.Fatalf("sandbox from --env: %q, %v", out, err)
	}
	id2 := strings.TrimSpace(mustOK("sandbox", "create", "--layer", "debian-python@12", "--layer", "harness@8"))

	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"layer", "build", "--kind", "base", "--name", "x", "--version", "1", "/nonexistent/rootfs"}, 1, "no such file"},
		{[]string{"layer", "build", "--name", "x", "--version", "1", "."}, 2, "--kind"},
		{[]string{"layer", "build", "--kind", "base", "--name", "debian-python", "--version", "12", "."}, 1, "layer_exists"},
		{[]string{"layer", "rm", "harness@7"}, 1, "layer_in_use"},
		{[]string{"layer", "rm", "nope@1"}, 1, "layer_not_found"},
		{[]string{"env", "get", "nope"}, 1, "env_not_found"},
		{[]string{"env", "create", "e@1"}, 2, "--base"},
		{[]string{"env", "create", "e", "--base", "debian-python@12"}, 2, "NAME@VERSION"},
		{[]string{"env", "create", "swe-task-0042@1", "--base", "debian-python@12"}, 1, "env_exists"},
		{[]string{"sandbox", "create", "--env", "a@1", "--image", "b"}, 2, "one environment"},
		{[]string{"sandbox", "create"}, 2, "--image"},
	} {
		r := cli(tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("warren %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.code, tc.msg)
		}
	}

	mustOK("sandbox", "rm", id, id2)
	mustOK("env", "rm", "swe-task-0042@1", "swe-task-0042@2")
	out = mustOK("layer", "rm", "harness@7", "harness@8")
	if out != "harness@7\nharness@8\n" {
		t.Errorf("layer rm: %q", out)
	}
	out = mustOK("layer", "gc")
	if !strings.Contains(out, "deleted") {
		t.Errorf("layer gc: %q", out)
	}
}
