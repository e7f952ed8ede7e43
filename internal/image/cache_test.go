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

// putLayer stores content as a layer cut into 4 KiB chunks (the smallest
// the manifest allows, so small tests get several) and returns the
// manifest's digest and the number of chunks.
func putLayer(t *testing.T, bs blob.Store, content string) (string, int) {
	t.Helper()
	m := image.Manifest{Schema: image.ManifestSchema, Kind: "base", Size: int64(len(content)), ChunkSize: 4096,
		Image: blob.FromBytes([]byte(content))}
	for off := 0; off < len(content); off += 4096 {
		c := content[off:min(off+4096, len(content))]
		m.Chunks = append(m.Chunks, image.Chunk{Digest: putBlob(t, bs, c), Size: int64(len(c))})
	}
	b, d, err := m.Encode()
	must(t, err)
	if got := putBlob(t, bs, string(b)); got != d {
		t.Fatalf("manifest digest: got %s, want %s", got, d)
	}
	return d, len(m.Chunks)
}

func TestCacheFetchOnce(t *testing.T) {
	ctx := context.Background()
	bs := &countingStore{Store: newBlobs(t)}
	content := strings.Repeat("layer bytes ", 10000)
	d, chunks := putLayer(t, bs, content)
	bs.gate = make(chan struct{})
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
	want := int32(1 + chunks) // the manifest, then each chunk once
	if got := bs.opens.Load(); got != want {
		t.Fatalf("blob store opened %d times for %d concurrent Fetches, want %d", got, n, want)
	}
	got, err := os.ReadFile(layers[0].Path)
	if err != nil || string(got) != content {
		t.Fatalf("cached file: %d bytes, %v", len(got), err)
	}

	// Cached: no more downloads.
	if _, err := c.Fetch(ctx, d); err != nil || bs.opens.Load() != want {
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
	if _, err := c.Fetch(ctx, d); err != nil || bs.opens.Load() != 2*want {
		t.Fatalf("Fetch after Remove: %v, %d opens; want a second download", err, bs.opens.Load())
	}
}

// swapStore serves other content for one digest.
type swapStore struct {
	blob.Store
	digest, content string
}

func (s *swapStore) Open(ctx context.Context, digest string) (io.ReadCloser, error) {
	if digest == s.digest {
		return io.NopCloser(strings.NewReader(s.content)), nil
	}
	return s.Store.Open(ctx, digest)
}

func TestCacheRejectsCorruptContent(t *testing.T) {
	ctx := context.Background()
	content := strings.Repeat("the real layer ", 1000)
	base := newBlobs(t)
	d, _ := putLayer(t, base, content)
	m, err := image.ReadManifest(ctx, base, d)
	must(t, err)

	// A manifest whose image digest lies, over genuine chunks.
	liar := m
	liar.Image = blob.FromBytes([]byte("something else"))
	lb, ld, err := liar.Encode()
	must(t, err)
	putBlob(t, base, string(lb))

	cases := []struct {
		name   string
		bs     blob.Store
		digest string
	}{
		{"every blob substituted", &countingStore{Store: base, corrupt: "a substituted layer"}, d},
		{"one chunk substituted", &swapStore{Store: base, digest: m.Chunks[1].Digest, content: "evil"}, d},
		{"one chunk longer", &swapStore{Store: base, digest: m.Chunks[0].Digest, content: content[:4097]}, d},
		{"image digest wrong", base, ld},
	}
	for _, tc := range cases {
		dir := t.TempDir()
		c := image.NewCache(dir, tc.bs)
		_, err := c.Fetch(ctx, tc.digest)
		if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != "digest_mismatch" {
			t.Errorf("%s: got %v, want ErrInvalid digest_mismatch", tc.name, err)
		}
		if l, _ := c.List(); len(l) != 0 {
			t.Errorf("%s: corrupt layer cached: %v", tc.name, l)
		}
		if tmp, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(tmp) != 0 {
			t.Errorf("%s: temp files left: %d", tc.name, len(tmp))
		}
	}
}

func TestCacheErrors(t *testing.T) {
	ctx := context.Background()
	bs := newBlobs(t)
	c := image.NewCache(t.TempDir(), bs)
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
	// A blob that is not a manifest (say, a raw image).
	raw := putBlob(t, bs, "not json")
	if _, err := c.Fetch(ctx, raw); !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != "invalid_manifest" {
		t.Errorf("Fetch of a non-manifest: got %v, want ErrInvalid invalid_manifest", err)
	}
	// A chunk missing from the store.
	d, _ := putLayer(t, bs, strings.Repeat("x", 10000))
	m, err := image.ReadManifest(ctx, bs, d)
	must(t, err)
	must(t, bs.Delete(ctx, m.Chunks[2].Digest))
	if _, err := c.Fetch(ctx, d); !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != "layer_not_found" {
		t.Errorf("Fetch with a missing chunk: got %v, want ErrNotFound layer_not_found", err)
	}
}

// TestCacheCancel: a caller that gives up gets its ctx error; the next
// caller gets the layer.
func TestCacheCancel(t *testing.T) {
	bs := &countingStore{Store: newBlobs(t)}
	d, _ := putLayer(t, bs, "slow layer")
	bs.gate = make(chan struct{})
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

func TestCachePrune(t *testing.T) {
	ctx := context.Background()
	bs := newBlobs(t)
	used, _ := putLayer(t, bs, "used layer")
	idle, _ := putLayer(t, bs, "idle layer")
	fresh, _ := putLayer(t, bs, "fresh layer")
	c := image.NewCache(t.TempDir(), bs)
	old := time.Now().Add(-time.Hour)
	for _, d := range []string{used, idle, fresh} {
		l, err := c.Fetch(ctx, d)
		must(t, err)
		if d != fresh {
			must(t, os.Chtimes(l.Path, old, old))
		}
	}
	removed, err := c.Prune(map[string]bool{used: true}, 10*time.Minute)
	must(t, err)
	if len(removed) != 1 || removed[0] != idle {
		t.Fatalf("Prune removed %v, want only the idle layer %s", removed, idle)
	}
	if l, _ := c.List(); len(l) != 2 {
		t.Fatalf("after Prune: %d layers cached, want 2", len(l))
	}
}

func TestOpenImage(t *testing.T) {
	ctx := context.Background()
	bs := newBlobs(t)
	content := strings.Repeat("stream me ", 3000)
	d, _ := putLayer(t, bs, content)
	rc, m, err := image.OpenImage(ctx, bs, d)
	must(t, err)
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != content || m.Size != int64(len(content)) {
		t.Fatalf("OpenImage: %d bytes, %v", len(got), err)
	}
	mm, _ := image.ReadManifest(ctx, bs, d)
	rc, _, err = image.OpenImage(ctx, &swapStore{Store: bs, digest: mm.Chunks[3].Digest, content: "evil"}, d)
	must(t, err)
	if _, err := io.ReadAll(rc); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("OpenImage over a substituted chunk: %v, want ErrInvalid", err)
	}
}
