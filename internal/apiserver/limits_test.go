package apiserver_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/node"
)

// js marshals v for a request body.
func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func manyKV(n int, v string) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("k%d", i)] = v
	}
	return m
}

func manyStrings(n int, s string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestOversizedInputs sends every request field a caller controls past its
// documented limit (api/limits.go) and checks the 400 and its code.
func TestOversizedInputs(t *testing.T) {
	h := newHarness(t, nil)
	sb := h.create(`{"image":"busybox"}`)
	execPath := "/v1/sandboxes/" + sb.ID + "/exec"
	big := func(n int) string { return strings.Repeat("x", n) }
	create := func(mod func(r *api.CreateSandboxRequest)) string {
		r := api.CreateSandboxRequest{Image: "busybox"}
		mod(&r)
		return js(r)
	}
	exec := func(mod func(r *api.ExecRequest)) string {
		r := api.ExecRequest{Argv: []string{"true"}}
		mod(&r)
		return js(r)
	}
	fn := func(mod func(r *api.FnRunRequest)) string {
		r := api.FnRunRequest{Runtime: "python3", Source: "print(1)"}
		mod(&r)
		return js(r)
	}
	const tooLarge, invalid = api.CodeTooLarge, api.CodeInvalid
	for _, tc := range []struct {
		name, path, body, code string
	}{
		{"create: a 30 MiB env value", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Env = map[string]string{"BIG": big(30 << 20)} }), tooLarge},
		{"create: one env entry past 128 KiB", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Env = map[string]string{"A": big(api.MaxEnvEntry)} }), tooLarge},
		{"create: env bytes", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Env = manyKV(4, big(100<<10)) }), tooLarge},
		{"create: env count", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Env = manyKV(api.MaxEnvVars+1, "") }), tooLarge},
		{"create: label count", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Labels = manyKV(api.MaxLabels+1, "v") }), tooLarge},
		{"create: label value", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Labels = map[string]string{"k": big(api.MaxLabelValue + 1)} }), tooLarge},
		{"create: label key", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Labels = map[string]string{big(api.MaxLabelKey + 1): "v"} }), tooLarge},
		{"create: bad label key", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Labels = map[string]string{"-x": "v"} }), invalid},
		{"create: node_selector count", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.NodeSelector = manyKV(api.MaxNodeSelector+1, "v") }), tooLarge},
		{"create: node_selector value", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) {
			r.NodeSelector = map[string]string{"rack": big(api.MaxLabelValue + 1)}
		}), tooLarge},
		{"create: image ref", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Image = big(api.MaxRefLen + 1) }), tooLarge},
		{"create: layer count", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Image, r.Layers = "", manyStrings(api.MaxLayers+1, "base") }), tooLarge},
		{"create: layer ref", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Image, r.Layers = "", []string{big(api.MaxRefLen + 1)} }), tooLarge},
		{"create: project", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Project = big(api.MaxRefLen + 1) }), tooLarge},
		{"create: pool", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Pool = big(api.MaxRefLen + 1) }), tooLarge},
		{"create: unknown pool", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Pool = "edge" }), invalid},
		{"env create: env", "/v1/environments", js(api.CreateEnvironmentRequest{Name: "e", Base: "b", Env: map[string]string{"A": big(api.MaxEnvEntry)}}), tooLarge},
		{"env create: entrypoint", "/v1/environments", js(api.CreateEnvironmentRequest{Name: "e", Base: "b", Entrypoint: manyStrings(api.MaxArgs+1, "a")}), tooLarge},
		{"env create: toolkits", "/v1/environments", js(api.CreateEnvironmentRequest{Name: "e", Base: "b", Toolkits: manyStrings(api.MaxLayers+1, "t")}), tooLarge},
		{"create: backend", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.Backend = big(api.MaxRefLen + 1) }), tooLarge},
		{"create: idempotency key", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.IdempotencyKey = big(api.MaxIdempotencyKey + 1) }), tooLarge},
		{"create: ttl", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.TTL = api.Duration(api.MaxTTL + time.Second) }), invalid},
		{"create: idle_timeout", "/v1/sandboxes", create(func(r *api.CreateSandboxRequest) { r.IdleTimeout = api.Duration(api.MaxTTL + time.Second) }), invalid},
		{"batch: count", "/v1/sandboxes:batch", js(api.BatchCreateRequest{Count: api.MaxBatchCount + 1, Template: api.CreateSandboxRequest{Image: "busybox"}}), invalid},
		{"batch: template labels leave room for the gang's", "/v1/sandboxes:batch", js(api.BatchCreateRequest{Count: 2, Template: api.CreateSandboxRequest{Image: "busybox", Labels: manyKV(api.MaxLabels-1, "v")}}), tooLarge},
		{"batch: template env", "/v1/sandboxes:batch", js(api.BatchCreateRequest{Count: 2, Template: api.CreateSandboxRequest{Image: "busybox", Env: map[string]string{"A": big(api.MaxEnvEntry)}}}), tooLarge},
		{"exec: max_output 1Gi", execPath, `{"argv":["true"],"max_output":"1Gi"}`, tooLarge},
		{"exec: max_output just past the maximum", execPath, exec(func(r *api.ExecRequest) { r.MaxOutput = api.MaxExecOutput + 1 }), tooLarge},
		{"exec: argv count", execPath, exec(func(r *api.ExecRequest) { r.Argv = manyStrings(api.MaxArgs+1, "a") }), tooLarge},
		{"exec: one argument", execPath, exec(func(r *api.ExecRequest) { r.Argv = []string{"echo", big(api.MaxArgLen + 1)} }), tooLarge},
		{"exec: argv bytes", execPath, exec(func(r *api.ExecRequest) { r.Argv = manyStrings(16, big(100<<10)) }), tooLarge},
		{"exec: cmd", execPath, exec(func(r *api.ExecRequest) { r.Argv, r.Cmd = nil, big(api.MaxArgLen+1) }), tooLarge},
		{"exec: env value", execPath, exec(func(r *api.ExecRequest) { r.Env = map[string]string{"A": big(api.MaxEnvEntry)} }), tooLarge},
		{"exec: env count", execPath, exec(func(r *api.ExecRequest) { r.Env = manyKV(api.MaxEnvVars+1, "") }), tooLarge},
		{"exec: cwd", execPath, exec(func(r *api.ExecRequest) { r.Cwd = "/" + big(api.MaxPathLen) }), tooLarge},
		{"exec: user", execPath, exec(func(r *api.ExecRequest) { r.User = big(api.MaxUserLen + 1) }), tooLarge},
		{"exec: stdin", execPath, exec(func(r *api.ExecRequest) { r.Stdin = big(api.MaxExecStdin + 1) }), tooLarge},
		{"exec: base64 stdin", execPath, exec(func(r *api.ExecRequest) {
			r.Stdin, r.StdinEncoding = base64.StdEncoding.EncodeToString(make([]byte, api.MaxExecStdin+3)), api.EncodingBase64
		}), tooLarge},
		{"exec: timeout", execPath, exec(func(r *api.ExecRequest) { r.Timeout = api.Duration(api.MaxExecTimeout + time.Second) }), invalid},
		{"fn: runtime", "/v1/fn/run", fn(func(r *api.FnRunRequest) { r.Runtime = big(api.MaxRefLen + 1) }), tooLarge},
		{"fn: files", "/v1/fn/run", fn(func(r *api.FnRunRequest) {
			r.Files = make([]api.FnFile, api.MaxFnFiles+1)
		}), tooLarge},
		{"fn: file path", "/v1/fn/run", fn(func(r *api.FnRunRequest) { r.Files = []api.FnFile{{Path: big(api.MaxPathLen + 1)}} }), tooLarge},
		{"fn: cases", "/v1/fn/run", fn(func(r *api.FnRunRequest) { r.Cases = make([]api.FnCase, api.MaxFnCases+1) }), tooLarge},
		{"fn: inputs", "/v1/fn/run", fn(func(r *api.FnRunRequest) {
			r.Cases = []api.FnCase{{Stdin: big(api.MaxFnInput / 2)}, {Stdin: big(api.MaxFnInput / 2)}}
		}), tooLarge},
		{"fn: stdin", "/v1/fn/run", fn(func(r *api.FnRunRequest) { r.Stdin = big(api.MaxFnInput + 1) }), tooLarge},
		{"fn: args", "/v1/fn/run", fn(func(r *api.FnRunRequest) { r.Args = manyStrings(api.MaxArgs+1, "a") }), tooLarge},
		{"fn: env", "/v1/fn/run", fn(func(r *api.FnRunRequest) { r.Env = map[string]string{"A": big(api.MaxEnvEntry)} }), tooLarge},
		{"fn batch: calls", "/v1/fn/batch", js(api.FnBatchRequest{Calls: make([]api.FnRunRequest, api.MaxFnBatch+1)}), invalid},
		{"fn batch: a call's input", "/v1/fn/batch", js(api.FnBatchRequest{Calls: []api.FnRunRequest{{Runtime: "sh"}, {Runtime: "sh", Stdin: big(api.MaxFnInput + 1)}}}), tooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := h.json("POST", tc.path, tc.body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("got %d %.300s, want 400", resp.StatusCode, b)
			}
			if got := errorCode(t, b); got != tc.code {
				t.Fatalf("code %s (%.300s), want %s", got, b, tc.code)
			}
		})
	}

	// A body past api.MaxRequestBody: refused by its Content-Length, and
	// when it comes chunked, once that much is read.
	body := bytes.Repeat([]byte(" "), api.MaxRequestBody+1)
	for _, chunked := range []bool{false, true} {
		var r io.Reader = bytes.NewReader(body)
		if chunked {
			r = io.MultiReader(r) // no length known: sent chunked
		}
		resp, b := h.do("POST", "/v1/sandboxes", "application/json", r)
		if resp.StatusCode != http.StatusBadRequest || errorCode(t, b) != api.CodeTooLarge {
			t.Errorf("body of %d bytes (chunked %v): got %d %.300s, want 400 %s", len(body), chunked, resp.StatusCode, b, api.CodeTooLarge)
		}
	}

	// Nothing above was created, and the sandbox still takes execs.
	resp, b := h.json("POST", execPath, `{"argv":["echo","ok"]}`)
	var res api.ExecResult
	if resp.StatusCode != 200 || json.Unmarshal(b, &res) != nil || res.Stdout != "ok\n" {
		t.Fatalf("exec after the refusals: %d %s", resp.StatusCode, b)
	}
	resp, b = h.json("GET", "/v1/sandboxes", "")
	var list api.SandboxList
	if json.Unmarshal(b, &list); len(list.Sandboxes) != 1 {
		t.Fatalf("after the refusals: %d sandboxes, want 1: %.500s", len(list.Sandboxes), b)
	}
}

// heapBytes is the Go heap's live and not-yet-collected objects.
func heapBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// peakHeap samples heapBytes until stop is closed and returns the peak.
func peakHeap(stop <-chan struct{}) func() uint64 {
	var peak atomic.Uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if h := heapBytes(); h > peak.Load() {
				peak.Store(h)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { wg.Wait(); return peak.Load() }
}

// tail keeps the last bytes written to it, and counts them all.
type tail struct {
	n   int64
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.n += int64(len(p))
	t.buf = append(t.buf, p...)
	if len(t.buf) > 8<<10 {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-4<<10:]...)
	}
	return len(p), nil
}

// TestExecOutputMemoryFlat runs execs writing ~400 MB to stdout (and
// 200 MB to stderr) with the maximum max_output, buffered and streamed,
// through the apiserver and the in-process node of warren up, and through
// an apiserver forwarding to a node over HTTP, and checks
// that the process's Go heap never grows by more than 64 MiB: output is
// spooled to disk and streamed back, never held.
func TestExecOutputMemoryFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 1.2 GB through an exec")
	}
	spool := t.TempDir()
	single := newHarness(t, func(c *node.Config) { c.SpoolDir = spool })
	fleet := newFleetWith(t, fleetOptions{node: func(_ string, c *node.Config) { c.SpoolDir = spool }}, "m1")
	const limit = 64 << 20
	script := `yes 'output line, "quoted" <tag> & tab	here' | head -c 400000000; yes e | head -c 200000000 >&2`
	for _, tc := range []struct {
		name   string
		h      *harness
		stream bool
	}{
		{"single node, buffered", single, false},
		{"single node, streamed", single, true},
		{"fleet, buffered", fleet.harness, false},
		{"fleet, streamed", fleet.harness, true},
	} {
		h, stream := tc.h, tc.stream
		sb := h.create(`{"image":"busybox"}`)
		t.Run(tc.name, func(t *testing.T) {
			runtime.GC()
			base := heapBytes()
			stop := make(chan struct{})
			peak := peakHeap(stop)
			body := js(api.ExecRequest{Argv: []string{"sh", "-c", script}, MaxOutput: api.MaxExecOutput, Stream: stream, Timeout: api.Duration(5 * time.Minute)})
			req, _ := http.NewRequest("POST", h.url+"/v1/sandboxes/"+sb.ID+"/exec", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var got tail
			_, err = io.Copy(&got, resp.Body)
			resp.Body.Close()
			close(stop)
			p := peak()
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("exec: %d, %v: %.300s", resp.StatusCode, err, got.buf)
			}
			t.Logf("answer %d bytes; heap %d MiB before, peak %d MiB (+%d MiB)", got.n, base>>20, p>>20, (int64(p)-int64(base))>>20)
			if p > base+limit {
				t.Errorf("heap grew from %d MiB to %d MiB during the exec, want at most +%d MiB", base>>20, p>>20, limit>>20)
			}
			// The answer ends with the result, which counts every byte
			// and says what was cut.
			last := got.buf[bytes.LastIndexByte(got.buf[:len(got.buf)-1], '\n')+1:]
			var res api.ExecResult
			if stream {
				var ev api.ExecEvent
				if err := json.Unmarshal(last, &ev); err != nil || ev.Result == nil {
					t.Fatalf("last event %.300q: %v", last, err)
				}
				res = *ev.Result
			} else {
				// The buffered answer is one object: check its end here and
				// the whole of it in TestSpoolJSON (guard).
				i := bytes.Index(got.buf, []byte(`","stdout_truncated":`))
				if i < 0 || json.Unmarshal(append([]byte(`{"stderr":"`), got.buf[i:]...), &res) != nil {
					t.Fatalf("answer ends %.300q", got.buf)
				}
				if min := int64(api.MaxExecOutput*2 + 100<<20); got.n < min {
					t.Errorf("buffered answer %d bytes, want at least %d (both streams at max_output, escaped)", got.n, min)
				}
			}
			if !res.StdoutTruncated || res.StdoutBytes != 400000000 || !res.StderrTruncated || res.StderrBytes != 200000000 || res.ExitCode != 0 {
				t.Errorf("result %+v, want both truncated with 400000000 and 200000000 bytes, exit 0", res)
			}
		})
	}
}
