package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
)

// Prefetch traces, the agent's part (package lazy records and replays
// them, package image keeps them with their layers): every
// traceCollectEvery the agent asks its layer server for the traces it
// recorded, stores each as a blob, acknowledges it, and lists it in the
// node's status for traceShown (api.Node.PrefetchTraces), where the
// apiservers' fleet watchers see it (apiserver.RecordTraces). `warren
// up`, whose apiserver polls no node, records them in the registry
// itself. A trace that cannot be stored stays with the layer server
// until the next round.

// Trace collection (variables: tests shorten them).
var (
	traceCollectEvery = 3 * time.Second
	traceShown        = 10 * time.Minute
)

// maxRecentTraces bounds the traces a node's status lists.
const maxRecentTraces = 256

// traceRecorder keeps a trace as its layer's (image.Registry.RecordTrace).
type traceRecorder func(ctx context.Context, layer, trace, node string) (bool, error)

// layerTraces collects the traces of a layer server.
type layerTraces struct {
	server *layerServer
	blobs  blob.Store
	node   string
	record traceRecorder // nil: the node's status reports them
	log    *slog.Logger

	mu     sync.Mutex
	recent []nodeTrace
}

type nodeTrace struct {
	api.LayerTrace
	recorded bool // by record
}

// run collects every traceCollectEvery until stop is closed.
func (t *layerTraces) run(stop <-chan struct{}) {
	tick := time.NewTicker(traceCollectEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.collect(ctx)
		cancel()
	}
}

// collect stores the traces the server has ready and, with a recorder,
// records those not recorded yet.
func (t *layerTraces) collect(ctx context.Context) {
	c, err := t.server.client()
	if err != nil {
		return // the supervisor says why
	}
	traces, err := c.Traces(ctx)
	if err != nil {
		t.log.Debug("lazy layers: prefetch traces not collected", "err", err)
	}
	for _, tr := range traces {
		b, err := tr.Encode()
		if err != nil {
			continue
		}
		d, _, err := t.blobs.Put(ctx, bytes.NewReader(b))
		if err != nil {
			t.log.Warn("lazy layers: prefetch trace not stored; trying again later", "layer", tr.Layer, "err", err)
			continue
		}
		if err := c.AckTrace(ctx, tr.Layer); err != nil {
			t.log.Warn("lazy layers: prefetch trace stored but not acknowledged", "layer", tr.Layer, "err", err)
		}
		t.log.Info("lazy layers: prefetch trace stored", "layer", tr.Layer, "trace", d, "pieces", len(tr.Pieces))
		t.mu.Lock()
		if !slices.ContainsFunc(t.recent, func(n nodeTrace) bool { return n.Layer == tr.Layer && n.Trace == d }) {
			if len(t.recent) >= maxRecentTraces {
				t.recent = t.recent[1:]
			}
			t.recent = append(t.recent, nodeTrace{LayerTrace: api.LayerTrace{Layer: tr.Layer, Trace: d, At: time.Now().UTC()}})
		}
		t.mu.Unlock()
	}
	if t.record == nil {
		return
	}
	t.mu.Lock()
	todo := slices.Clone(t.recent)
	t.mu.Unlock()
	for _, tr := range todo {
		if tr.recorded {
			continue
		}
		if _, err := t.record(ctx, tr.Layer, tr.Trace, t.node); err != nil {
			t.log.Warn("lazy layers: prefetch trace not recorded", "layer", tr.Layer, "trace", tr.Trace, "err", err)
			continue
		}
		t.mu.Lock()
		for i := range t.recent {
			if t.recent[i].LayerTrace == tr.LayerTrace {
				t.recent[i].recorded = true
			}
		}
		t.mu.Unlock()
	}
}

// Recent are the traces stored within traceShown, oldest first.
func (t *layerTraces) Recent() []api.LayerTrace {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.recent = slices.DeleteFunc(t.recent, func(tr nodeTrace) bool { return time.Since(tr.At) > traceShown })
	var out []api.LayerTrace
	for _, tr := range t.recent {
		out = append(out, tr.LayerTrace)
	}
	return out
}
