package lazy

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Cache is the node's chunk cache: one file per piece (a block of a
// chunk, or a whole chunk of a layer whose manifest lists no blocks),
// named by its digest, shared by every layer and sandbox on the node,
// within a size limit (least recently used pieces go first). A piece is
// fetched from the blob store once however many readers miss it at once
// (adjacent blocks missed together by one ranged read), verified against
// its digest before anyone reads it, and written whole (renamed into
// place), so a piece file is always complete and correct.
type Cache struct {
	dir   string
	store blob.Store
	limit int64

	mu      sync.Mutex
	entries map[string]*list.Element // digest -> *entry, in lru
	lru     *list.List               // front: most recently used
	used    int64
	flights map[string]*flight

	stats   counters
	evicted atomic.Int64
}

type entry struct {
	digest string
	size   int64
}

// flight is one fetch of a chunk, which every reader missing it waits for.
type flight struct {
	done chan struct{}
	err  error
}

// counter names one running total of counters.
type counter int

const (
	hits counter = iota
	misses
	fetches
	fetchErrors
	fetchedBytes
	writtenBytes
	prefetchedBytes // fetched by a trace's replay (also in fetchedBytes)
	nCounters
)

// counters are running totals: a cache's, or one layer's share (Meter).
type counters struct {
	n         [nCounters]atomic.Int64
	fetchTime histogram
}

func (c *counters) snapshot() Counts {
	return Counts{
		Hits: c.n[hits].Load(), Misses: c.n[misses].Load(), Fetches: c.n[fetches].Load(), FetchErrors: c.n[fetchErrors].Load(),
		Fetched: c.n[fetchedBytes].Load(), Written: c.n[writtenBytes].Load(), Prefetched: c.n[prefetchedBytes].Load(),
		FetchLatency: c.fetchTime.snapshot(),
	}
}

// Meter is what a read is counted against besides the cache's totals:
// the reading layer's counters (FS keeps one per layer). A chunk can
// belong to several layers (chunks are content-addressed): its fetch is
// charged to the layer whose read caused it, and a later read of it from
// another layer is that layer's hit. A nil Meter counts in the totals
// only.
type Meter struct{ counters }

// Counts returns the meter's totals.
func (m *Meter) Counts() Counts { return m.snapshot() }

// Counts are running totals of chunk reads and fetches.
type Counts struct {
	Hits        int64 `json:"hits"`         // chunk reads served from the cache
	Misses      int64 `json:"misses"`       // chunk reads that waited for a fetch
	Fetches     int64 `json:"fetches"`      // chunks fetched from the blob store
	FetchErrors int64 `json:"fetch_errors"` // failed fetch attempts (retried or not)
	Fetched     int64 `json:"fetched_bytes"`
	Written     int64 `json:"written_bytes"` // to the local disk
	// Prefetched are the bytes of Fetched that the replay of a prefetch
	// trace fetched (trace.go), ahead of any read.
	Prefetched int64 `json:"prefetched_bytes"`
	// FetchLatency is how long fetches took, each from its first attempt
	// to its readers' answer (retries and their backoff included; failed
	// fetches too).
	FetchLatency Histogram `json:"fetch_latency"`
}

// Stats are a cache's totals since it was opened, and (FS.Stats) its
// layers' shares of them.
type Stats struct {
	Counts
	Evicted int64 `json:"evicted"`    // chunks removed for room
	Used    int64 `json:"used_bytes"` // held now
	Limit   int64 `json:"limit_bytes"`
	// FetchTime is the time spent fetching (all fetches, summed: the
	// latency histogram's Sum).
	FetchTime time.Duration `json:"fetch_time_ns"`
	// Layers are the layers' shares, most recently read first; Cache.Stats
	// leaves them out.
	Layers []LayerStats `json:"layers,omitempty"`
}

// LayerStats are one layer's share of a cache's totals: the reads of its
// file and the fetches they caused.
type LayerStats struct {
	Digest string `json:"digest"` // the layer's manifest digest
	Counts
}

// FetchBuckets are the upper bounds, in seconds, of the fetch latency
// histograms' buckets: from a chunk off a local disk (about 1 ms) to one
// retried against a store that is down (seconds).
var FetchBuckets = [...]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Histogram is a distribution of durations, as Prometheus has one:
// Counts[i] of the Count observations took at most Bounds[i] seconds
// (cumulative: the last bucket, +Inf, is Count); Sum is their total.
type Histogram struct {
	Bounds []float64 `json:"bounds"` // seconds, ascending
	Counts []uint64  `json:"counts"`
	Count  uint64    `json:"count"`
	Sum    float64   `json:"sum"` // seconds
}

// histogram counts observations into FetchBuckets, without a lock.
type histogram struct {
	buckets  [len(FetchBuckets) + 1]atomic.Uint64 // not cumulative; the last is +Inf
	sumNanos atomic.Int64
}

func (h *histogram) observe(d time.Duration) {
	h.buckets[sort.SearchFloat64s(FetchBuckets[:], d.Seconds())].Add(1)
	h.sumNanos.Add(int64(d))
}

func (h *histogram) snapshot() Histogram {
	out := Histogram{Bounds: append([]float64(nil), FetchBuckets[:]...), Counts: make([]uint64, len(FetchBuckets))}
	for i := range h.buckets {
		out.Count += h.buckets[i].Load()
		if i < len(out.Counts) {
			out.Counts[i] = out.Count
		}
	}
	out.Sum = time.Duration(h.sumNanos.Load()).Seconds()
	return out
}

// fetchAttempts and fetchBackoff: how often a chunk is asked for before a
// read fails, and the wait before the second attempt (doubling).
const (
	fetchAttempts = 4
	fetchBackoff  = 100 * time.Millisecond
)

// maxChunk bounds a chunk (layers are cut into 1 MiB chunks; the manifest
// format allows up to 64 MiB).
const maxChunk = 64 << 20

// OpenCache opens the chunk cache in dir (made if missing), holding at
// most limit bytes, fetching from store. Chunks already in dir are kept
// (a restart loses nothing); stray temporary files are removed.
func OpenCache(dir string, store blob.Store, limit int64) (*Cache, error) {
	if limit <= 0 {
		return nil, errdefs.Invalid("chunk cache: limit %d", limit)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	c := &Cache{dir: dir, store: store, limit: limit, entries: map[string]*list.Element{}, lru: list.New(), flights: map[string]*flight{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type found struct {
		entry
		at time.Time
	}
	var have []found
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), ".") {
			os.Remove(p)
			continue
		}
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		have = append(have, found{entry{digest: "sha256:" + e.Name(), size: fi.Size()}, fi.ModTime()})
	}
	// Oldest first, so that the newest end up at the front.
	sort.Slice(have, func(i, j int) bool { return have[i].at.Before(have[j].at) })
	for _, f := range have {
		e := f.entry
		c.entries[e.digest] = c.lru.PushFront(&e)
		c.used += e.size
	}
	c.mu.Lock()
	c.evict()
	c.mu.Unlock()
	return c, nil
}

// path is the file of chunk digest.
func (c *Cache) path(digest string) (string, error) {
	h, err := blob.ParseDigest(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(c.dir, h), nil
}

// Piece is what the cache holds as one file: a whole chunk (a blob of
// its own), or a block of one (a range of the chunk's blob, with a digest
// of its own from the layer's manifest), fetched by a ranged read.
type Piece struct {
	Digest string // of the piece's bytes
	Size   int64
	Chunk  string // a block: the chunk it is a range of ("" for a chunk)
	Off    int64  // a block: where in the chunk
}

// follows says whether p comes right after q in the same chunk, so that
// one ranged read fetches both.
func (p Piece) follows(q Piece) bool {
	return p.Chunk != "" && p.Chunk == q.Chunk && p.Off == q.Off+q.Size
}

// maxRun bounds the bytes of one ranged fetch of adjacent blocks.
const maxRun = 4 << 20

// ReadAt reads len(p) bytes of piece at off, fetching it first if the
// cache lacks it; the read is counted against m too.
func (c *Cache) ReadAt(ctx context.Context, m *Meter, piece Piece, p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) > piece.Size {
		return fmt.Errorf("read of %d bytes at %d past piece %s of %d bytes", len(p), off, piece.Digest, piece.Size)
	}
	if err := c.Ensure(ctx, m, piece); err != nil {
		return err
	}
	return c.read(ctx, m, piece, p, off)
}

// read reads from a piece Ensure made present, fetching it again if it
// was evicted since.
func (c *Cache) read(ctx context.Context, m *Meter, piece Piece, p []byte, off int64) error {
	path, err := c.path(piece.Digest)
	if err != nil {
		return err
	}
	for try := 0; ; try++ {
		f, err := os.Open(path)
		if errors.Is(err, os.ErrNotExist) && try < 3 {
			if err := c.Ensure(ctx, m, piece); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		_, err = f.ReadAt(p, off)
		f.Close()
		return err
	}
}

// Has says whether the piece with digest is in the cache.
func (c *Cache) Has(digest string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[digest] != nil
}

// Ensure makes pieces present in the cache (a recent use), waiting for
// their fetches; adjacent blocks missing together are fetched by one
// ranged read. Each piece is counted against m too (a hit or a miss, and
// the fetch if this read starts it).
func (c *Cache) Ensure(ctx context.Context, m *Meter, pieces ...Piece) error {
	c.mu.Lock()
	wait := c.claim(context.WithoutCancel(ctx), m, pieces, true, false)
	c.mu.Unlock()
	// The fetches are the pieces', not this reader's: a reader that gives
	// up does not fail the others.
	for _, fl := range wait {
		select {
		case <-fl.done:
			if fl.err != nil {
				return fl.err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Prefetch fetches pieces the cache lacks in the background (adjacent
// blocks by one ranged read), charging the fetches to m too.
func (c *Cache) Prefetch(m *Meter, pieces ...Piece) {
	c.prefetch(m, false, pieces)
}

// prefetch starts the fetches of the pieces the cache lacks that no one
// fetches yet (adjacent blocks by one ranged read) and returns their
// flights; replay counts their bytes as prefetched too.
func (c *Cache) prefetch(m *Meter, replay bool, pieces []Piece) []*flight {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.claim(context.Background(), m, pieces, false, replay)
}

// claim starts the fetches of the pieces the cache lacks that no one
// fetches yet, adjacent blocks by one ranged read, and returns the
// flights to wait for: those it started and, for a read, those already
// under way too (a read also counts each piece as a hit, moving it to the
// front, or a miss). c.mu held.
func (c *Cache) claim(ctx context.Context, m *Meter, pieces []Piece, read, replay bool) []*flight {
	var wait []*flight
	var run []Piece
	start := func() {
		if len(run) > 0 {
			c.startFetch(ctx, m, run, replay)
			run = nil
		}
	}
	for _, p := range pieces {
		if el := c.entries[p.Digest]; el != nil {
			if read {
				c.lru.MoveToFront(el)
				c.count(m, hits, 1)
			}
			start()
			continue
		}
		if read {
			c.count(m, misses, 1)
		}
		if fl := c.flights[p.Digest]; fl != nil {
			if read {
				wait = append(wait, fl)
			}
			start()
			continue
		}
		if len(run) > 0 && (!p.follows(run[len(run)-1]) || (p.Off+p.Size)-run[0].Off > maxRun) {
			start()
		}
		run = append(run, p)
		fl := &flight{done: make(chan struct{})}
		c.flights[p.Digest] = fl
		wait = append(wait, fl)
	}
	start()
	return wait
}

// startFetch fetches run (one piece, or adjacent blocks of one chunk)
// whose flights are registered; replay counts its bytes as prefetched
// too. c.mu held.
func (c *Cache) startFetch(ctx context.Context, m *Meter, run []Piece, replay bool) {
	fls := make([]*flight, len(run))
	for i, p := range run {
		fls[i] = c.flights[p.Digest]
	}
	go c.fetch(ctx, m, run, fls, replay)
}

// count adds n to counter k of the cache's totals and of m's.
func (c *Cache) count(m *Meter, k counter, n int64) {
	c.stats.n[k].Add(n)
	if m != nil {
		m.n[k].Add(n)
	}
}

// fetch gets a run of pieces from the store into the cache, with
// retries, counts it against m too, and ends the pieces' flights.
func (c *Cache) fetch(ctx context.Context, m *Meter, run []Piece, fls []*flight, replay bool) {
	start := time.Now()
	var err error
	wait := fetchBackoff
	for attempt := 1; ; attempt++ {
		if err = c.fetchOnce(ctx, m, run, replay); err == nil {
			break
		}
		c.count(m, fetchErrors, 1)
		if attempt == fetchAttempts || errors.Is(err, errCorrupt) {
			break
		}
		time.Sleep(wait)
		wait *= 2
	}
	took := time.Since(start)
	c.stats.fetchTime.observe(took)
	if m != nil {
		m.fetchTime.observe(took)
	}
	c.mu.Lock()
	for i, p := range run {
		delete(c.flights, p.Digest)
		fls[i].err = err
		if err == nil && c.entries[p.Digest] == nil {
			c.entries[p.Digest] = c.lru.PushFront(&entry{digest: p.Digest, size: p.Size})
			c.used += p.Size
		}
	}
	if err == nil {
		c.evict(run...)
	}
	c.mu.Unlock()
	for _, fl := range fls {
		close(fl.done)
	}
}

// errCorrupt is a chunk whose bytes do not match its digest or size: not
// retried (the store holds the wrong bytes).
var errCorrupt = errors.New("chunk does not match its digest")

// fetchOnce reads run from the store (a whole chunk, or one ranged read
// of adjacent blocks), verifies each piece and writes it into the cache.
func (c *Cache) fetchOnce(ctx context.Context, m *Meter, run []Piece, replay bool) error {
	var total int64
	for _, p := range run {
		if p.Size <= 0 || p.Size > maxChunk {
			return fmt.Errorf("piece %s: size %d", p.Digest, p.Size)
		}
		total += p.Size
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	first := run[0]
	var r io.ReadCloser
	var err error
	if first.Chunk == "" {
		r, err = c.store.Open(ctx, first.Digest)
	} else {
		r, err = blob.OpenRange(ctx, c.store, first.Chunk, first.Off, total)
	}
	if err != nil {
		return fmt.Errorf("fetch chunk %s: %w", cmp.Or(first.Chunk, first.Digest), err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, total+1))
	if err != nil {
		return fmt.Errorf("fetch chunk %s: %w", cmp.Or(first.Chunk, first.Digest), err)
	}
	c.count(m, fetches, 1)
	c.count(m, fetchedBytes, int64(len(b)))
	if replay {
		c.count(m, prefetchedBytes, int64(len(b)))
	}
	if int64(len(b)) != total {
		return fmt.Errorf("chunk %s: %d bytes, want %d: %w", cmp.Or(first.Chunk, first.Digest), len(b), total, errCorrupt)
	}
	for _, p := range run {
		piece := b[:p.Size]
		b = b[p.Size:]
		if blob.FromBytes(piece) != p.Digest {
			return fmt.Errorf("%s of %d bytes: %w", p.Digest, p.Size, errCorrupt)
		}
		if err := c.put(p.Digest, piece); err != nil {
			return err
		}
		c.count(m, writtenBytes, p.Size)
	}
	return nil
}

// put writes a verified piece into the cache, whole or not at all.
func (c *Cache) put(digest string, b []byte) error {
	path, err := c.path(digest)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.dir, ".fetch-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("cache %s: %w", digest, err)
	}
	return nil
}

// evict removes least recently used pieces until the cache is within its
// limit, never those in keep (just fetched). c.mu held.
func (c *Cache) evict(keep ...Piece) {
	kept := 0
	for c.used > c.limit {
		el := c.lru.Back()
		if el == nil {
			return
		}
		e := el.Value.(*entry)
		if slices.ContainsFunc(keep, func(p Piece) bool { return p.Digest == e.digest }) {
			if kept++; kept > len(keep) {
				return // nothing but keep left
			}
			c.lru.MoveToFront(el)
			continue
		}
		c.lru.Remove(el)
		delete(c.entries, e.digest)
		c.used -= e.size
		c.evicted.Add(1)
		if p, err := c.path(e.digest); err == nil {
			os.Remove(p) // readers with it open read on
		}
	}
}

// Stats returns the cache's totals (no Layers: FS.Stats adds them).
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	used := c.used
	c.mu.Unlock()
	return Stats{
		Counts: c.stats.snapshot(), Evicted: c.evicted.Load(), Used: used, Limit: c.limit,
		FetchTime: time.Duration(c.stats.fetchTime.sumNanos.Load()),
	}
}
