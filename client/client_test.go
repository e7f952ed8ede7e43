package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

func TestNormalizeAddr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", DefaultAddr},
		{"127.0.0.1:7443", "http://127.0.0.1:7443"},
		{"http://h:1/", "http://h:1"},
		{"https://warren.example.com", "https://warren.example.com"},
		{" host:80 ", "http://host:80"},
	} {
		if got := normalizeAddr(tc.in); got != tc.want {
			t.Errorf("normalizeAddr(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestErrorDecoding(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		header     map[string]string
		body       string
		wantCode   string
		wantMsg    string
		wantRetry  time.Duration
		is         error
		notIs      error
		fileNotFnd bool
	}{
		{
			name: "sandbox not found", status: 404,
			body:     `{"error":{"code":"sandbox_not_found","message":"sandbox n1-x not found"}}`,
			wantCode: api.CodeSandboxNotFound, wantMsg: "sandbox n1-x not found", is: ErrNotFound, notIs: ErrConflict,
		},
		{
			name: "file not found", status: 404,
			body:     `{"error":{"code":"file_not_found","message":"/x: no such file"}}`,
			wantCode: api.CodeFileNotFound, wantMsg: "/x: no such file", is: ErrNotFound, fileNotFnd: true,
		},
		{
			name: "conflict", status: 409, body: `{"error":{"code":"conflict","message":"busy"}}`,
			wantCode: api.CodeConflict, wantMsg: "busy", is: ErrConflict, notIs: ErrNotFound,
		},
		{
			name: "429 header wins over body", status: 429, header: map[string]string{"Retry-After": "7"},
			body:     `{"error":{"code":"node_full","message":"node full","retry_after":3}}`,
			wantCode: api.CodeNodeFull, wantMsg: "node full", wantRetry: 7 * time.Second, is: ErrExhausted,
		},
		{
			name: "429 body retry_after only", status: 429,
			body:     `{"error":{"code":"resource_exhausted","message":"quota","retry_after":3}}`,
			wantCode: api.CodeExhausted, wantMsg: "quota", wantRetry: 3 * time.Second, is: ErrExhausted,
		},
		{
			name: "503 backend", status: 503, header: map[string]string{"Retry-After": "1"},
			body:     `{"error":{"code":"backend_unavailable","message":"no microvm here"}}`,
			wantCode: api.CodeBackendUnavailable, wantMsg: "no microvm here", wantRetry: time.Second, is: ErrUnavailable,
		},
		{
			name: "401", status: 401, body: `{"error":{"code":"unauthenticated","message":"bad token"}}`,
			wantCode: api.CodeUnauthenticated, wantMsg: "bad token", is: ErrUnauthenticated,
		},
		{
			name: "proxy html", status: 502, body: "<html>bad gateway</html>",
			wantCode: api.CodeUnavailable, wantMsg: "<html>bad gateway</html>", is: ErrUnavailable,
		},
		{
			name: "empty body", status: 403, body: "",
			wantCode: api.CodeForbidden, wantMsg: "Forbidden", is: ErrForbidden,
		},
		{
			name: "unknown code classifies by status", status: 400, body: `{"error":{"code":"shiny_new","message":"no"}}`,
			wantCode: "shiny_new", wantMsg: "no", is: ErrInvalid,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			c := New(srv.URL, "tok", WithCreateRetry(RetryPolicy{}))
			_, err := c.GetSandbox(context.Background(), "n1-x")
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %T %v, want *Error", err, err)
			}
			if e.StatusCode != tc.status || e.Code != tc.wantCode || e.Message != tc.wantMsg || e.RetryAfter != tc.wantRetry {
				t.Errorf("got %+v, want status %d code %q message %q retry %v", *e, tc.status, tc.wantCode, tc.wantMsg, tc.wantRetry)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(err, %v) = false, want true", tc.is)
			}
			if tc.notIs != nil && errors.Is(err, tc.notIs) {
				t.Errorf("errors.Is(err, %v) = true, want false", tc.notIs)
			}
			if IsFileNotFound(err) != tc.fileNotFnd {
				t.Errorf("IsFileNotFound = %v, want %v", !tc.fileNotFnd, tc.fileNotFnd)
			}
		})
	}
}

func TestErrorString(t *testing.T) {
	e := &Error{StatusCode: 404, Code: api.CodeSandboxNotFound, Message: "sandbox x not found"}
	if got, want := e.Error(), "sandbox x not found (sandbox_not_found)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestAuthAndUserAgent(t *testing.T) {
	var gotAuth, gotUA string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotUA = r.Header.Get("Authorization"), r.Header.Get("User-Agent")
		io.WriteString(w, `{"sandboxes":[]}`)
	}))
	defer srv.Close()
	c := New(strings.TrimPrefix(srv.URL, "http://"), "s3cret", WithUserAgent("trainer/1"))
	if _, err := c.ListSandboxes(context.Background(), ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if gotAuth != "Bearer s3cret" || gotUA != "trainer/1" {
		t.Errorf("got Authorization %q User-Agent %q", gotAuth, gotUA)
	}
}

func TestListQuery(t *testing.T) {
	var got []string
	var state string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, state = r.URL.Query()["label"], r.URL.Query().Get("state")
		io.WriteString(w, `{"sandboxes":[{"id":"n1-1","state":"running"}]}`)
	}))
	defer srv.Close()
	list, err := New(srv.URL, "").ListSandboxes(context.Background(), ListOptions{
		Labels: map[string]string{"task": "demo", "run": "7"}, State: api.StateRunning,
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "run=7,task=demo" || state != "running" || len(list) != 1 || list[0].ID != "n1-1" {
		t.Errorf("got labels %q state %q list %+v", got, state, list)
	}
}

// retryServer refuses the first n creates with status and Retry-After.
func retryServer(t *testing.T, n, status int, retryAfter string) (*httptest.Server, *int) {
	t.Helper()
	var mu sync.Mutex
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		c := calls
		mu.Unlock()
		if c <= n {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.WriteHeader(status)
			io.WriteString(w, `{"error":{"code":"node_full","message":"full"}}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"n1-1","state":"running"}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func TestCreateRetry(t *testing.T) {
	for _, tc := range []struct {
		name       string
		refusals   int
		status     int
		retryAfter string
		policy     RetryPolicy
		wantErr    bool
		wantCalls  int
		wantWaits  []time.Duration // lower bounds; jitter adds up to 20%
	}{
		{"429 honours Retry-After", 2, 429, "2", RetryPolicy{MaxAttempts: 3, MaxWait: 10 * time.Second}, false, 3, []time.Duration{2 * time.Second, 2 * time.Second}},
		{"503 default wait", 1, 503, "", RetryPolicy{MaxAttempts: 3, MaxWait: 10 * time.Second, DefaultWait: 500 * time.Millisecond}, false, 2, []time.Duration{500 * time.Millisecond}},
		{"gives up after MaxAttempts", 5, 429, "1", RetryPolicy{MaxAttempts: 3, MaxWait: 10 * time.Second}, true, 3, []time.Duration{time.Second, time.Second}},
		{"too long a wait is returned", 1, 429, "60", RetryPolicy{MaxAttempts: 3, MaxWait: 10 * time.Second}, true, 1, nil},
		{"retry off", 1, 429, "1", RetryPolicy{}, true, 1, nil},
		{"400 not retried", 1, 400, "", DefaultRetry, true, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, calls := retryServer(t, tc.refusals, tc.status, tc.retryAfter)
			c := New(srv.URL, "", WithCreateRetry(tc.policy))
			var waits []time.Duration
			c.sleep = func(ctx context.Context, d time.Duration) error { waits = append(waits, d); return nil }
			sb, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{Image: "busybox"})
			if (err != nil) != tc.wantErr {
				t.Fatalf("got err %v, want error %v", err, tc.wantErr)
			}
			if err == nil && sb.ID != "n1-1" {
				t.Errorf("got id %q", sb.ID)
			}
			if *calls != tc.wantCalls {
				t.Errorf("got %d calls, want %d", *calls, tc.wantCalls)
			}
			if len(waits) != len(tc.wantWaits) {
				t.Fatalf("got waits %v, want %v", waits, tc.wantWaits)
			}
			for i, w := range tc.wantWaits {
				if waits[i] < w || waits[i] > w+w/5 {
					t.Errorf("wait %d = %v, want %v..%v", i, waits[i], w, w+w/5)
				}
			}
			if tc.wantErr && tc.status == 429 && tc.refusals > 0 && !IsExhausted(err) {
				t.Errorf("got %v, want an exhausted error", err)
			}
		})
	}
}

func TestCreateRetryHonoursContext(t *testing.T) {
	srv, calls := retryServer(t, 5, 429, "1")
	c := New(srv.URL, "")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox"})
	if !IsExhausted(err) {
		t.Fatalf("got %v, want the last refusal", err)
	}
	if el := time.Since(start); el > 900*time.Millisecond {
		t.Errorf("took %v; the wait should end with the context", el)
	}
	if *calls != 1 {
		t.Errorf("got %d calls, want 1", *calls)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"3", 3 * time.Second, true},
		{"0", 0, true},
		{"-1", 0, false},
		{"", 0, false},
		{"soon", 0, false},
		{now.Add(5 * time.Second).Format(http.TimeFormat), 5 * time.Second, true},
	} {
		got, ok := parseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
