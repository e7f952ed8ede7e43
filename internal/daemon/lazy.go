package daemon

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/image"
)

// LayersConfig says how a node loads its sandboxes' layers.
type LayersConfig struct {
	// Lazy serves layers on demand (package lazy): a FUSE file per layer
	// under <node dir>/lazy/mnt, its chunks fetched on first read into a
	// cache under <node dir>/lazy/chunks, both served by a layer server
	// process of their own (`warren lazyd`, lazyd.go) that outlives the
	// agent. Off: each layer is downloaded whole before its first start
	// (eager).
	Lazy bool
	// CacheBytes bounds the chunk cache. Default 16 GiB.
	CacheBytes int64
	// TraceWindow is how long a layer's first reads are recorded into
	// its prefetch trace (default lazy.DefaultTraceWindow; negative:
	// none recorded). It applies to a layer server this agent starts.
	TraceWindow time.Duration
}

// DefaultChunkCache is LayersConfig.CacheBytes' default.
const DefaultChunkCache = 16 << 30

// setupLayers makes cache serve layers lazily if cfg says so: through the
// layer server in <nodeDir>/lazy, the one an earlier agent left serving
// or a new one, which it then watches and restarts if it dies
// (layerServer). It registers the lazy layers' metrics
// (layermetrics.go) with reg. blobs is the blob store's spec, as the
// agent opened it: the server opens it too, in its own process; store is
// the agent's, where it stores the prefetch traces the server records
// (traces.go), and record, if set, keeps them with their layers (else
// the node's status reports them). The result's Close stops watching,
// and stops the server unless sandboxes still read from it. An eager
// node gets a nil *layerServer (whose methods do nothing) and registers
// no metrics: it has no chunk cache to count.
func setupLayers(nodeDir, nodeID string, cache *image.Cache, blobs string, store blob.Store, record traceRecorder, cfg LayersConfig, reg prometheus.Registerer, log *slog.Logger) (*layerServer, error) {
	if !cfg.Lazy {
		return nil, nil
	}
	limit := cfg.CacheBytes
	if limit <= 0 {
		limit = DefaultChunkCache
	}
	// The server runs in / (it keeps no directory of ours busy): a
	// directory store's path must not depend on the agent's.
	if !strings.Contains(blobs, "://") {
		abs, err := filepath.Abs(blobs)
		if err != nil {
			return nil, err
		}
		blobs = abs
	}
	s, err := startLayerServer(layerServerConfig{
		Dir:         filepath.Join(nodeDir, "lazy"),
		Blobs:       blobs,
		CacheBytes:  limit,
		TraceWindow: cfg.TraceWindow,
		Cgroup:      "/warren/" + nodeID + "/lazyd",
		Log:         log,
	})
	if err != nil {
		return nil, fmt.Errorf("lazy layers (run without --lazy-layers where FUSE is missing): %w", err)
	}
	if err := reg.Register(newLayerMetrics(s.Stats)); err != nil {
		s.Close()
		return nil, fmt.Errorf("lazy layers: metrics: %w", err)
	}
	s.traces = &layerTraces{server: s, blobs: store, node: nodeID, record: record, log: log}
	go s.traces.run(s.stop)
	cache.SetLazy(s)
	log.Info("layers load on demand", "mount", s.mnt, "chunk_cache", limit, "layer_server", s.pid())
	return s, nil
}
