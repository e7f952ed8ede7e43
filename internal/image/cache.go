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

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Cache keeps whole layer files on a node's local disk, fetched from the
// blob store on first use:
//
//	<dir>/sha256/<64 hex>   one read-only EROFS file per layer
//	<dir>/tmp/              fetches in progress
//
// Concurrent Fetches of one digest share a single download, which is
// verified against the digest while it is copied and renamed into place
// only when complete. When the blob store is a Dir on the same filesystem,
// the layer is hard-linked instead of copied (Dir verified it on Put).
// A present file is trusted: it is not re-hashed on every Fetch.
type Cache struct {
	dir string
	bs  blob.Store

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

// Fetch returns the layer's local EROFS file, downloading it first if it
// is not cached. It costs one stat when cached, one copy (or hard link)
// otherwise. Errors: ErrInvalid for a malformed digest or content that
// does not match it, ErrNotFound (code "layer_not_found") if the blob
// store lacks the layer.
func (c *Cache) Fetch(ctx context.Context, digest string) (backend.Layer, error) {
	path, err := c.Path(digest)
	if err != nil {
		return backend.Layer{}, err
	}
	if _, err := os.Stat(path); err == nil {
		return backend.Layer{Digest: digest, Path: path}, nil
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

// download puts the layer at path: a hard link when the blob store is a
// directory on this filesystem, else a verified copy via a temp file.
func (c *Cache) download(ctx context.Context, digest, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if d, ok := c.bs.(interface{ Path(string) (string, error) }); ok {
		if src, err := d.Path(digest); err == nil {
			err := os.Link(src, path)
			if err == nil || errors.Is(err, fs.ErrExist) {
				return nil
			}
			// Another filesystem, a missing blob, no link support: copy,
			// which also reports a missing blob properly.
		}
	}

	rc, err := c.bs.Open(ctx, digest)
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, "layer_not_found", "layer %s is not in the blob store", digest)
	}
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := os.MkdirAll(c.tmpDir(), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.tmpDir(), "fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	defer tmp.Close()
	src := blob.Verify(blob.ContextReader(ctx, rc), digest)
	if _, err := io.CopyBuffer(tmp, src, make([]byte, 1<<20)); err != nil {
		return err
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
