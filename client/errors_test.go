package client

import (
	"io"
	"net/http"
	"strings"
	"testing"
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
