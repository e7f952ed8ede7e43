package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/lazy"
)

// Prefetch traces (package lazy, trace.go) are stored with the layers
// they are of: a node that loads layers lazily records the order of a
// layer's first reads, stores it as a blob and reports it; RecordTrace
// keeps the first one reported per layer under
// /layertraces/<manifest digest>, and the images that creates start from
// carry it (api.Image.PrefetchTraces) to the nodes, which replay it.
//
// The record is keyed by the manifest digest, not the layer's ref: a
// layer published twice under two names is one layer, read the same
// way. GC keeps the trace blob of every layer it keeps, and deletes the
// records of layers it does not (their blob goes with them), so that a
// layer published again later gets a fresh trace.
const tracesPrefix = "/layertraces/"

// traceRecordVersion versions trace records.
const traceRecordVersion = 1

// traceRecord is a layer's prefetch trace as stored.
type traceRecord struct {
	V         int       `json:"v"`
	Layer     string    `json:"layer"` // manifest digest
	Trace     string    `json:"trace"` // blob digest
	Node      string    `json:"node,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

func traceKey(layer string) string { return tracesPrefix + layer }

// RecordTrace keeps trace, the digest of a prefetch trace blob that node
// recorded, as the trace of the layer whose manifest has digest layer,
// unless the layer has one already (the first wins; a record whose blob
// is gone is replaced), and says whether it did. The blob must be in the blob store and be a trace of that layer,
// whose manifest must be there too: ErrInvalid if not (a node's report
// is not trusted), ErrNotFound for a missing blob. It reads both blobs.
func (r *Registry) RecordTrace(ctx context.Context, layer, trace, node string) (bool, error) {
	if _, err := blob.ParseDigest(layer); err != nil {
		return false, err
	}
	if _, err := blob.ParseDigest(trace); err != nil {
		return false, err
	}
	var version int64 // of a record to replace: 0, none
	if kv, err := r.st.Get(ctx, traceKey(layer)); err == nil {
		// Kept, unless its blob is gone (GC raced the record): the
		// layer would never get another.
		rec, err := decodeTrace(kv.Value)
		if err != nil {
			return false, nil
		}
		if _, err := r.bs.Stat(ctx, rec.Trace); !errors.Is(err, errdefs.ErrNotFound) {
			return false, nil
		}
		version = kv.Version
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return false, err
	}
	t, err := readTrace(ctx, r.bs, trace)
	if err != nil {
		return false, err
	}
	m, err := ReadManifest(ctx, r.bs, layer)
	if err != nil {
		return false, fmt.Errorf("trace %s: layer %s: %w", trace, layer, err)
	}
	if err := m.lazyLayer(layer, "").CheckTrace(t); err != nil {
		return false, fmt.Errorf("trace %s: %w", trace, err)
	}
	val, err := json.Marshal(traceRecord{V: traceRecordVersion, Layer: layer, Trace: trace, Node: node, CreatedAt: time.Now().UTC()})
	if err != nil {
		return false, err
	}
	err = r.st.CompareAndPut(ctx, traceKey(layer), val, version)
	if errors.Is(err, errdefs.ErrConflict) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("record trace of layer %s: %w", layer, err)
	}
	r.log.Info("layer prefetch trace recorded", "layer", layer, "trace", trace, "node", node, "pieces", len(t.Pieces))
	return true, nil
}

// readTrace reads and checks a trace blob.
func readTrace(ctx context.Context, bs blob.Store, digest string) (lazy.Trace, error) {
	rc, err := bs.Open(ctx, digest)
	if err != nil {
		return lazy.Trace{}, fmt.Errorf("trace %s: %w", digest, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, lazy.MaxTraceBytes+1))
	if err != nil {
		return lazy.Trace{}, fmt.Errorf("trace %s: %w", digest, err)
	}
	if got := blob.FromBytes(b); got != digest {
		return lazy.Trace{}, errdefs.Invalid("trace %s: the blob's digest is %s (or it is over %d bytes)", digest, got, lazy.MaxTraceBytes)
	}
	return lazy.DecodeTrace(b)
}

// Trace returns the blob digest of the prefetch trace recorded for the
// layer whose manifest has digest layer, or "" if none is.
func (r *Registry) Trace(ctx context.Context, layer string) (string, error) {
	kv, err := r.st.Get(ctx, traceKey(layer))
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	rec, err := decodeTrace(kv.Value)
	if err != nil {
		return "", fmt.Errorf("trace record %s: %w", kv.Key, err)
	}
	return rec.Trace, nil
}

func decodeTrace(b []byte) (traceRecord, error) {
	var rec traceRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, err
	}
	if rec.V != traceRecordVersion {
		return rec, fmt.Errorf("unknown format version %d", rec.V)
	}
	return rec, nil
}

// traces maps layer digests to their trace blobs' digests, for every
// layer that has a trace.
func (r *Registry) traces(ctx context.Context) (map[string]string, error) {
	kvs, err := r.st.List(ctx, tracesPrefix)
	if err != nil {
		return nil, fmt.Errorf("list prefetch traces: %w", err)
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		if rec, err := decodeTrace(kv.Value); err == nil {
			out[rec.Layer] = rec.Trace
		}
	}
	return out, nil
}

// withTraces sets img's PrefetchTraces from the records of its layers'
// traces. A trace is a hint: one that cannot be read is left out, with
// a log line, never failing the create img is for.
func (r *Registry) withTraces(ctx context.Context, img *api.Image) {
	for _, d := range img.Layers {
		t, err := r.Trace(ctx, d)
		if err != nil {
			r.log.Warn("prefetch trace of a layer not read; starting without it", "layer", d, "err", err)
			continue
		}
		if t == "" {
			continue
		}
		if img.PrefetchTraces == nil {
			img.PrefetchTraces = map[string]string{}
		}
		img.PrefetchTraces[d] = t
	}
}

// markTraces marks the trace blobs of the layers marked keeps, and
// returns the keys of the records of the others: their layers are gone.
func (r *Registry) markTraces(ctx context.Context, marked map[string]bool) (stale []string, err error) {
	kvs, err := r.st.List(ctx, tracesPrefix)
	if err != nil {
		return nil, err
	}
	for _, kv := range kvs {
		rec, err := decodeTrace(kv.Value)
		if err != nil {
			continue // not ours to judge: kept, and so is nothing it names
		}
		if marked[rec.Layer] {
			marked[rec.Trace] = true
		} else {
			stale = append(stale, kv.Key)
		}
	}
	return stale, nil
}
