package image_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
)

// countingStore hides the Dir's Path method, so the cache must copy, and
// counts Opens. With gate set, Open waits for it to close.
type countingStore struct {
	blob.Store
	opens atomic.Int32
	gate  chan struct{}
	// corrupt replaces every blob's content.
	corrupt string
}

func (s *countingStore) Open(ctx context.Context, digest string) (io.ReadCloser, error) {
	s.opens.Add(1)
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if s.corrupt != "" {
		return io.NopCloser(strings.NewReader(s.corrupt)), nil
	}
	return s.Store.Open(ctx, digest)
}

func TestCacheFetchOnce(t *testing.T) {
	ctx := context.Background()
	bs := &countingStore{Store: newBlobs(t), gate: make(chan struct{})}
	d := putBlob(t, bs, strings.Repeat("layer bytes ", 100000))
	c := image.NewCache(t.TempDir(), bs)

	const n = 100
	layers := make([]backend.Layer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			layers[i], errs[i] = c.Fetch(ctx, d)
		}()
	}
	time.Sleep(50 * time.Millisecond) // let them pile up on one download
	close(bs.gate)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || layers[i].Digest != d || layers[i].Path != layers[0].Path {
			t.Fatalf("Fetch %d: got %+v, %v", i, layers[i], errs[i])
		}
	}
	if got := bs.opens.Load(); got != 1 {
		t.Fatalf("blob store opened %d times for %d concurrent Fetches, want 1", got, n)
	}
	got, err := os.ReadFile(layers[0].Path)
	if err != nil || string(got) != strings.Repeat("layer bytes ", 100000) {
		t.Fatalf("cached file: %d bytes, %v", len(got), err)
	}

	// Cached: no more downloads.
	if _, err := c.Fetch(ctx, d); err != nil || bs.opens.Load() != 1 {
		t.Fatalf("Fetch of a cached layer: %v, %d opens; want no new download", err, bs.opens.Load())
	}
	if l, _ := c.List(); len(l) != 1 || l[0] != d {
		t.Fatalf("List: got %v, want [%s]", l, d)
	}
	must(t, c.Remove(d))
	must(t, c.Remove(d))
	if _, err := os.Stat(layers[0].Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Remove: %v, want gone", err)
	}
	if _, err := c.Fetch(ctx, d); err != nil || bs.opens.Load() != 2 {
		t.Fatalf("Fetch after Remove: %v, %d opens; want a second download", err, bs.opens.Load())
	}
}

func TestCacheRejectsCorruptContent(t *testing.T) {
	ctx := context.Background()
	bs := &countingStore{Store: newBlobs(t)}
	d := putBlob(t, bs, "the real layer")
	bs.corrupt = "a substituted layer"
	dir := t.TempDir()
	c := image.NewCache(dir, bs)
	_, err := c.Fetch(ctx, d)
	if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != "digest_mismatch" {
		t.Fatalf("Fetch of corrupt content: got %v, want ErrInvalid digest_mismatch", err)
	}
	if l, _ := c.List(); len(l) != 0 {
		t.Fatalf("corrupt layer cached: %v", l)
	}
	if tmp, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(tmp) != 0 {
		t.Fatalf("temp files left: %d", len(tmp))
	}
}

func TestCacheErrors(t *testing.T) {
	ctx := context.Background()
	c := image.NewCache(t.TempDir(), newBlobs(t))
	_, err := c.Fetch(ctx, blob.FromBytes([]byte("absent")))
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != "layer_not_found" {
		t.Errorf("Fetch absent: got %v, want ErrNotFound layer_not_found", err)
	}
	for _, d := range []string{"", "sha256:../../etc/passwd", "busybox"} {
		if _, err := c.Fetch(ctx, d); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Fetch(%q): got %v, want ErrInvalid", d, err)
		}
		if err := c.Remove(d); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Remove(%q): got %v, want ErrInvalid", d, err)
		}
	}
}

// TestCacheCancel: a caller that gives up gets its ctx error; the next
// caller gets the layer.
func TestCacheCancel(t *testing.T) {
	bs := &countingStore{Store: newBlobs(t), gate: make(chan struct{})}
	d := putBlob(t, bs, "slow layer")
	c := image.NewCache(t.TempDir(), bs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Fetch(ctx, d); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch with expiring ctx: got %v, want DeadlineExceeded", err)
	}
	close(bs.gate)
	if _, err := c.Fetch(context.Background(), d); err != nil {
		t.Fatalf("Fetch after a canceled one: %v", err)
	}
}

// TestCacheHardLinks: a Dir blob store on the same filesystem is linked,
// not copied.
func TestCacheHardLinks(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	bs, err := blob.NewDir(filepath.Join(root, "blobs"))
	must(t, err)
	d := putBlob(t, bs, "linked layer")
	l, err := image.NewCache(filepath.Join(root, "cache"), bs).Fetch(ctx, d)
	must(t, err)
	src, _ := bs.Path(d)
	a, err1 := os.Stat(src)
	b, err2 := os.Stat(l.Path)
	if err1 != nil || err2 != nil || !os.SameFile(a, b) {
		t.Fatalf("cached layer %s is not a hard link of %s (%v, %v)", l.Path, src, err1, err2)
	}
}
