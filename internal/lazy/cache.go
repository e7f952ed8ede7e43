package lazy

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Cache is the node's chunk cache: one file per chunk, named by its
// digest, shared by every layer and sandbox on the node, within a size
// limit (least recently used chunks go first). A chunk is fetched from
// the blob store once however many readers miss it at once, verified
// against its digest before anyone reads it, and written whole (renamed
// into place), so a chunk file is always complete and correct.
type Cache struct {
	dir   string
	store blob.Store
	limit int64

	mu      sync.Mutex
	entries map[string]*list.Element // digest -> *entry, in lru
	lru     *list.List               // front: most recently used
	used    int64
	flights map[string]*flight

	stats counters
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

// counters are the cache's running totals (Stats).
type counters struct {
	hits, misses, fetches, fetchErrors, fetched, written, evicted atomic.Int64
	fetchNanos                                                    atomic.Int64
}

// Stats are a cache's totals since it was opened.
type Stats struct {
	Hits        int64 `json:"hits"`         // chunk reads served from the cache
	Misses      int64 `json:"misses"`       // chunk reads that waited for a fetch
	Fetches     int64 `json:"fetches"`      // chunks fetched from the blob store
	FetchErrors int64 `json:"fetch_errors"` // failed fetch attempts (retried or not)
	Fetched     int64 `json:"fetched_bytes"`
	Written     int64 `json:"written_bytes"` // to the local disk
	Evicted     int64 `json:"evicted"`       // chunks removed for room
	Used        int64 `json:"used_bytes"`    // held now
	Limit       int64 `json:"limit_bytes"`
	// FetchTime is the time spent fetching (all fetches, summed).
	FetchTime time.Duration `json:"fetch_time_ns"`
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
	c.evict("")
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

// ReadAt reads len(p) bytes of chunk digest (size bytes long) at off,
// fetching the chunk first if the cache lacks it.
func (c *Cache) ReadAt(ctx context.Context, digest string, size int64, p []byte, off int64) error {
	path, err := c.path(digest)
	if err != nil {
		return err
	}
	if off < 0 || off+int64(len(p)) > size {
		return fmt.Errorf("read of %d bytes at %d past chunk %s of %d bytes", len(p), off, digest, size)
	}
	// A chunk evicted between Ensure and the open is fetched again.
	for try := 0; ; try++ {
		if err := c.Ensure(ctx, digest, size); err != nil {
			return err
		}
		f, err := os.Open(path)
		if errors.Is(err, os.ErrNotExist) && try < 3 {
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

// Has says whether chunk digest is in the cache.
func (c *Cache) Has(digest string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[digest] != nil
}

// Ensure makes chunk digest present in the cache (a recent use), waiting
// for its fetch.
func (c *Cache) Ensure(ctx context.Context, digest string, size int64) error {
	c.mu.Lock()
	if el := c.entries[digest]; el != nil {
		c.lru.MoveToFront(el)
		c.mu.Unlock()
		c.stats.hits.Add(1)
		return nil
	}
	c.stats.misses.Add(1)
	fl := c.flights[digest]
	if fl == nil {
		fl = &flight{done: make(chan struct{})}
		c.flights[digest] = fl
		// The fetch is the chunk's, not the first reader's: a reader that
		// gives up does not fail the others.
		go c.fetch(context.WithoutCancel(ctx), digest, size, fl)
	}
	c.mu.Unlock()
	select {
	case <-fl.done:
		return fl.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Prefetch fetches chunk digest in the background if the cache lacks it.
func (c *Cache) Prefetch(digest string, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries[digest] != nil || c.flights[digest] != nil {
		return
	}
	fl := &flight{done: make(chan struct{})}
	c.flights[digest] = fl
	go c.fetch(context.Background(), digest, size, fl)
}

// fetch gets a chunk from the store into the cache, with retries.
func (c *Cache) fetch(ctx context.Context, digest string, size int64, fl *flight) {
	start := time.Now()
	var err error
	wait := fetchBackoff
	for attempt := 1; ; attempt++ {
		if err = c.fetchOnce(ctx, digest, size); err == nil {
			break
		}
		c.stats.fetchErrors.Add(1)
		if attempt == fetchAttempts || errors.Is(err, errCorrupt) {
			break
		}
		time.Sleep(wait)
		wait *= 2
	}
	c.stats.fetchNanos.Add(int64(time.Since(start)))
	c.mu.Lock()
	delete(c.flights, digest)
	fl.err = err
	if err == nil {
		c.entries[digest] = c.lru.PushFront(&entry{digest: digest, size: size})
		c.used += size
		c.evict(digest)
	}
	c.mu.Unlock()
	close(fl.done)
}

// errCorrupt is a chunk whose bytes do not match its digest or size: not
// retried (the store holds the wrong bytes).
var errCorrupt = errors.New("chunk does not match its digest")

func (c *Cache) fetchOnce(ctx context.Context, digest string, size int64) error {
	if size < 0 || size > maxChunk {
		return fmt.Errorf("chunk %s: size %d", digest, size)
	}
	path, err := c.path(digest)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r, err := c.store.Open(ctx, digest)
	if err != nil {
		return fmt.Errorf("fetch chunk %s: %w", digest, err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, size+1))
	if err != nil {
		return fmt.Errorf("fetch chunk %s: %w", digest, err)
	}
	c.stats.fetches.Add(1)
	c.stats.fetched.Add(int64(len(b)))
	if int64(len(b)) != size || blob.FromBytes(b) != digest {
		return fmt.Errorf("chunk %s (%d bytes, want %d): %w", digest, len(b), size, errCorrupt)
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
		return fmt.Errorf("cache chunk %s: %w", digest, err)
	}
	c.stats.written.Add(int64(len(b)))
	return nil
}

// evict removes least recently used chunks until the cache is within its
// limit, never keep (the chunk just fetched). c.mu held.
func (c *Cache) evict(keep string) {
	for c.used > c.limit {
		el := c.lru.Back()
		if el == nil {
			return
		}
		e := el.Value.(*entry)
		if e.digest == keep {
			if el.Prev() == nil {
				return
			}
			c.lru.MoveToFront(el)
			continue
		}
		c.lru.Remove(el)
		delete(c.entries, e.digest)
		c.used -= e.size
		c.stats.evicted.Add(1)
		if p, err := c.path(e.digest); err == nil {
			os.Remove(p) // readers with it open read on
		}
	}
}

// Stats returns the cache's totals.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	used := c.used
	c.mu.Unlock()
	return Stats{
		Hits: c.stats.hits.Load(), Misses: c.stats.misses.Load(), Fetches: c.stats.fetches.Load(),
		FetchErrors: c.stats.fetchErrors.Load(), Fetched: c.stats.fetched.Load(), Written: c.stats.written.Load(),
		Evicted: c.stats.evicted.Load(), Used: used, Limit: c.limit, FetchTime: time.Duration(c.stats.fetchNanos.Load()),
	}
}
