package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/lazy"
	"github.com/warrenhq/warren/internal/testutil"
)

// scrape returns what a Prometheus server reads from reg.
func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// TestLayerMetrics: a snapshot of the chunk cache becomes the documented
// series, each with its value: counters per layer, the fetch latency
// histogram per layer with cumulative buckets, the cache's gauges for the
// node; and the names pass Prometheus' lint.
func TestLayerMetrics(t *testing.T) {
	bounds := lazy.FetchBuckets[:]
	counts := make([]uint64, len(bounds))
	for i, b := range bounds { // one fetch of 4 ms, one of 300 ms, one over the last bound
		switch {
		case b >= 0.3:
			counts[i] = 2
		case b >= 0.004:
			counts[i] = 1
		}
	}
	const a, b = "sha256:aaaa", "sha256:bbbb"
	st := lazy.Stats{
		Counts:  lazy.Counts{Hits: 5, Misses: 3, Fetches: 2},
		Evicted: 1, Used: 4096, Limit: 1 << 30,
		Layers: []lazy.LayerStats{
			// Values all distinct, so that a series showing another's fails.
			{Digest: a, Counts: lazy.Counts{Hits: 5, Misses: 3, Fetches: 2, FetchErrors: 4, Fetched: 2 << 20, Written: 1 << 20, Prefetched: 7,
				FetchLatency: lazy.Histogram{Bounds: bounds, Counts: counts, Count: 3, Sum: 12.304}}},
			{Digest: b, Counts: lazy.Counts{FetchLatency: lazy.Histogram{Bounds: bounds, Counts: make([]uint64, len(bounds))}}},
		},
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newLayerMetrics(func() (lazy.Stats, error) { return st, nil }))
	out := scrape(t, reg)
	for _, want := range []string{
		`warren_layer_cache_hits_total{layer="sha256:aaaa"} 5`,
		`warren_layer_cache_misses_total{layer="sha256:aaaa"} 3`,
		`warren_layer_fetches_total{layer="sha256:aaaa"} 2`,
		`warren_layer_fetch_errors_total{layer="sha256:aaaa"} 4`,
		`warren_layer_fetched_bytes_total{layer="sha256:aaaa"} 2.097152e+06`,
		`warren_layer_written_bytes_total{layer="sha256:aaaa"} 1.048576e+06`,
		`warren_layer_prefetched_bytes_total{layer="sha256:aaaa"} 7`,
		`warren_layer_fetch_duration_seconds_bucket{layer="sha256:aaaa",le="0.0025"} 0`,
		`warren_layer_fetch_duration_seconds_bucket{layer="sha256:aaaa",le="0.005"} 1`,
		`warren_layer_fetch_duration_seconds_bucket{layer="sha256:aaaa",le="0.25"} 1`,
		`warren_layer_fetch_duration_seconds_bucket{layer="sha256:aaaa",le="0.5"} 2`,
		`warren_layer_fetch_duration_seconds_bucket{layer="sha256:aaaa",le="10"} 2`,
		`warren_layer_fetch_duration_seconds_bucket{layer="sha256:aaaa",le="+Inf"} 3`,
		`warren_layer_fetch_duration_seconds_sum{layer="sha256:aaaa"} 12.304`,
		`warren_layer_fetch_duration_seconds_count{layer="sha256:aaaa"} 3`,
		// A layer not read yet: its series exist, at zero.
		`warren_layer_cache_hits_total{layer="sha256:bbbb"} 0`,
		`warren_layer_fetched_bytes_total{layer="sha256:bbbb"} 0`,
		`warren_layer_fetch_duration_seconds_count{layer="sha256:bbbb"} 0`,
		// The node's cache.
		"warren_layer_cache_evictions_total 1",
		"warren_layer_cache_used_bytes 4096",
		"warren_layer_cache_limit_bytes 1.073741824e+09",
		"# TYPE warren_layer_fetch_duration_seconds histogram",
		"# TYPE warren_layer_cache_hits_total counter",
		"# TYPE warren_layer_cache_used_bytes gauge",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", out)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}

	// Stats that cannot be read: no layer series, the rest of the scrape
	// served.
	reg = prometheus.NewRegistry()
	reg.MustRegister(newLayerMetrics(func() (lazy.Stats, error) { return lazy.Stats{}, errors.New("layer server down (test)") }))
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "warren_other_total", Help: "Another metric on the registry."})
	reg.MustRegister(other)
	if out := scrape(t, reg); strings.Contains(out, "warren_layer_") || !strings.Contains(out, "warren_other_total 0\n") {
		t.Errorf("metrics with the stats unreadable:\n%s", out)
	}
}

// TestAgentMetrics: an agent serves its node's metrics on the node API's
// /metrics with no token (as an apiserver does), and nothing else without
// one: a lazily loading node its chunk cache's, with a series per layer
// that counts reads of the layer's file; an eager node none of them.
func TestAgentMetrics(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "mkfs.erofs")
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.Unavailable(t, "needs /dev/fuse: %v", err)
	}
	c := startCluster(t, "")
	eager := c.mustAgent("eager", c.nodeToken(), true)
	lazyAgent := c.mustAgent("lazy", c.nodeToken(), true, func(cfg *AgentConfig) {
		cfg.Layers = LayersConfig{Lazy: true, CacheBytes: 1 << 30}
	})
	get := func(a *testAgent, path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + a.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(eager, "/metrics"); code != http.StatusOK || strings.Contains(body, "warren_layer_") {
		t.Errorf("an eager node's /metrics: %d, want 200 with no layer metrics:\n%s", code, body)
	}
	if code, _ := get(lazyAgent, "/v1/status"); code != http.StatusUnauthorized {
		t.Errorf("the node API's status with no token: %d, want 401", code)
	}
	code, body := get(lazyAgent, "/metrics")
	if code != http.StatusOK || !strings.Contains(body, "warren_layer_cache_limit_bytes 1.073741824e+09\n") {
		t.Fatalf("a lazy node's /metrics: %d, want 200 with its cache's limit:\n%s", code, body)
	}

	// A sandbox from a layer puts the layer on the lazy filesystem (the
	// fake backend reads none of it); reading its file counts against it.
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	// Random bytes: no two blocks alike (equal blocks are one piece in
	// the cache, fetched once).
	content := make([]byte, 900<<10)
	rand.NewChaCha8([32]byte{1}).Read(content)
	tw.WriteHeader(&tar.Header{Name: "data", Mode: 0o644, Size: int64(len(content))})
	tw.Write(content)
	tw.Close()
	ctx := context.Background()
	layer, err := c.admin.BuildLayer(ctx, client.LayerSpec{Name: "data", Version: "1", Kind: api.LayerBase}, &layerTar)
	if err != nil {
		t.Fatal(err)
	}
	c.waitHealthy(lazyAgent.id, eager.id)
	var sb *api.Sandbox
	for range 20 { // placed on either node: until one lands on the lazy one
		if sb, err = c.admin.CreateSandbox(ctx, api.CreateSandboxRequest{Layers: []string{"data@1"}}); err != nil {
			t.Fatal(err)
		}
		if sb.Node == lazyAgent.id {
			break
		}
	}
	if sb.Node != lazyAgent.id {
		t.Fatalf("no sandbox placed on the lazy node %s", lazyAgent.id)
	}
	file := filepath.Join(c.dir, "lazy", "node", "lazy", "mnt", strings.TrimPrefix(layer.Digest, "sha256:")+".erofs")
	img, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read the layer's lazy file: %v", err)
	}
	series := func(name string) float64 {
		t.Helper()
		_, body := get(lazyAgent, "/metrics")
		m := regexp.MustCompile("(?m)^" + regexp.QuoteMeta(name+`{layer="`+layer.Digest+`"} `) + "(.+)$").FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no %s of layer %s in:\n%s", name, layer.Digest, body)
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	deadline := time.Now().Add(5 * time.Second) // readahead may still be fetching
	for series("warren_layer_fetched_bytes_total") != float64(len(img)) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("layer %s: %d bytes, sandbox on %s", layer.Digest, len(img), sb.Node)
	if got := series("warren_layer_fetched_bytes_total"); got != float64(len(img)) {
		t.Errorf("after reading the layer's %d bytes: %v bytes fetched for it", len(img), got)
	}
	if got := series("warren_layer_fetch_duration_seconds_count"); got != series("warren_layer_fetches_total") || got == 0 {
		t.Errorf("fetch latency observations %v, want one per fetch (%v)", got, series("warren_layer_fetches_total"))
	}
}
