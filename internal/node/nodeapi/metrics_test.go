package nodeapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/node/nodetest"
)

// TestMetrics: /metrics is served once ServeMetrics gave the server a
// handler, with no token, as an apiserver serves its own; every other
// call still wants the node's secret, and a server without a handler has
// no /metrics to show.
func TestMetrics(t *testing.T) {
	agent := nodetest.New(t, nil)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "warren_test_metric 1\n")
	})
	with := httptest.NewServer(nodeapi.NewServer(agent, nodeapi.Secret(token), quiet).ServeMetrics(metrics))
	t.Cleanup(with.Close)
	without := httptest.NewServer(nodeapi.NewServer(agent, nodeapi.Secret(token), quiet))
	t.Cleanup(without.Close)
	get := func(url, tok string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(with.URL+"/metrics", ""); code != http.StatusOK || !strings.Contains(body, "warren_test_metric 1") {
		t.Errorf("/metrics with no token: %d %q, want 200 and the metrics", code, body)
	}
	if code, _ := get(with.URL+"/v1/status", ""); code != http.StatusUnauthorized {
		t.Errorf("/v1/status with no token beside /metrics: %d, want 401", code)
	}
	if code, _ := get(without.URL+"/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics of a server without metrics, no token: %d, want 401", code)
	}
	if code, _ := get(without.URL+"/metrics", token); code != http.StatusNotFound {
		t.Errorf("/metrics of a server without metrics: %d, want 404", code)
	}
}
