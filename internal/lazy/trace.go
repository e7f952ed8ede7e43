package lazy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Prefetch traces. A layer's first starts read the same pieces in much
// the same order (the loader, the interpreter, its libraries): a node
// that adds a layer with no trace to replay records the order in which
// its file's pieces are first read, from the first read for a window
// (WithTraceWindow) or until maxTracePieces; the trace is then ready
// (FS.Traces) for the node agent to store as a blob and report, and the
// control plane keeps the first one per layer. A later
// Add of the layer, on any node, names that blob (Layer.Trace): the
// filesystem fetches it and prefetches the pieces it lists in its
// order, in the background, a few runs of adjacent blocks at a time, so
// that the start's reads find them in the cache.
//
// A trace is written by a node from reads its sandboxes made, so it is
// checked before use like anything a stranger sends: its blob against
// its digest, its size, schema and layer, each index against the
// layer's pieces. A trace that fails is ignored with a log line; it
// never fails an Add. At worst a trace prefetches the whole layer
// (bounded by replayBudget), never anything else.

// TraceSchema names the format of a trace blob.
const TraceSchema = "warren.trace.v1"

// DefaultTraceWindow is how long a layer's reads are recorded, from the
// first: a start and its first commands.
const DefaultTraceWindow = 30 * time.Second

const (
	// maxTracePieces bounds a trace: 512 MiB of 32 KiB blocks.
	maxTracePieces = 16384
	// MaxTraceBytes bounds a trace blob (16384 indices take under 128 KiB).
	MaxTraceBytes = 1 << 20
	// maxReadyTraces bounds the traces kept for the agent to collect;
	// the oldest go first.
	maxReadyTraces = 256
	// replayRuns is how many runs of a replay are fetched at once: few,
	// so that the start's own reads keep most of the store's bandwidth.
	replayRuns = 2
	// maxReplayBytes bounds what one replay prefetches (also at most a
	// quarter of the cache: replayBudget).
	maxReplayBytes = 1 << 30
)

// Trace is the order in which a layer's pieces (its blocks, or whole
// chunks: see Chunk) were first read on a node. Encoded, it is a blob of
// its own.
type Trace struct {
	Schema    string `json:"schema"`     // TraceSchema
	Layer     string `json:"layer"`      // the layer's manifest digest
	BlockSize int64  `json:"block_size"` // the layer's (Layer.BlockSize)
	Pieces    []int  `json:"pieces"`     // indices into the layer's pieces, first read first
}

// Encode returns the trace's blob.
func (t Trace) Encode() ([]byte, error) {
	t.Schema = TraceSchema
	return json.Marshal(t)
}

// DecodeTrace reads a trace blob. ErrInvalid for anything but a trace of
// TraceSchema for a layer digest, with 1 to maxTracePieces distinct,
// non-negative piece indices, in at most MaxTraceBytes.
func DecodeTrace(b []byte) (Trace, error) {
	var t Trace
	if len(b) > MaxTraceBytes {
		return t, errdefs.Invalid("trace: %d bytes, more than %d", len(b), MaxTraceBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return Trace{}, errdefs.Invalid("trace: %v", err)
	}
	if t.Schema != TraceSchema {
		return Trace{}, errdefs.Invalid("trace: schema %q, want %q", t.Schema, TraceSchema)
	}
	if _, err := blob.ParseDigest(t.Layer); err != nil {
		return Trace{}, errdefs.Invalid("trace: layer: %v", err)
	}
	if t.BlockSize < 0 || t.BlockSize > maxChunk {
		return Trace{}, errdefs.Invalid("trace: block size %d", t.BlockSize)
	}
	if len(t.Pieces) == 0 || len(t.Pieces) > maxTracePieces {
		return Trace{}, errdefs.Invalid("trace: %d pieces, want 1 to %d", len(t.Pieces), maxTracePieces)
	}
	seen := make(map[int]bool, len(t.Pieces))
	for _, i := range t.Pieces {
		if i < 0 || seen[i] {
			return Trace{}, errdefs.Invalid("trace: piece %d negative or given twice", i)
		}
		seen[i] = true
	}
	return t, nil
}

// CheckTrace says whether t is a trace of l: the same layer and block
// size, and every index one of l's pieces. ErrInvalid if not.
func (l Layer) CheckTrace(t Trace) error {
	pieces, _, err := cut(l)
	if err != nil {
		return err
	}
	return checkTrace(t, l.Digest, l.BlockSize, len(pieces))
}

func checkTrace(t Trace, digest string, blockSize int64, pieces int) error {
	if t.Layer != digest {
		return errdefs.Invalid("trace of layer %s, not %s", t.Layer, digest)
	}
	if t.BlockSize != blockSize {
		return errdefs.Invalid("trace of layer %s: block size %d, the layer's is %d", digest, t.BlockSize, blockSize)
	}
	for _, i := range t.Pieces {
		if i >= pieces {
			return errdefs.Invalid("trace of layer %s: piece %d of %d", digest, i, pieces)
		}
	}
	return nil
}

// recording is a trace being recorded: the distinct pieces of a layer's
// file in the order first read.
type recording struct {
	mu    sync.Mutex
	seen  []uint64 // bit per piece
	order []int
	timer *time.Timer // closes the window; nil before the first read
	over  bool
}

// record adds the pieces [first, end) a read of l asks for, and says
// whether the trace is full. The first read opens the window.
func (r *recording) record(l *layerFile, first, end int) (full bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over {
		return false
	}
	if r.timer == nil {
		r.seen = make([]uint64, (len(l.pieces)+63)/64)
		r.timer = time.AfterFunc(l.fs.window, func() { l.fs.endTrace(l, r) })
	}
	for i := first; i < end && len(r.order) < maxTracePieces; i++ {
		if r.seen[i/64]&(1<<(i%64)) == 0 {
			r.seen[i/64] |= 1 << (i % 64)
			r.order = append(r.order, i)
		}
	}
	return len(r.order) >= maxTracePieces
}

// started says whether the file has been read since recording began.
func (r *recording) started() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.timer != nil
}

// endTrace closes r's window: its trace becomes ready (Traces), the
// oldest ready one dropped if there are maxReadyTraces.
func (f *FS) endTrace(l *layerFile, r *recording) {
	if !l.rec.CompareAndSwap(r, nil) {
		return // ended already
	}
	r.mu.Lock()
	r.over = true
	if r.timer != nil {
		r.timer.Stop()
	}
	t := Trace{Schema: TraceSchema, Layer: l.digest, BlockSize: l.blockSize, Pieces: r.order}
	r.mu.Unlock()
	if len(t.Pieces) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, old := range f.ready {
		if old.Layer == t.Layer { // a layer removed and added again
			f.ready = append(f.ready[:i], f.ready[i+1:]...)
			break
		}
	}
	if len(f.ready) >= maxReadyTraces {
		f.log.Warn("lazy layers: too many prefetch traces not collected; dropping the oldest", "layer", f.ready[0].Layer)
		f.ready = f.ready[1:]
	}
	f.ready = append(f.ready, t)
}

// Traces returns the traces recorded and not yet acknowledged
// (AckTrace), oldest first.
func (f *FS) Traces() []Trace {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Trace(nil), f.ready...)
}

// AckTrace forgets the ready trace of layer digest: the agent stored it.
func (f *FS) AckTrace(digest string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, t := range f.ready {
		if t.Layer == digest {
			f.ready = append(f.ready[:i], f.ready[i+1:]...)
			return
		}
	}
}

// replay prefetches what the trace blob digest lists for l, in its
// order, in the background of l's reads; a trace that cannot be read or
// does not fit l is ignored, with a log line.
func (f *FS) replay(l *layerFile, digest string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	go func() {
		select {
		case <-f.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	start := time.Now()
	t, err := f.cache.readTrace(ctx, digest)
	if err == nil {
		err = checkTrace(t, l.digest, l.blockSize, len(l.pieces))
	}
	if err != nil {
		f.log.Warn("lazy layers: prefetch trace ignored", "layer", l.digest, "trace", digest, "err", err)
		return
	}
	runs := l.runs(t.Pieces, f.cache.replayBudget())
	before := l.meter.n[prefetchedBytes].Load()
	f.cache.replay(ctx, &l.meter, runs, replayRuns)
	f.log.Info("lazy layers: prefetch trace replayed", "layer", l.digest, "trace", digest, "pieces", len(t.Pieces), "runs", len(runs),
		"prefetched_bytes", l.meter.n[prefetchedBytes].Load()-before, "took", time.Since(start).Round(time.Millisecond))
}

// runs cuts the pieces at indices into runs, in their order, of pieces
// one ranged read fetches together (adjacent blocks of a chunk, up to
// maxRun bytes), stopping at budget bytes.
func (l *layerFile) runs(indices []int, budget int64) [][]Piece {
	var runs [][]Piece
	var total int64
	prev := -2
	for _, i := range indices {
		p := l.pieces[i]
		if total += p.Size; total > budget {
			break
		}
		if n := len(runs); n > 0 && i == prev+1 && p.follows(l.pieces[prev]) && (p.Off+p.Size)-runs[n-1][0].Off <= maxRun {
			runs[n-1] = append(runs[n-1], p)
		} else {
			runs = append(runs, []Piece{p})
		}
		prev = i
	}
	return runs
}

// readTrace reads and decodes the trace blob digest, verified against
// its digest.
func (c *Cache) readTrace(ctx context.Context, digest string) (Trace, error) {
	if _, err := blob.ParseDigest(digest); err != nil {
		return Trace{}, err
	}
	r, err := c.store.Open(ctx, digest)
	if err != nil {
		return Trace{}, fmt.Errorf("trace %s: %w", digest, err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, MaxTraceBytes+1))
	if err != nil {
		return Trace{}, fmt.Errorf("trace %s: %w", digest, err)
	}
	if got := blob.FromBytes(b); got != digest {
		return Trace{}, errdefs.Invalid("trace %s: the blob's digest is %s (or it is over %d bytes)", digest, got, MaxTraceBytes)
	}
	return DecodeTrace(b)
}

// replayBudget is what one replay may prefetch: a quarter of the cache,
// at most maxReplayBytes.
func (c *Cache) replayBudget() int64 { return min(c.limit/4, maxReplayBytes) }

// replay fetches runs in their order, parallel runs at a time, each
// waited for before the next starts: pieces present or being fetched
// already are skipped. Fetches are charged to m, their bytes counted as
// prefetched. It returns when all are done or ctx ends.
func (c *Cache) replay(ctx context.Context, m *Meter, runs [][]Piece, parallel int) {
	next := make(chan []Piece)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for run := range next {
				for _, fl := range c.prefetch(m, true, run) {
					select {
					case <-fl.done:
					case <-ctx.Done():
						return
					}
				}
			}
		})
	}
feed:
	for _, run := range runs {
		select {
		case next <- run:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
}

// traceState is what a layer file does about traces.
type traceState struct {
	rec      atomic.Pointer[recording] // recording its reads; nil: not (or no more)
	replayed atomic.Bool               // a trace was given to replay
}
