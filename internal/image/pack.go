package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/rootfs"
)

// Pack is the node's half of a snapshot: it builds dir (a copy of a
// sandbox's overlayfs upper directory, whiteouts and all) into a diff
// layer on top of parent (a manifest digest), stores it in the blob store
// (Pack: only the chunks the store lacks), and keeps the built file in
// the cache, so that sandboxes made from the snapshot on this node (forks
// first of all) start without fetching it. It registers nothing.
//
// The image keeps what overlayfs reads in a lower layer: owners, modes,
// mtimes, xattrs (trusted.overlay.opaque), whiteouts (0/0 character
// devices) and hard links; sparse files stay sparse (WithSparse, where the
// tree has holes), so a file a sandbox truncated to a terabyte costs its
// data, not its size.
func (c *Cache) Pack(ctx context.Context, dir, parent string) (api.PackResult, error) {
	start := time.Now()
	tree, err := rootfs.Scan(dir)
	if err != nil {
		return api.PackResult{}, fmt.Errorf("pack: %w", err)
	}
	if tree.Holes > api.MaxSnapshotHoles {
		return api.PackResult{}, errdefs.New(errdefs.ErrInvalid, api.CodeSnapshotTooSparse,
			"the sandbox's files have %d MiB of holes, over the %d MiB a snapshot takes (the sparsest: /%s, %d MiB)",
			tree.Holes>>20, api.MaxSnapshotHoles>>20, tree.Sparsest, tree.SparsestHoles>>20)
	}
	if err := os.MkdirAll(c.tmpDir(), 0o755); err != nil {
		return api.PackResult{}, err
	}
	tmp, err := os.MkdirTemp(c.tmpDir(), "pack-*")
	if err != nil {
		return api.PackResult{}, err
	}
	defer os.RemoveAll(tmp)
	file := filepath.Join(tmp, "layer.erofs")
	var opts []BuildOption
	if tree.Holes > 0 {
		// Chunked, to keep the holes: it costs a hash per 4 KiB of
		// every file, so only where there are holes to keep.
		opts = append(opts, WithSparse())
	}
	if err := BuildEROFS(ctx, dir, file, opts...); err != nil {
		return api.PackResult{}, fmt.Errorf("pack: %w", err)
	}
	m, digest, st, err := Pack(ctx, c.bs, file, api.LayerDiff, parent)
	if err != nil {
		return api.PackResult{}, fmt.Errorf("pack: %w", err)
	}
	path, err := c.Path(digest)
	if err != nil {
		return api.PackResult{}, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return api.PackResult{}, err
	}
	if err := os.Chmod(file, 0o444); err != nil {
		return api.PackResult{}, err
	}
	// Synced first, as a download is: a cached file is trusted whole.
	if err := syncFile(file); err != nil {
		return api.PackResult{}, err
	}
	if err := os.Rename(file, path); err != nil {
		return api.PackResult{}, err
	}
	return api.PackResult{Digest: digest, ImageDigest: m.Image, Size: m.Size, Parent: parent,
		Stats: api.SnapshotStats{PackMS: ms(time.Since(start)), Files: tree.Files, Bytes: tree.Bytes,
			Chunks: st.Chunks, Uploaded: st.Uploaded, UploadedBytes: st.UploadedBytes}}, nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
