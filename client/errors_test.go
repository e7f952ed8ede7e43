package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// An answer with infra_error is the platform's fault: IsInfra says so,
// and why; one without is not.
func TestIsInfra(t *testing.T) {
	for body, want := range map[string]string{
		`{"error":{"code":"sandbox_lost","message":"lost","infra_error":"the sandbox's node was lost"}}`: "the sandbox's node was lost",
		`{"error":{"code":"no_capacity","message":"no room"}}`:                                           "",
	} {
		e := decodeError(&http.Response{StatusCode: 503, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body))})
		if got, ok := IsInfra(e); got != want || ok != (want != "") {
			t.Errorf("IsInfra of %s = %q, %v; want %q", body, got, ok, want)
		}
	}
}

// A bulk pause answered as a stream: progress hears each sandbox, and the
// result comes last; an error event mid-stream is the call's error.
func TestPauseSandboxesProgress(t *testing.T) {
	for _, tc := range []struct {
		lines   string
		calls   string
		wantErr bool
	}{
		{`{"total":2}` + "\n" + `{"sandbox":{"id":"a","node":"n1","state":"paused"}}` + "\n" + `{"sandbox":{"id":"b","node":"n1","state":"paused"}}` + "\n" +
			`{"result":{"sandboxes":[{"id":"a"},{"id":"b"}],"nodes":{"n1":{"done":2,"failed":0}}}}` + "\n", "0/2 1/2 2/2", false},
		{`{"total":1}` + "\n" + `{"error":{"code":"unavailable","message":"etcd down"}}` + "\n", "0/1", true},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/sandboxes:pause" || r.Header.Get("Accept") != "application/x-ndjson" {
				t.Errorf("request %s accept %q", r.URL.Path, r.Header.Get("Accept"))
			}
			w.Header().Set("Content-Type", "application/x-ndjson")
			io.WriteString(w, tc.lines)
		}))
		var calls []string
		res, err := New(srv.URL, "tok").PauseSandboxesProgress(context.Background(), api.PauseSelector{Project: "p"}, false, func(done, total int) {
			calls = append(calls, fmt.Sprintf("%d/%d", done, total))
		})
		srv.Close()
		if got := strings.Join(calls, " "); got != tc.calls || (err != nil) != tc.wantErr || !tc.wantErr && (res == nil || res.Nodes["n1"].Done != 2) {
			t.Errorf("progress %q, result %+v, err %v; want %q, error %v", got, res, err, tc.calls, tc.wantErr)
		}
	}
}
