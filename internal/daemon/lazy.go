package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/lazy"
)

// LayersConfig says how a node loads its sandboxes' layers.
type LayersConfig struct {
	// Lazy serves layers on demand (package lazy): a FUSE file per layer
	// under <node dir>/lazy/mnt, its chunks fetched on first read into a
	// cache under <node dir>/lazy/chunks. Off: each layer is downloaded
	// whole before its first start (eager).
	Lazy bool
	// CacheBytes bounds the chunk cache. Default 16 GiB.
	CacheBytes int64
}

// DefaultChunkCache is LayersConfig.CacheBytes' default.
const DefaultChunkCache = 16 << 30

// setupLayers makes cache serve layers lazily if cfg says so, and
// returns what undoes it (unmounts the lazy filesystem).
func setupLayers(nodeDir string, cache *image.Cache, blobs blob.Store, cfg LayersConfig, log *slog.Logger) (func(), error) {
	if !cfg.Lazy {
		return func() {}, nil
	}
	limit := cfg.CacheBytes
	if limit <= 0 {
		limit = DefaultChunkCache
	}
	chunks, err := lazy.OpenCache(filepath.Join(nodeDir, "lazy", "chunks"), blobs, limit)
	if err != nil {
		return nil, fmt.Errorf("lazy layers: %w", err)
	}
	mnt := filepath.Join(nodeDir, "lazy", "mnt")
	// A filesystem an earlier agent left behind is dead (its server went
	// with it), and so are the layer mounts on its files: they are
	// detached, so that new sandboxes mount their layers afresh. Sandboxes
	// still running on them read EIO: said here, for the operator.
	if dead, err := image.DetachMountsOf(mnt); len(dead) > 0 || err != nil {
		log.Warn("lazy layers: layer mounts of the earlier agent's filesystem detached; sandboxes using them read EIO until recreated", "mounts", len(dead), "err", err)
	}
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		log.Warn("lazy layers: unmount the earlier filesystem", "dir", mnt, "err", err)
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return nil, err
	}
	fsys, err := lazy.Mount(mnt, chunks)
	if err != nil {
		return nil, fmt.Errorf("lazy layers (run without --lazy-layers where FUSE is missing): %w", err)
	}
	cache.SetLazy(fsys)
	log.Info("layers load on demand", "mount", mnt, "chunk_cache", limit)
	return func() {
		if err := fsys.Close(); err != nil {
			log.Warn("lazy layers: unmount", "err", err)
		}
	}, nil
}
