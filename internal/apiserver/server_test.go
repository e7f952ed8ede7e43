package apiserver_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodetest"
)

const token = "s3cret"

type harness struct {
	t       testing.TB
	url     string
	probeID string
}

func newHarness(t testing.TB, mod func(*node.Config)) *harness {
	agent := nodetest.New(t, mod)
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node:   agent,
		Images: imagetest.Busybox,
		Tokens: apiserver.StaticToken(token),
		Log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	t.Cleanup(srv.Close)
	return &harness{t: t, url: srv.URL}
}

// do sends a request with the token and returns the response and its body.
func (h *harness) do(method, path, contentType string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func (h *harness) json(method, path, body string) (*http.Response, []byte) {
	return h.do(method, path, "application/json", strings.NewReader(body))
}

func (h *harness) create(body string) api.Sandbox {
	h.t.Helper()
	resp, b := h.json("POST", "/v1/sandboxes", body)
	if resp.StatusCode != http.StatusCreated {
		h.t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	var sb api.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		h.t.Fatal(err)
	}
	return sb
}

func errorCode(t testing.TB, b []byte) string {
	t.Helper()
	var e api.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	if e.Error.Message == "" {
		t.Errorf("error body %s has no message", b)
	}
	return e.Error.Code
}

func TestErrors(t *testing.T) {
	h := newHarness(t, func(c *node.Config) { c.Limits.Sandboxes = 1 })
	sb := h.create(`{"image":"busybox","labels":{"task":"demo"}}`)

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"malformed json", "POST", "/v1/sandboxes", `{"image":`, 400, api.CodeInvalid},
		{"not an object", "POST", "/v1/sandboxes", `[1,2]`, 400, api.CodeInvalid},
		{"trailing data", "POST", "/v1/sandboxes", `{"image":"busybox"} {}`, 400, api.CodeInvalid},
		{"empty body", "POST", "/v1/sandboxes", ``, 400, api.CodeInvalid},
		{"unknown field", "POST", "/v1/sandboxes", `{"image":"busybox","memroy":"1Gi"}`, 400, api.CodeInvalid},
		{"bad size", "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"memory":"lots"}}`, 400, api.CodeInvalid},
		{"negative size", "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"memory":-1}}`, 400, api.CodeInvalid},
		{"bad ttl", "POST", "/v1/sandboxes", `{"image":"busybox","ttl":"soon"}`, 400, api.CodeInvalid},
		{"unknown image", "POST", "/v1/sandboxes", `{"image":"nope"}`, 404, api.CodeImageNotFound},
		{"node full", "POST", "/v1/sandboxes", `{"image":"busybox"}`, 429, api.CodeNodeFull},
		{"unknown sandbox", "GET", "/v1/sandboxes/n1-aaaaaaaaaaaaaaaa", ``, 404, api.CodeSandboxNotFound},
		{"other node", "GET", "/v1/sandboxes/n9-aaaaaaaaaaaaaaaa", ``, 404, api.CodeSandboxNotFound},
		{"malformed id", "GET", "/v1/sandboxes/..%2f..%2fetc", ``, 404, api.CodeSandboxNotFound},
		{"exec unknown", "POST", "/v1/sandboxes/n1-aaaaaaaaaaaaaaaa/exec", `{"cmd":"true"}`, 404, api.CodeSandboxNotFound},
		{"exec no command", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{}`, 400, api.CodeInvalid},
		{"exec bad timeout", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":"true","timeout":"-1s"}`, 400, api.CodeInvalid},
		{"relative path", "GET", "/v1/sandboxes/" + sb.ID + "/files?path=etc", ``, 400, api.CodeInvalid},
		{"missing file", "GET", "/v1/sandboxes/" + sb.ID + "/files?path=/nope", ``, 404, api.CodeFileNotFound},
		{"bad mode", "PUT", "/v1/sandboxes/" + sb.ID + "/files?path=/a&mode=999", `x`, 400, api.CodeInvalid},
		{"unknown image get", "GET", "/v1/images/nope", ``, 404, api.CodeImageNotFound},
		{"no route", "GET", "/v1/nope", ``, 404, api.CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := h.json(tc.method, tc.path, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d, want %d (%s)", resp.StatusCode, tc.status, b)
			}
			if got := errorCode(t, b); got != tc.code {
				t.Errorf("code = %q, want %q", got, tc.code)
			}
			if tc.status == 429 && resp.Header.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After")
			}
		})
	}

	// None of that disturbed the running sandbox.
	resp, b := h.json("POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":"echo still here"}`)
	var res api.ExecResult
	if resp.StatusCode != 200 || json.Unmarshal(b, &res) != nil || res.Stdout != "still here\n" {
		t.Errorf("exec after bad requests: %d %s", resp.StatusCode, b)
	}
}

func TestAuth(t *testing.T) {
	h := newHarness(t, nil)
	for _, hdr := range []string{"", "Bearer", "Bearer wrong", "Basic " + token, token} {
		req, _ := http.NewRequest("GET", h.url+"/v1/sandboxes", nil)
		if hdr != "" {
			req.Header.Set("Authorization", hdr)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || errorCode(t, b) != api.CodeUnauthenticated {
			t.Errorf("Authorization %q: %d %s, want 401 unauthenticated", hdr, resp.StatusCode, b)
		}
	}
	resp, err := http.Get(h.url + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("healthz without token: %v %v", resp, err)
	}
}

func TestSandboxCRUD(t *testing.T) {
	h := newHarness(t, nil)
	sb := h.create(`{"image":"busybox","resources":{"cpu":0.5,"memory":"256Mi"},"ttl":"30m","labels":{"task":"demo"}}`)
	if sb.Resources.Memory != 256<<20 || sb.Resources.CPU != 0.5 || sb.TTL.D().Minutes() != 30 {
		t.Errorf("created %+v", sb)
	}
	h.create(`{"image":"busybox"}`)

	resp, b := h.json("GET", "/v1/sandboxes?label=task=demo", "")
	var list api.SandboxList
	if resp.StatusCode != 200 || json.Unmarshal(b, &list) != nil || len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Errorf("list by label: %d %s", resp.StatusCode, b)
	}
	if resp, b := h.json("GET", "/v1/sandboxes?label=novalue", ""); resp.StatusCode != 400 {
		t.Errorf("bad label filter: %d %s", resp.StatusCode, b)
	}
	resp, b = h.json("GET", "/v1/sandboxes/"+sb.ID, "")
	if resp.StatusCode != 200 || !strings.Contains(string(b), sb.ID) {
		t.Errorf("get: %d %s", resp.StatusCode, b)
	}
	for i := 0; i < 2; i++ {
		if resp, b := h.json("DELETE", "/v1/sandboxes/"+sb.ID, ""); resp.StatusCode != 204 {
			t.Errorf("delete #%d: %d %s, want 204", i+1, resp.StatusCode, b)
		}
	}
	if resp, _ := h.json("GET", "/v1/sandboxes/"+sb.ID, ""); resp.StatusCode != 404 {
		t.Errorf("get after delete: %d, want 404", resp.StatusCode)
	}
	resp, b = h.json("GET", "/v1/nodes", "")
	var nodes api.NodeList
	if resp.StatusCode != 200 || json.Unmarshal(b, &nodes) != nil || len(nodes.Nodes) != 1 || nodes.Nodes[0].Usage.Sandboxes != 1 {
		t.Errorf("nodes: %d %s", resp.StatusCode, b)
	}
}

func TestExecStream(t *testing.T) {
	h := newHarness(t, nil)
	sb := h.create(`{"image":"busybox"}`)
	for _, how := range []struct {
		name, body string
		hdr        []string
	}{
		{"field", `{"cmd":"echo a; echo b >&2; printf '\\377'; exit 3","stream":true}`, nil},
		{"accept", `{"cmd":"echo a; echo b >&2; printf '\\377'; exit 3"}`, []string{"Accept", "application/x-ndjson"}},
	} {
		t.Run(how.name, func(t *testing.T) {
			resp, b := h.do("POST", "/v1/sandboxes/"+sb.ID+"/exec", "application/json", strings.NewReader(how.body), how.hdr...)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
				t.Fatalf("%d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
			}
			var out, errs []byte
			var result *api.ExecResult
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				var ev api.ExecEvent
				if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				if result != nil {
					t.Fatalf("event after the result: %s", sc.Text())
				}
				data := []byte(ev.Data)
				if ev.Encoding == api.EncodingBase64 {
					data = mustB64(t, ev.Data)
				}
				switch {
				case ev.Stream == "stdout":
					out = append(out, data...)
				case ev.Stream == "stderr":
					errs = append(errs, data...)
				case ev.Result != nil:
					result = ev.Result
				default:
					t.Fatalf("unexpected event %s", sc.Text())
				}
			}
			if string(out) != "a\n\xff" || string(errs) != "b\n" || result == nil || result.ExitCode != 3 || result.StdoutBytes != 3 {
				t.Errorf("stream: out %q err %q result %+v", out, errs, result)
			}
		})
	}
}

func TestFiles(t *testing.T) {
	h := newHarness(t, nil)
	sb := h.create(`{"image":"busybox"}`)
	base := "/v1/sandboxes/" + sb.ID
	if resp, b := h.do("PUT", base+"/files?path=/work/a.txt&mode=0600", "application/octet-stream", strings.NewReader("hello")); resp.StatusCode != 204 {
		t.Fatalf("put: %d %s", resp.StatusCode, b)
	}
	resp, b := h.do("GET", base+"/files?path=/work/a.txt", "", nil)
	if resp.StatusCode != 200 || string(b) != "hello" || resp.Header.Get("X-Warren-File-Mode") != "0600" {
		t.Errorf("get file: %d %q mode %q", resp.StatusCode, b, resp.Header.Get("X-Warren-File-Mode"))
	}

	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "dir/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "dir/b.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	tw.Write([]byte("bbb"))
	tw.Close()
	if resp, b := h.do("PUT", base+"/files?path=/work", "application/x-tar", &tb); resp.StatusCode != 204 {
		t.Fatalf("put tar: %d %s", resp.StatusCode, b)
	}
	resp, b = h.do("GET", base+"/files?path=/work", "", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-tar" {
		t.Fatalf("get dir: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	names := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		c, _ := io.ReadAll(tr)
		names[hdr.Name] = string(c)
	}
	if names["work/a.txt"] != "hello" || names["work/dir/b.txt"] != "bbb" {
		t.Errorf("tar of /work has %v", names)
	}
	resp, b = h.json("GET", base+"/stat?path=/work/dir", "")
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"is_dir":true`) {
		t.Errorf("stat: %d %s", resp.StatusCode, b)
	}
}

func TestMetrics(t *testing.T) {
	h := newHarness(t, nil)
	h.create(`{"image":"busybox"}`)
	resp, b := h.do("GET", "/metrics", "", nil)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "warren_sandboxes_created_total 1") ||
		!strings.Contains(string(b), `route="POST /v1/sandboxes"`) {
		t.Errorf("metrics: %d\n%s", resp.StatusCode, b)
	}
}

func mustB64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every call on a sandbox but its GET and DELETE takes the one forwarding
// path: a verb the node serves answers through it (stats here), one that
// no node serves is a 404 not_found to anyone authenticated, and each
// keeps its rule.
func TestSandboxVerbs(t *testing.T) {
	h := newHarness(t, nil)
	sb := h.create(`{"image":"busybox"}`)
	h.json("POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":"sleep 30 & sleep 30 &"}`)
	resp, b := h.do("GET", "/v1/sandboxes/"+sb.ID+"/stats", "", nil)
	var st api.SandboxStats
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &st) != nil || st.PIDs < 2 {
		t.Errorf("stats: %d %s; want 200 with the 2 sleepers counted", resp.StatusCode, b)
	}
	for _, c := range []struct{ method, verb string }{{"POST", "nope"}, {"GET", "exec"}, {"DELETE", "files"}} {
		resp, b := h.do(c.method, "/v1/sandboxes/"+sb.ID+"/"+c.verb, "", nil)
		if resp.StatusCode != http.StatusNotFound || errorCode(t, b) != api.CodeNotFound {
			t.Errorf("%s %s: %d %s; want 404 not_found", c.method, c.verb, resp.StatusCode, b)
		}
	}
	resp, b = h.do("GET", "/v1/sandboxes/n1-aaaaaaaaaaaaaaaa/stats", "", nil)
	if resp.StatusCode != http.StatusNotFound || errorCode(t, b) != api.CodeSandboxNotFound {
		t.Errorf("stats of a missing sandbox: %d %s; want 404 sandbox_not_found", resp.StatusCode, b)
	}
}
