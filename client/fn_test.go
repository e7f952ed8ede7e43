package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// fnServer answers /v1/fn/* with fixed bodies, after refusals 429s on run,
// and records the last request body.
func fnServer(t *testing.T, refusals int) (*httptest.Server, *atomic.Int32, *[]byte) {
	t.Helper()
	var calls atomic.Int32
	var last []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		last, _ = io.ReadAll(r.Body)
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(401)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/fn/run":
			if int(calls.Add(1)) <= refusals {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(429)
				io.WriteString(w, `{"error":{"code":"fn_overloaded","message":"busy","retry_after":1}}`)
				return
			}
			io.WriteString(w, `{"runtime":"python3","status":"WrongAnswer","node":"n1","wall_ms":9,
				"compile":{"status":"OK","stdout":"","stderr":"d2Fybgo=","stderr_encoding":"base64"},
				"cases":[{"status":"OK","stdout":"aGkK","stdout_encoding":"base64","stderr":"","cpu_ms":3},
				         {"status":"WrongAnswer","stdout":"/wA=","stdout_encoding":"base64","stderr":"e"}]}`)
		case "POST /v1/fn/batch":
			io.WriteString(w, `{"results":[{"result":{"runtime":"sh","status":"OK","cases":[{"status":"OK","stdout":"eA==","stdout_encoding":"base64","stderr":""}]}},
				{"error":{"code":"fn_overloaded","message":"busy","retry_after":2}},
				{"error":{"code":"runtime_not_found","message":"no cobol"}}]}`)
		case "GET /v1/fn/runtimes":
			io.WriteString(w, `{"runtimes":[{"name":"python3","env":"py@1","source":"main.py","run":["python3","main.py"],"available":true,"ready":3,"busy":1,"pool_min":2,"pool_max":8}]}`)
		default:
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"code":"not_found","message":"no route"}}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &calls, &last
}

func TestRunFn(t *testing.T) {
	srv, _, last := fnServer(t, 0)
	c := New(srv.URL, "tok")
	req := api.FnRunRequest{Runtime: "python3", Source: "print(input())", Cases: []api.FnCase{
		NewFnCase([]byte("hi\n"), []byte("hi\n")), NewFnCase([]byte{0xff}, nil)},
		Files:  []api.FnFile{NewFnFile("data.bin", []byte{0, 0xfe}, 0o600), NewFnFile("a.txt", []byte("text"), 0)},
		Limits: api.FnLimits{CPUTime: api.Duration(2 * time.Second), Memory: 256 << 20}}
	res, err := c.RunFn(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	// Output arrives decoded.
	if res.Status != api.FnWrongAnswer || res.Node != "n1" || res.Cases[0].Stdout != "hi\n" || res.Cases[0].StdoutEncoding != "" ||
		res.Cases[1].Stdout != "\xff\x00" || res.Compile.Stderr != "warn\n" || res.Cases[0].CPUMs != 3 {
		t.Errorf("result: %+v", res)
	}
	// Binary inputs went base64, text as is.
	var sent api.FnRunRequest
	if err := json.Unmarshal(*last, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.Cases[0].Stdin != "hi\n" || sent.Cases[0].StdinEncoding != "" || *sent.Cases[0].Expected != "hi\n" ||
		sent.Cases[1].StdinEncoding != api.EncodingBase64 || sent.Cases[1].Stdin != base64.StdEncoding.EncodeToString([]byte{0xff}) ||
		sent.Cases[1].Expected != nil || sent.Files[0].Encoding != api.EncodingBase64 || sent.Files[0].Mode != 0o600 ||
		sent.Files[1].Content != "text" || sent.Limits.CPUTime.D() != 2*time.Second || sent.Limits.Memory != 256<<20 {
		t.Errorf("sent %s", *last)
	}

	var r api.FnRunRequest
	SetFnStdin(&r, []byte{1, 0xff})
	if r.StdinEncoding != api.EncodingBase64 {
		t.Errorf("SetFnStdin of binary: %+v", r)
	}
}

func TestRunFnRetriesOverload(t *testing.T) {
	srv, calls, _ := fnServer(t, 2)
	c := New(srv.URL, "tok")
	var waits []time.Duration
	c.sleep = func(ctx context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	if _, err := c.RunFn(context.Background(), api.FnRunRequest{Runtime: "python3"}); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 3 || len(waits) != 2 || waits[0] < time.Second {
		t.Errorf("%d calls, waits %v", calls.Load(), waits)
	}

	srv, calls, _ = fnServer(t, 5)
	c = New(srv.URL, "tok", WithCreateRetry(RetryPolicy{}))
	_, err := c.RunFn(context.Background(), api.FnRunRequest{Runtime: "python3"})
	if !IsFnOverloaded(err) || !IsExhausted(err) || RetryAfter(err) != time.Second || calls.Load() != 1 {
		t.Errorf("without retry: %v after %d calls", err, calls.Load())
	}
}

func TestRunFnBatchAndRuntimes(t *testing.T) {
	srv, _, _ := fnServer(t, 0)
	c := New(srv.URL, "tok")
	out, err := c.RunFnBatch(context.Background(), api.FnBatchRequest{Calls: []api.FnRunRequest{{Runtime: "sh"}, {Runtime: "sh"}, {Runtime: "cobol"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Results) != 3 || out.Results[0].Result.Cases[0].Stdout != "x" || ItemError(out.Results[0].Error) != nil {
		t.Errorf("batch: %+v", out)
	}
	if err := ItemError(out.Results[1].Error); !IsFnOverloaded(err) || !errors.Is(err, ErrExhausted) || RetryAfter(err) != 2*time.Second {
		t.Errorf("item 1: %v", err)
	}
	if err := ItemError(out.Results[2].Error); !IsRuntimeNotFound(err) || !IsNotFound(err) {
		t.Errorf("item 2: %v", err)
	}

	rts, err := c.ListFnRuntimes(context.Background())
	if err != nil || len(rts) != 1 || rts[0].Name != "python3" || rts[0].Ready != 3 || rts[0].PoolMax != 8 || rts[0].Run[1] != "main.py" {
		t.Errorf("runtimes: %+v, %v", rts, err)
	}
	if _, err := New(srv.URL, "bad").ListFnRuntimes(context.Background()); !IsUnauthenticated(err) {
		t.Errorf("bad token: %v", err)
	}
}
