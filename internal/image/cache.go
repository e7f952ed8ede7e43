package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/lazy"
)

// Cache keeps whole layer files on a node's local disk, assembled from the
// blob store on first use:
//
//	<dir>/sha256/<64 hex>   one read-only EROFS file per layer, named by
//	                        the layer's manifest digest
//	<dir>/tmp/              fetches in progress
//
// A layer is fetched from the blob store alone: its manifest, then its
// chunks. Concurrent Fetches of one digest share a single download; every
// chunk and then the whole image are verified, and the file is renamed
// into place only when complete. A present file is trusted: it is not
// re-hashed on every Fetch.
type Cache struct {
	dir  string
	bs   blob.Store
	lazy lazy.Layers // set: layers are served on demand (SetLazy)

	mu       sync.Mutex
	inflight map[string]*fetch
}

// fetch is one download shared by every Fetch of a digest. It is canceled
// when the last waiting caller gives up.
type fetch struct {
	done    chan struct{}
	layer   backend.Layer
	err     error
	waiters int // guarded by Cache.mu
	cancel  context.CancelFunc
}

// NewCache returns a cache of layers in dir, which it owns, fetched from
// bs. Downloads that a crashed process left unfinished are removed.
func NewCache(dir string, bs blob.Store) *Cache {
	c := &Cache{dir: dir, bs: bs, inflight: map[string]*fetch{}}
	os.RemoveAll(c.tmpDir()) // best effort: Fetch recreates it
	return c
}

func (c *Cache) tmpDir() string { return filepath.Join(c.dir, "tmp") }

// Path returns where the layer with digest is (or would be) cached.
// ErrInvalid for a malformed digest.
func (c *Cache) Path(digest string) (string, error) {
	h, err := blob.ParseDigest(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(c.dir, blob.Algorithm, h), nil
}

// SetLazy makes Fetch serve layers not cached whole through the lazy
// layers l (a layer server, or a filesystem in this process): only the
// manifest is read first (and kept under <dir>/manifests, for restarts),
// the layer appears as a file on l's filesystem, and its data is fetched
// chunk by chunk on first read (package lazy). Call it before the first
// Fetch.
func (c *Cache) SetLazy(l lazy.Layers) { c.lazy = l }

// Lazy is the lazy layers Fetch serves through, or nil.
func (c *Cache) Lazy() lazy.Layers { return c.lazy }

// Loading says how the node loads layers (api.LayersEager or LayersLazy)
// and, lazily, its chunk cache's totals (none while they cannot be read:
// the layer server is down).
func (c *Cache) Loading() (string, *api.LayerCacheStats) {
	if c.lazy == nil {
		return api.LayersEager, nil
	}
	st, err := c.lazy.Stats()
	if err != nil {
		return api.LayersLazy, nil
	}
	return api.LayersLazy, &api.LayerCacheStats{Hits: st.Hits, Misses: st.Misses, Fetches: st.Fetches, FetchErrors: st.FetchErrors,
		FetchedBytes: st.Fetched, WrittenBytes: st.Written, Evicted: st.Evicted, UsedBytes: st.Used, LimitBytes: st.Limit, FetchMs: st.FetchTime.Milliseconds(),
		PrefetchedBytes: st.Prefetched}
}

// Fetch returns the local EROFS file of the layer whose manifest has
// digest, assembling it first if it is not cached (or, lazily, making it
// appear on the lazy filesystem: SetLazy). It costs one stat when
// cached; otherwise one read of the image's chunks and one hash of it.
// Errors: ErrInvalid for a malformed digest, manifest or content that does
// not match its digest, ErrNotFound (code "layer_not_found") if the blob
// store lacks the manifest or a chunk.
func (c *Cache) Fetch(ctx context.Context, digest string) (backend.Layer, error) {
	return c.FetchTraced(ctx, digest, "")
}

// FetchTraced is Fetch of a layer with a prefetch trace (the digest of a
// trace blob, api.Image.PrefetchTraces; "" for none): a lazily loaded
// layer replays it in the background (package lazy); a layer without
// one has its first reads recorded into one. An eager cache ignores it.
func (c *Cache) FetchTraced(ctx context.Context, digest, trace string) (backend.Layer, error) {
	path, err := c.Path(digest)
	if err != nil {
		return backend.Layer{}, err
	}
	if _, err := os.Stat(path); err == nil {
		// The mtime records the last use, for Prune.
		now := time.Now()
		os.Chtimes(path, now, now)
		return backend.Layer{Digest: digest, Path: path}, nil
	}
	if c.lazy != nil {
		return c.fetchLazy(ctx, digest, trace)
	}

	c.mu.Lock()
	f := c.inflight[digest]
	if f == nil {
		// Detached from ctx: the download serves every waiter, and is
		// canceled only when all of them have given up.
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &fetch{done: make(chan struct{}), cancel: cancel}
		c.inflight[digest] = f
		go c.run(fctx, digest, path, f)
	}
	f.waiters++
	c.mu.Unlock()

	select {
	case <-f.done:
		return f.layer, f.err
	case <-ctx.Done():
		c.mu.Lock()
		if f.waiters--; f.waiters == 0 {
			f.cancel()
			if c.inflight[digest] == f {
				delete(c.inflight, digest) // the next caller starts afresh
			}
		}
		c.mu.Unlock()
		return backend.Layer{}, fmt.Errorf("fetch layer %s: %w", digest, ctx.Err())
	}
}

func (c *Cache) run(ctx context.Context, digest, path string, f *fetch) {
	err := c.download(ctx, digest, path)
	if err == nil {
		f.layer = backend.Layer{Digest: digest, Path: path}
	} else {
		f.err = fmt.Errorf("fetch layer %s: %w", digest, err)
	}
	c.mu.Lock()
	if c.inflight[digest] == f {
		delete(c.inflight, digest)
	}
	c.mu.Unlock()
	f.cancel()
	close(f.done)
}

// download assembles the layer's EROFS image at path from the blob
// store: the manifest, then its chunks (a few at a time, each verified
// against its digest), then a check of the whole image against the
// manifest's image digest, before the rename that makes it visible.
func (c *Cache) download(ctx context.Context, digest, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	m, err := ReadManifest(ctx, c.bs, digest)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.tmpDir(), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.tmpDir(), "fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	defer tmp.Close()
	if err := tmp.Truncate(m.Size); err != nil {
		return err
	}
	if err := c.fetchChunks(ctx, tmp, m); err != nil {
		return err
	}
	// Every chunk was verified; hashing the whole image again (from the
	// page cache) guards the assembly itself.
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	dg := blob.NewDigester()
	if _, err := io.CopyBuffer(dg, blob.ContextReader(ctx, tmp), make([]byte, 1<<20)); err != nil {
		return err
	}
	if got := dg.Digest(); got != m.Image {
		return errdefs.New(errdefs.ErrInvalid, "digest_mismatch", "layer %s: assembled image has digest %s, manifest says %s", digest, got, m.Image)
	}
	// Synced before the rename: after a power loss the file is either
	// absent or whole, never a truncated file that Fetch would trust.
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Chmod(0o444); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// fetchParallel is how many chunks a fetch downloads at once.
const fetchParallel = 4

// fetchChunks writes m's chunks into f at their offsets; a chunk that
// occurs several times is downloaded once per occurrence.
func (c *Cache) fetchChunks(ctx context.Context, f *os.File, m Manifest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type job struct {
		off int64
		c   Chunk
	}
	jobs := make(chan job)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for range fetchParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for j := range jobs {
				if err := c.fetchChunk(ctx, f, j.off, j.c, buf); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
				}
			}
		}()
	}
	var off int64
feed:
	for _, ch := range m.Chunks {
		select {
		case jobs <- job{off, ch}:
		case <-ctx.Done():
			break feed
		}
		off += ch.Size
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func (c *Cache) fetchChunk(ctx context.Context, f *os.File, off int64, ch Chunk, buf []byte) error {
	rc, err := c.bs.Open(ctx, ch.Digest)
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, api.CodeLayerNotFound, "chunk %s at %d is not in the blob store", ch.Digest, off)
	}
	if err != nil {
		return err
	}
	defer rc.Close()
	// Verify reports a mismatch at EOF, so the chunk is read to its end
	// (and one byte past, to catch a longer blob).
	w := io.NewOffsetWriter(f, off)
	src := blob.Verify(blob.ContextReader(ctx, rc), ch.Digest)
	n, err := io.CopyBuffer(w, io.LimitReader(src, ch.Size+1), buf)
	if err != nil {
		return fmt.Errorf("chunk %s: %w", ch.Digest, err)
	}
	if n != ch.Size {
		return errdefs.New(errdefs.ErrInvalid, "digest_mismatch", "chunk %s: %d bytes, manifest says %d", ch.Digest, n, ch.Size)
	}
	return nil
}

// Remove deletes the cached layer; removing an absent layer is not an
// error. The caller makes sure no sandbox still mounts it (an existing
// mount keeps working regardless: it holds the file open).
func (c *Cache) Remove(digest string) error {
	path, err := c.Path(digest)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove cached layer %s: %w", digest, err)
	}
	return nil
}

// Prune removes the cached layers that keep does not name and that no
// Fetch returned within minAge (a sandbox being created may not be live
// yet), and returns their digests. A removed file that is still mounted
// stays readable through the mount.
func (c *Cache) Prune(keep map[string]bool, minAge time.Duration) ([]string, error) {
	all, err := c.List()
	if err != nil {
		return nil, err
	}
	removed := []string{}
	for _, d := range all {
		if keep[d] {
			continue
		}
		c.mu.Lock()
		busy := c.inflight[d] != nil
		c.mu.Unlock()
		path, _ := c.Path(d)
		fi, err := os.Stat(path)
		if busy || err != nil || time.Since(fi.ModTime()) < minAge {
			continue
		}
		if err := c.Remove(d); err != nil {
			return removed, err
		}
		removed = append(removed, d)
	}
	return removed, nil
}

// List returns the digests of every cached layer, sorted.
func (c *Cache) List() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(c.dir, blob.Algorithm))
	if errors.Is(err, fs.ErrNotExist) {
		return []string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list cached layers: %w", err)
	}
	out := []string{}
	for _, e := range entries {
		d := blob.Algorithm + ":" + e.Name()
		if _, err := blob.ParseDigest(d); err == nil && e.Type().IsRegular() {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out, nil
}

// fetchLazy makes the layer of manifest digest appear on the lazy
// filesystem, replaying trace if set. The manifest comes from the local
// copy if there is one. A blob store that cannot be reached is
// ErrUnavailable with code image_unavailable.
func (c *Cache) fetchLazy(ctx context.Context, digest, trace string) (backend.Layer, error) {
	h, err := blob.ParseDigest(digest)
	if err != nil {
		return backend.Layer{}, err
	}
	local := filepath.Join(c.dir, "manifests", h)
	var m Manifest
	b, err := os.ReadFile(local)
	if err == nil && blob.FromBytes(b) == digest {
		m, err = DecodeManifest(b, digest)
	} else {
		m, err = ReadManifest(ctx, c.bs, digest)
		if err == nil {
			if enc, _, eerr := m.Encode(); eerr == nil && os.MkdirAll(filepath.Dir(local), 0o755) == nil {
				writeFileAtomic(local, enc)
			}
		}
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) || ctx.Err() != nil {
			return backend.Layer{}, fmt.Errorf("fetch layer %s: %w", digest, err)
		}
		return backend.Layer{}, errdefs.New(errdefs.ErrUnavailable, api.CodeImageUnavailable, "layer %s: its manifest cannot be read from the blob store: %v", digest, err)
	}
	path, err := c.lazy.Add(m.lazyLayer(digest, trace))
	if err != nil {
		return backend.Layer{}, fmt.Errorf("fetch layer %s: %w", digest, err)
	}
	return backend.Layer{Digest: digest, Path: path}, nil
}

// lazyLayer is the layer of manifest m, whose digest is digest, as a
// lazy filesystem serves it, with a prefetch trace to replay if trace is
// set.
func (m Manifest) lazyLayer(digest, trace string) lazy.Layer {
	l := lazy.Layer{Digest: digest, Size: m.Size, BlockSize: m.BlockSize, Extents: m.Extents, Chunks: make([]lazy.Chunk, len(m.Chunks)), Trace: trace}
	for i, ch := range m.Chunks {
		l.Chunks[i] = lazy.Chunk{Digest: ch.Digest, Size: ch.Size, Blocks: ch.Blocks}
	}
	return l
}

// writeFileAtomic writes b to path through a temporary file and a rename.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
