package apiserver_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
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

// newLayerHarness serves a real registry (memory store, directory blob
// store) over a node on the fake backend that resolves images with it.
func newLayerHarness(t testing.TB, kicks *atomic.Int32) *harness {
	testutil.RequireBinary(t, "mkfs.erofs")
	bs, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := image.NewRegistry(store.Memory(), bs, image.WithWorkDir(t.TempDir()), image.WithGCGrace(0), image.WithLogger(log))
	agent := nodetest.New(t, func(c *node.Config) { c.Images = reg })
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node:           agent,
		Images:         reg,
		Layers:         reg,
		CollectGarbage: func() { kicks.Add(1) },
		Tokens:         apiserver.StaticToken(token),
		Log:            log,
	}))
	t.Cleanup(srv.Close)
	return &harness{t: t, url: srv.URL}
}

func tarOf(t testing.TB, gz bool, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	zw := gzip.NewWriter(&buf)
	if gz {
		w = zw
	}
	tw := tar.NewWriter(w)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		io.WriteString(tw, body)
	}
	tw.Close()
	if gz {
		zw.Close()
	}
	return buf.Bytes()
}

func (h *harness) buildLayer(query string, body []byte) (*http.Response, []byte) {
	return h.do("POST", "/v1/layers?"+query, "application/x-tar", bytes.NewReader(body))
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

func TestLayerRoutes(t *testing.T) {
	var kicks atomic.Int32
	h := newLayerHarness(t, &kicks)
	for _, l := range []struct{ q string }{
		{"kind=base&name=debian-python&version=12"},
		{"kind=workspace&name=task&version=1"},
		{"kind=toolkit&name=harness&version=7"},
	} {
		resp, b := h.buildLayer(l.q, tarOf(t, strings.Contains(l.q, "toolkit"), map[string]string{"f/" + l.q[5:9]: l.q}))
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("build %s: %d %s", l.q, resp.StatusCode, b)
		}
	}
	resp, b := h.do("GET", "/v1/layers/harness@7", "", nil)
	if resp.StatusCode != 200 || decode[api.Layer](t, b).Kind != api.LayerToolkit {
		t.Fatalf("get layer: %d %s", resp.StatusCode, b)
	}

	resp, b = h.json("POST", "/v1/environments", `{"name":"swe","version":"1","base":"debian-python@12","workspace":"task@1","toolkits":["harness@7"],"env":{"K":"v"},"workdir":"/work"}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create env: %d %s", resp.StatusCode, b)
	}
	env := decode[api.Environment](t, b)
	if len(env.Layers) != 3 || env.Layers[2].Ref != "harness@7" {
		t.Fatalf("env: %+v", env)
	}
	resp, b = h.do("GET", "/v1/environments/swe", "", nil)
	if resp.StatusCode != 200 || decode[api.Environment](t, b).Ref != "swe@1" {
		t.Fatalf("get env latest: %d %s", resp.StatusCode, b)
	}
	resp, b = h.do("GET", "/v1/layers", "", nil)
	list := decode[api.LayerList](t, b)
	if resp.StatusCode != 200 || len(list.Layers) != 3 || len(list.Layers[0].UsedBy) != 1 || list.Layers[0].UsedBy[0] != "swe@1" {
		t.Fatalf("list layers: %d %s", resp.StatusCode, b)
	}

	// A sandbox from the environment carries its layers and defaults.
	sb := h.create(`{"image":"swe@1"}`)
	if sb.Image != "swe@1" || len(sb.Layers) != 3 || sb.Layers[0] != env.Layers[0].Digest || sb.Workdir != "/work" || sb.Env["K"] != "v" {
		t.Fatalf("sandbox from env: %+v", sb)
	}
	sb2 := h.create(`{"layers":["debian-python@12","harness"]}`)
	if sb2.Image != "debian-python@12+harness@7" || len(sb2.Layers) != 2 {
		t.Fatalf("sandbox from layers: %+v", sb2)
	}

	for _, tc := range []struct {
		name, method, path, ctype, body string
		status                          int
		code                            string
	}{
		{"layer exists", "POST", "/v1/layers?kind=base&name=debian-python&version=12", "application/x-tar", string(tarOf(t, false, map[string]string{"a": "b"})), 409, api.CodeLayerExists},
		{"corrupt tarball", "POST", "/v1/layers?kind=base&name=x&version=1", "application/gzip", "\x1f\x8bnot really gzip", 400, api.CodeInvalid},
		{"empty tarball", "POST", "/v1/layers?kind=base&name=x&version=1", "application/x-tar", "", 400, api.CodeInvalid},
		{"missing kind", "POST", "/v1/layers?name=x&version=1", "application/x-tar", "x", 400, api.CodeInvalid},
		{"bad kind", "POST", "/v1/layers?kind=tool&name=x&version=1", "application/x-tar", "x", 400, api.CodeInvalid},
		{"json body", "POST", "/v1/layers?kind=base&name=x&version=1", "application/json", "{}", 400, api.CodeInvalid},
		{"unknown layer", "GET", "/v1/layers/nope@1", "", "", 404, api.CodeLayerNotFound},
		{"unknown env", "GET", "/v1/environments/nope@1", "", "", 404, api.CodeEnvNotFound},
		{"env exists", "POST", "/v1/environments", "application/json", `{"name":"swe","version":"1","base":"debian-python@12"}`, 409, api.CodeEnvExists},
		{"env missing layer", "POST", "/v1/environments", "application/json", `{"name":"e","version":"1","base":"nope@1"}`, 404, api.CodeLayerNotFound},
		{"env unknown field", "POST", "/v1/environments", "application/json", `{"name":"e","version":"1","bsae":"x@1"}`, 400, api.CodeInvalid},
		{"delete used by env", "DELETE", "/v1/layers/harness@7", "", "", 409, api.CodeLayerInUse},
		{"delete unknown layer", "DELETE", "/v1/layers/nope@1", "", "", 404, api.CodeLayerNotFound},
		{"delete unknown env", "DELETE", "/v1/environments/nope@1", "", "", 404, api.CodeEnvNotFound},
		{"sandbox unknown layer", "POST", "/v1/sandboxes", "application/json", `{"layers":["nope@1"]}`, 404, api.CodeLayerNotFound},
		{"sandbox image and layers", "POST", "/v1/sandboxes", "application/json", `{"image":"swe@1","layers":["harness@7"]}`, 400, api.CodeInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := h.do(tc.method, tc.path, tc.ctype, strings.NewReader(tc.body))
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d, want %d (%s)", resp.StatusCode, tc.status, b)
			}
			if got := errorCode(t, b); got != tc.code {
				t.Errorf("code = %q, want %q", got, tc.code)
			}
		})
	}

	// Without the environment, the live sandboxes still hold harness@7.
	if resp, b := h.do("DELETE", "/v1/environments/swe@1", "", nil); resp.StatusCode != 204 {
		t.Fatalf("delete env: %d %s", resp.StatusCode, b)
	}
	resp, b = h.do("DELETE", "/v1/layers/harness@7", "", nil)
	if resp.StatusCode != 409 || errorCode(t, b) != api.CodeLayerInUse || !strings.Contains(string(b), sb.ID) {
		t.Fatalf("delete layer of a live sandbox: %d %s", resp.StatusCode, b)
	}
	h.do("DELETE", "/v1/sandboxes/"+sb.ID, "", nil)
	h.do("DELETE", "/v1/sandboxes/"+sb2.ID, "", nil)
	if resp, b := h.do("DELETE", "/v1/layers/harness@7", "", nil); resp.StatusCode != 204 {
		t.Fatalf("delete unused layer: %d %s", resp.StatusCode, b)
	}
	if kicks.Load() != 2 {
		t.Errorf("deletes asked for %d collections, want 2", kicks.Load())
	}
	resp, b = h.do("POST", "/v1/gc", "", nil)
	res := decode[api.GCResult](t, b)
	if resp.StatusCode != 200 || res.Deleted == 0 || res.Skipped {
		t.Fatalf("gc: %d %s", resp.StatusCode, b)
	}
	resp, b = h.do("GET", "/v1/images", "", nil)
	if resp.StatusCode != 200 || len(decode[api.ImageList](t, b).Images) != 0 {
		t.Errorf("images after deleting the env: %d %s", resp.StatusCode, b)
	}
}

func TestLayerRoutesUnconfigured(t *testing.T) {
	h := newHarness(t, nil)
	resp, b := h.do("GET", "/v1/layers", "", nil)
	if resp.StatusCode != 503 || errorCode(t, b) != api.CodeUnavailable {
		t.Fatalf("layers without a registry: %d %s", resp.StatusCode, b)
	}
}

// FuzzLayerRequests sends arbitrary environment requests and layer
// archives: the answer is a 2xx or a classified 4xx, never a 500.
func FuzzLayerRequests(f *testing.F) {
	tgz := string(tarOf(f, true, map[string]string{"a/b": "c"}))
	for _, s := range []string{
		`{"name":"e","version":"1","base":"base@1"}`,
		`{"from":"e@1","toolkits":["tk@1","tk"]}`,
		`{"name":"e","version":"2","base":"base","env":{"A":"b"},"workdir":"/w","user":"1:1","entrypoint":["x"]}`,
		`{"name":"E","version":"..","base":"base@1@2"}`, `{"toolkits":[1]}`, `null`, `{}`,
	} {
		f.Add(0, s)
	}
	f.Add(1, tgz)
	f.Add(1, tgz[:len(tgz)/2])
	f.Add(1, "")
	var kicks atomic.Int32
	h := newLayerHarness(f, &kicks)
	resp, b := h.buildLayer("kind=base&name=base&version=1", tarOf(f, false, map[string]string{"etc/os": "x"}))
	if resp.StatusCode != http.StatusCreated {
		f.Fatalf("build base: %d %s", resp.StatusCode, b)
	}
	h.buildLayer("kind=toolkit&name=tk&version=1", tarOf(f, false, map[string]string{"opt/tk": "x"}))
	n := 0
	f.Fuzz(func(t *testing.T, which int, body string) {
		h.t = t
		n++
		var resp *http.Response
		var b []byte
		if which%2 == 0 {
			resp, b = h.json("POST", "/v1/environments", body)
		} else {
			resp, b = h.do("POST", "/v1/layers?kind=toolkit&name=f&version="+strconv.Itoa(n), "application/x-tar", strings.NewReader(body))
		}
		if resp.StatusCode >= 500 {
			t.Fatalf("%d %q: %d %s", which, body, resp.StatusCode, b)
		}
	})
}
