package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/warrenhq/warren/internal/lazy"
)

// layerMetrics exports a lazily loading node's chunk cache (lazy.FS.Stats)
// as Prometheus metrics, read afresh at every scrape:
//
//	warren_layer_cache_hits_total{layer}          chunk reads served from the local cache
//	warren_layer_cache_misses_total{layer}        chunk reads that waited for a fetch
//	warren_layer_fetches_total{layer}             chunks fetched from the blob store
//	warren_layer_fetch_errors_total{layer}        failed fetch attempts
//	warren_layer_fetched_bytes_total{layer}       bytes fetched from the blob store
//	warren_layer_written_bytes_total{layer}       bytes written to the node's disk
//	warren_layer_prefetched_bytes_total{layer}    bytes fetched by replaying the layer's prefetch trace
//	warren_layer_fetch_duration_seconds{layer}    histogram: each fetch, retries included
//	warren_layer_cache_evictions_total            chunks evicted for room
//	warren_layer_cache_used_bytes                 held now
//	warren_layer_cache_limit_bytes                the cache's bound (--chunk-cache)
//
// layer is the layer's manifest digest (sha256:<hex>), as `warren layer
// ls` shows it. A fetch is charged to the layer whose read caused it,
// even of a chunk other layers share, so the node's totals are the sums
// over layer (sum without (layer) (rate(...)), and sum by (le) for the
// histogram), with no second series to count twice. The cache itself is
// the node's: evictions, used and limit carry no layer. The layers are
// those on the node's lazy filesystem, at most lazy's bound of them (the
// most recently read): a layer's series ends when it leaves. A scrape
// that cannot read the stats (a layer server in another process, down)
// shows none of these series rather than failing the scrape.
type layerMetrics struct {
	stats func() (lazy.Stats, error)

	hits, misses, fetches, fetchErrors, fetched, written, prefetched, latency *prometheus.Desc
	evicted, used, limit                                                      *prometheus.Desc
}

var _ prometheus.Collector = (*layerMetrics)(nil)

func newLayerMetrics(stats func() (lazy.Stats, error)) *layerMetrics {
	perLayer := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"layer"}, nil)
	}
	node := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &layerMetrics{
		stats:       stats,
		hits:        perLayer("warren_layer_cache_hits_total", "Chunk reads of a lazily loaded layer served from the node's chunk cache."),
		misses:      perLayer("warren_layer_cache_misses_total", "Chunk reads of a lazily loaded layer that waited for a fetch."),
		fetches:     perLayer("warren_layer_fetches_total", "Chunks fetched from the blob store for reads of a layer."),
		fetchErrors: perLayer("warren_layer_fetch_errors_total", "Failed chunk fetch attempts (retried or not) for reads of a layer."),
		fetched:     perLayer("warren_layer_fetched_bytes_total", "Bytes fetched from the blob store for reads of a layer."),
		written:     perLayer("warren_layer_written_bytes_total", "Bytes of fetched chunks written to the node's disk for reads of a layer."),
		prefetched:  perLayer("warren_layer_prefetched_bytes_total", "Bytes fetched from the blob store ahead of reads by replaying a layer's prefetch trace."),
		latency:     perLayer("warren_layer_fetch_duration_seconds", "Time to fetch a chunk for reads of a layer, retries and backoff included."),
		evicted:     node("warren_layer_cache_evictions_total", "Chunks evicted from the node's chunk cache for room."),
		used:        node("warren_layer_cache_used_bytes", "Bytes the node's chunk cache holds."),
		limit:       node("warren_layer_cache_limit_bytes", "Bytes the node's chunk cache may hold."),
	}
}

func (m *layerMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.hits, m.misses, m.fetches, m.fetchErrors, m.fetched, m.written, m.prefetched, m.latency, m.evicted, m.used, m.limit} {
		ch <- d
	}
}

func (m *layerMetrics) Collect(ch chan<- prometheus.Metric) {
	st, err := m.stats()
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(m.evicted, prometheus.CounterValue, float64(st.Evicted))
	ch <- prometheus.MustNewConstMetric(m.used, prometheus.GaugeValue, float64(st.Used))
	ch <- prometheus.MustNewConstMetric(m.limit, prometheus.GaugeValue, float64(st.Limit))
	for _, l := range st.Layers {
		for _, c := range []struct {
			d *prometheus.Desc
			v int64
		}{{m.hits, l.Hits}, {m.misses, l.Misses}, {m.fetches, l.Fetches}, {m.fetchErrors, l.FetchErrors}, {m.fetched, l.Fetched}, {m.written, l.Written}, {m.prefetched, l.Prefetched}} {
			ch <- prometheus.MustNewConstMetric(c.d, prometheus.CounterValue, float64(c.v), l.Digest)
		}
		h := l.FetchLatency
		buckets := make(map[float64]uint64, len(h.Bounds))
		for i, b := range h.Bounds {
			buckets[b] = h.Counts[i]
		}
		ch <- prometheus.MustNewConstHistogram(m.latency, h.Count, h.Sum, buckets, l.Digest)
	}
}
