package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Dir is a Store in a directory: a local disk, or a distributed filesystem
// mount (CephFS, JuiceFS, 3FS, NFS) that a whole fleet shares. Layout:
//
//	<dir>/sha256/<first 2 hex>/<64 hex>   one file per blob, read-only
//	<dir>/tmp/                            blobs being written
//
// A blob is written to tmp/ (same filesystem), fsynced, then renamed into
// place, so readers on any node see a blob whole or not at all, and a blob
// that Put acknowledged survives a crash. Several processes may share one
// Dir: two Puts of the same content both succeed.
type Dir struct {
	root string
}

var _ Store = (*Dir)(nil)

// staleTemp is how old an unfinished write must be before NewDir removes
// it. It is long because other nodes may be writing into a shared Dir.
const staleTemp = 24 * time.Hour

// NewDir opens (creating if needed) a Dir store rooted at dir, and removes
// day-old temporary files that crashed writers left behind.
func NewDir(dir string) (*Dir, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	d := &Dir{root: root}
	for _, p := range []string{d.tmpDir(), filepath.Join(root, Algorithm)} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, fmt.Errorf("blob: open %s: %w", dir, err)
		}
	}
	d.removeStaleTemp()
	return d, nil
}

// Root returns the store's directory.
func (d *Dir) Root() string { return d.root }

func (d *Dir) tmpDir() string { return filepath.Join(d.root, "tmp") }

// Path returns the file that holds digest, whether or not it exists yet.
// It lets a consumer on the same filesystem hard-link a blob instead of
// copying it. ErrInvalid for a malformed digest.
func (d *Dir) Path(digest string) (string, error) {
	h, err := ParseDigest(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(d.root, Algorithm, h[:2], h), nil
}

// Put stores r's content. It costs one full read of r, one fsync and a
// rename; content already present is detected after hashing and the new
// copy dropped.
func (d *Dir) Put(ctx context.Context, r io.Reader) (string, int64, error) {
	f, err := os.CreateTemp(d.tmpDir(), "put-*")
	if err != nil {
		return "", 0, fmt.Errorf("blob: put: %w", err)
	}
	tmp := f.Name()
	committed := false
	defer func() {
		if !committed {
			f.Close()
			os.Remove(tmp)
		}
	}()

	dg := NewDigester()
	// Large buffers: layers are big and a shared filesystem likes big writes.
	size, err := io.CopyBuffer(io.MultiWriter(f, dg), ctxReader{ctx, r}, make([]byte, 1<<20))
	if err != nil {
		return "", 0, fmt.Errorf("blob: put: %w", err)
	}
	digest := dg.Digest()
	final, _ := d.Path(digest)
	if _, err := os.Stat(final); err == nil {
		return digest, size, nil // already stored; the deferred cleanup drops ours
	}
	// Blobs are immutable: read-only files say so to anyone poking around.
	if err := f.Chmod(0o444); err != nil {
		return "", 0, fmt.Errorf("blob: put: %w", err)
	}
	if err := f.Sync(); err != nil {
		return "", 0, fmt.Errorf("blob: put: fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", 0, fmt.Errorf("blob: put: %w", err)
	}
	shard := filepath.Dir(final)
	if err := os.MkdirAll(shard, 0o755); err != nil {
		return "", 0, fmt.Errorf("blob: put: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", 0, fmt.Errorf("blob: put %s: %w", digest, err)
	}
	committed = true
	// The rename itself must reach the disk too, or a crash could lose a
	// blob whose digest a caller already recorded in the store.
	if err := syncDir(shard); err != nil {
		return "", 0, fmt.Errorf("blob: put %s: fsync dir: %w", digest, err)
	}
	return digest, size, nil
}

func (d *Dir) Open(ctx context.Context, digest string) (io.ReadCloser, error) {
	p, err := d.Path(digest)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, d.fsErr("open", digest, err)
	}
	return f, nil
}

func (d *Dir) Stat(ctx context.Context, digest string) (int64, error) {
	p, err := d.Path(digest)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return 0, d.fsErr("stat", digest, err)
	}
	return fi.Size(), nil
}

func (d *Dir) Delete(ctx context.Context, digest string) error {
	p, err := d.Path(digest)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob: delete %s: %w", digest, err)
	}
	return nil
}

// List walks the whole store: its cost grows with the number of blobs.
// Files that are not well-formed blobs are skipped.
func (d *Dir) List(ctx context.Context) ([]string, error) {
	base := filepath.Join(d.root, Algorithm)
	shards, err := os.ReadDir(base)
	if err != nil {
		return nil, fmt.Errorf("blob: list: %w", err)
	}
	out := []string{}
	for _, s := range shards {
		if !s.IsDir() || len(s.Name()) != 2 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		files, err := os.ReadDir(filepath.Join(base, s.Name()))
		if err != nil {
			return nil, fmt.Errorf("blob: list: %w", err)
		}
		for _, f := range files {
			digest := digestPrefix + f.Name()
			if _, err := ParseDigest(digest); err != nil || f.Name()[:2] != s.Name() || !f.Type().IsRegular() {
				continue
			}
			out = append(out, digest)
		}
	}
	sort.Strings(out)
	return out, nil
}

func (d *Dir) fsErr(op, digest string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.New(errdefs.ErrNotFound, "blob_not_found", "blob %s not found", digest)
	}
	return fmt.Errorf("blob: %s %s: %w", op, digest, err)
}

func (d *Dir) removeStaleTemp() {
	entries, err := os.ReadDir(d.tmpDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTemp {
			os.Remove(filepath.Join(d.tmpDir(), e.Name()))
		}
	}
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// ContextReader returns a reader that fails with ctx's error once ctx ends,
// so a long copy from r stops between reads.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx, r} }

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
