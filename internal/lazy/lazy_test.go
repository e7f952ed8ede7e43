package lazy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/lazy"
	"github.com/warrenhq/warren/internal/testutil"
)

// layer is an EROFS image built from a tree of random files, cut into
// chunks in a blob store.
type layer struct {
	src, file string
	image     []byte
	digest    string // a stand-in manifest digest
	chunks    []lazy.Chunk
	// blockSize is the block size the layer is served with (its chunks
	// list 64 KiB blocks): 0 serves it a whole chunk at a time.
	blockSize int64
}

// testBlock is the block size of the test layers' block lists.
const testBlock = 64 << 10

// modes runs test once serving layers a whole chunk at a time and once
// by blocks.
func modes(t *testing.T, test func(t *testing.T, blockSize int64)) {
	t.Run("chunks", func(t *testing.T) { test(t, 0) })
	t.Run("blocks", func(t *testing.T) { test(t, testBlock) })
}

// newLayer builds a layer of about mib MiB (a few large files, many small
// ones) and cuts it into chunks of irregular sizes (as the real grid is:
// at most 1 MiB, restarting at large files), stored in store.
func newLayer(t *testing.T, store blob.Store, seed uint64, mib int) *layer {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	l := &layer{src: t.TempDir(), file: filepath.Join(t.TempDir(), "layer.erofs")}
	write := func(name string, n int) {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		p := filepath.Join(l.src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < mib/2; i++ {
		write(fmt.Sprintf("big/%d.bin", i), 1<<20+r.IntN(1<<20))
	}
	for i := 0; i < 200; i++ {
		write(fmt.Sprintf("small/%02d/%d.txt", i%10, i), r.IntN(12<<10))
	}
	if err := image.BuildEROFS(context.Background(), l.src, l.file, image.WithPlainData()); err != nil {
		t.Fatal(err)
	}
	var err error
	if l.image, err = os.ReadFile(l.file); err != nil {
		t.Fatal(err)
	}
	l.digest = blob.FromBytes(append([]byte("manifest of "), l.image...))
	for off := 0; off < len(l.image); {
		n := min(len(l.image)-off, []int{1 << 20, 300 << 10, 1 << 20, 700<<10 + 4096}[len(l.chunks)%4])
		d, _, err := store.Put(context.Background(), bytes.NewReader(l.image[off:off+n]))
		if err != nil {
			t.Fatal(err)
		}
		var blocks []string
		for b := off; b < off+n; b += testBlock {
			blocks = append(blocks, blob.FromBytes(l.image[b:min(b+testBlock, off+n)]))
		}
		l.chunks = append(l.chunks, lazy.Chunk{Digest: d, Size: int64(n), Blocks: blocks})
		off += n
	}
	return l
}

// flaky is a blob store that can be made unreachable.
type flaky struct {
	blob.Store
	down  atomic.Bool
	opens atomic.Int64
}

func (f *flaky) Open(ctx context.Context, digest string) (io.ReadCloser, error) {
	f.opens.Add(1)
	if f.down.Load() {
		return nil, errors.New("blob store unreachable (test)")
	}
	return f.Store.Open(ctx, digest)
}

type env struct {
	store *flaky
	cache *lazy.Cache
	fs    *lazy.FS
}

func newEnv(t *testing.T, store blob.Store, limit int64) *env {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.Unavailable(t, "needs /dev/fuse: %v", err)
	}
	e := &env{store: &flaky{Store: store}}
	var err error
	if e.cache, err = lazy.OpenCache(t.TempDir(), e.store, limit); err != nil {
		t.Fatal(err)
	}
	if e.fs, err = lazy.Mount(t.TempDir(), e.cache); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.fs.Close(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return e
}

func (e *env) add(t *testing.T, l *layer) string {
	t.Helper()
	p, err := e.fs.Add(lazy.Layer{Digest: l.digest, Size: int64(len(l.image)), BlockSize: l.blockSize, Chunks: l.chunks})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newStore(t *testing.T) blob.Store {
	s, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReads: the lazy file reads as the image, byte for byte, whole and
// at random offsets across chunk boundaries; EROFS mounted on it shows
// the tree; reading one file fetches a small part of the image.
func TestReads(t *testing.T) { modes(t, testReads) }

func testReads(t *testing.T, blockSize int64) {
	store := newStore(t)
	l := newLayer(t, store, 1, 12)
	l.blockSize = blockSize
	e := newEnv(t, store, 1<<30)
	path := e.add(t, l)

	// One small file through EROFS first: little is fetched.
	mnt := t.TempDir()
	if err := unix.Mount(path, mnt, "erofs", unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("mount erofs on the lazy file: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	want, _ := os.ReadFile(filepath.Join(l.src, "small/03/13.txt"))
	if got, err := os.ReadFile(filepath.Join(mnt, "small/03/13.txt")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a file through EROFS on the lazy file: %d bytes, %v; want %d bytes", len(got), err, len(want))
	}
	st := e.cache.Stats()
	t.Logf("after one small file: %+v (image %d bytes, %d chunks)", st, len(l.image), len(l.chunks))
	if st.Fetched == 0 || st.Fetched > int64(len(l.image))/3 {
		t.Errorf("reading one small file fetched %d of %d bytes", st.Fetched, len(l.image))
	}
	// By blocks, a fraction of the chunks around it (the superblock,
	// the inode, the directory, the file: a few blocks of 64 KiB).
	if blockSize > 0 && st.Fetched > 8*blockSize {
		t.Errorf("reading one small file by blocks fetched %d bytes (%d fetches), want at most %d", st.Fetched, st.Fetches, 8*blockSize)
	}

	// The whole tree through EROFS.
	err := filepath.WalkDir(l.src, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(l.src, p)
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join(mnt, rel))
		if err != nil || !bytes.Equal(got, want) {
			return fmt.Errorf("%s: %d bytes, %v; want %d bytes", rel, len(got), err, len(want))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The file itself, byte for byte.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, l.image) {
		t.Fatalf("the lazy file: %d bytes, %v; want the image's %d", len(got), err, len(l.image))
	}
	r := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 300; i++ {
		off := r.Int64N(int64(len(l.image)))
		n := 1 + r.IntN(3<<20)
		buf := make([]byte, n)
		k, err := f.ReadAt(buf, off)
		if err != nil && err != io.EOF {
			t.Fatalf("read %d at %d: %v", n, off, err)
		}
		if !bytes.Equal(buf[:k], l.image[off:off+int64(k)]) || int64(k) != min(int64(n), int64(len(l.image))-off) {
			t.Fatalf("read %d at %d: %d bytes, not the image's", n, off, k)
		}
	}
	if st := e.cache.Stats(); st.Fetched > int64(len(l.image)) {
		t.Errorf("fetched %d bytes of a %d-byte image: a chunk fetched twice", st.Fetched, len(l.image))
	}
	if _, err := os.OpenFile(path, os.O_WRONLY, 0); !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EACCES) {
		t.Errorf("open for writing: %v, want EROFS", err)
	}
}

// TestFailures: a corrupt chunk and an unreachable store fail reads with
// EIO (never zeros), and reads succeed again once the store is back,
// with nothing remounted.
func TestFailures(t *testing.T) { modes(t, testFailures) }

func testFailures(t *testing.T, blockSize int64) {
	store := newStore(t)
	l := newLayer(t, store, 2, 6)
	l.blockSize = blockSize
	e := newEnv(t, store, 1<<30)
	path := e.add(t, l)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	// Chunk 1's blob holds other bytes of its size.
	bad := l.chunks[1]
	p, err := store.(*blob.Dir).Path(bad.Digest)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, 0o644)
	if err := os.WriteFile(p, make([]byte, bad.Size), 0o644); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, l.chunks[0].Size+10); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of a corrupt chunk: %v, want EIO", err)
	}
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, l.image[:4096]) {
		t.Errorf("a good chunk beside a corrupt one: %v", err)
	}

	// The store goes away: EIO after the retries; back: the same read works.
	// (The last chunk: no read so far has fetched it ahead.)
	e.store.down.Store(true)
	off := int64(len(l.image)) - 4096
	start := time.Now()
	before := e.cache.Stats().FetchLatency
	if _, err := f.ReadAt(buf, off); !errors.Is(err, syscall.EIO) {
		t.Errorf("read with the store down: %v, want EIO", err)
	}
	// The failed fetch is timed, retries and backoff (0.7 s) included.
	if h := e.cache.Stats().FetchLatency; h.Count == before.Count || slow(h) == slow(before) {
		t.Errorf("fetch latency %+v before the failed fetch, %+v after: want it counted, over 0.5 s", before, h)
	}
	t.Logf("failed after %v, %d opens", time.Since(start).Round(time.Millisecond), e.store.opens.Load())
	e.store.down.Store(false)
	if _, err := f.ReadAt(buf, off); err != nil || !bytes.Equal(buf, l.image[off:off+4096]) {
		t.Errorf("read with the store back: %v (same bytes: %v)", err, bytes.Equal(buf, l.image[off:off+4096]))
	}
	st := e.fs.Stats()
	if st.FetchErrors == 0 {
		t.Errorf("stats %+v: want the failed fetches counted", st)
	}
	if len(st.Layers) != 1 || st.Layers[0].FetchErrors != st.FetchErrors {
		t.Errorf("stats %+v: want the layer that read charged with every failed fetch", st)
	}
}

// slow is how many observations of h took over 0.5 s.
func slow(h lazy.Histogram) uint64 {
	for i, b := range h.Bounds {
		if b == 0.5 {
			return h.Count - h.Counts[i]
		}
	}
	panic("no 0.5 s bucket")
}

// TestEviction: a cache far smaller than the layer, read by many readers
// at once: every byte right, the cache within its limit, chunks evicted
// and fetched again.
func TestEviction(t *testing.T) { modes(t, testEviction) }

func testEviction(t *testing.T, blockSize int64) {
	store := newStore(t)
	l := newLayer(t, store, 3, 10)
	l.blockSize = blockSize
	limit := int64(3 << 20)
	e := newEnv(t, store, limit)
	path := e.add(t, l)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(path)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			for i := 0; i < 60; i++ {
				off := r.Int64N(int64(len(l.image)))
				buf := make([]byte, 1+r.IntN(256<<10))
				k, err := f.ReadAt(buf, off)
				if err != nil && err != io.EOF {
					errs <- fmt.Errorf("read %d at %d: %v", len(buf), off, err)
					return
				}
				if !bytes.Equal(buf[:k], l.image[off:off+int64(k)]) {
					errs <- fmt.Errorf("read %d at %d: not the image's bytes", len(buf), off)
					return
				}
				// Past the page cache, to the FUSE server.
				unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := e.cache.Stats()
	t.Logf("stats: %+v", st)
	if st.Used > limit {
		t.Errorf("cache holds %d bytes, limit %d", st.Used, limit)
	}
	if st.Evicted == 0 {
		t.Errorf("nothing evicted from a %d-byte cache reading a %d-byte layer", limit, len(l.image))
	}
}

// TestStats: each layer is charged for its own reads (hits, misses) and
// for the fetches they cause, also of a chunk another layer shares; the
// layers' shares add up to the cache's totals; the fetch latency
// histograms count every fetch; a removed layer's share goes, and Stats
// reports a bounded number of layers, the most recently read first.
func TestStats(t *testing.T) {
	store := newStore(t)
	a := newLayer(t, store, 4, 6)
	e := newEnv(t, store, 1<<30)
	pathA := e.add(t, a)
	// b is a's first three chunks under a manifest of its own: every chunk
	// of it is shared with a.
	b := &layer{digest: blob.FromBytes([]byte("manifest of b")), chunks: a.chunks[:3]}
	var bSize int64
	for _, c := range b.chunks {
		bSize += c.Size
	}
	b.image = a.image[:bSize]
	pathB := e.add(t, b)

	layerOf := func(st lazy.Stats, digest string) lazy.LayerStats {
		t.Helper()
		for _, l := range st.Layers {
			if l.Digest == digest {
				return l
			}
		}
		t.Fatalf("stats have no layer %s: %+v", digest, st.Layers)
		return lazy.LayerStats{}
	}
	// read reads n bytes at off from path, with no readahead by the
	// kernel (only the chunks of the read are asked for).
	read := func(path string, off, n int64) {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM)
		buf := make([]byte, n)
		if k, err := f.ReadAt(buf, off); err != nil && err != io.EOF || !bytes.Equal(buf[:k], a.image[off:off+int64(k)]) {
			t.Fatalf("read %d at %d of %s: %d bytes, %v", n, off, path, k, err)
		}
	}
	// sums checks that the layers' shares add up to the totals.
	sums := func(st lazy.Stats) {
		t.Helper()
		var sum lazy.Counts
		for _, l := range st.Layers {
			sum.Hits += l.Hits
			sum.Misses += l.Misses
			sum.Fetches += l.Fetches
			sum.FetchErrors += l.FetchErrors
			sum.Fetched += l.Fetched
			sum.Written += l.Written
			sum.FetchLatency.Count += l.FetchLatency.Count
		}
		if got := st.Counts; got.Hits != sum.Hits || got.Misses != sum.Misses || got.Fetches != sum.Fetches || got.FetchErrors != sum.FetchErrors ||
			got.Fetched != sum.Fetched || got.Written != sum.Written || got.FetchLatency.Count != sum.FetchLatency.Count {
			t.Errorf("totals %+v, the layers' shares add up to %+v", got, sum)
		}
	}

	st := e.fs.Stats()
	if la, lb := layerOf(st, a.digest), layerOf(st, b.digest); la.Counts.Hits+la.Misses+lb.Hits+lb.Misses != 0 || len(la.FetchLatency.Bounds) != len(lazy.FetchBuckets) {
		t.Fatalf("before any read: %+v, %+v; want zeros and the buckets", la, lb)
	}

	// A page of a's first chunk: a miss, one fetch, its bytes written.
	read(pathA, 0, 4096)
	st = e.fs.Stats()
	la, lb := layerOf(st, a.digest), layerOf(st, b.digest)
	c0 := a.chunks[0]
	if la.Misses != 1 || la.Hits != 0 || la.Fetches != 1 || la.Fetched != c0.Size || la.Written != c0.Size || la.FetchErrors != 0 {
		t.Errorf("a after a page of its first chunk: %+v; want 1 miss, 1 fetch of %d bytes written", la.Counts, c0.Size)
	}
	if h := la.FetchLatency; h.Count != 1 || h.Counts[len(h.Counts)-1] > 1 || h.Sum <= 0 {
		t.Errorf("a's fetch latency after one fetch: %+v", h)
	}
	if lb.Hits+lb.Misses+lb.Fetches+lb.Fetched+lb.Written != 0 || lb.FetchLatency.Count != 0 {
		t.Errorf("b, not read, was charged: %+v", lb.Counts)
	}
	if st.Layers[0].Digest != a.digest {
		t.Errorf("stats list %s first, want the layer just read (a)", st.Layers[0].Digest)
	}
	sums(st)

	// The same bytes through b: the chunk a fetched is b's hit, no fetch.
	read(pathB, 0, 4096)
	st = e.fs.Stats()
	if lb := layerOf(st, b.digest); lb.Hits != 1 || lb.Misses != 0 || lb.Fetches != 0 || lb.Fetched != 0 || lb.Written != 0 {
		t.Errorf("b reading a chunk a fetched: %+v; want 1 hit and nothing fetched", lb.Counts)
	}
	if got := layerOf(st, a.digest); got.Counts.Hits != la.Hits || got.Fetches != la.Fetches {
		t.Errorf("a was charged for b's read: %+v, was %+v", got.Counts, la.Counts)
	}
	if st.Layers[0].Digest != b.digest {
		t.Errorf("stats list %s first, want the layer just read (b)", st.Layers[0].Digest)
	}
	sums(st)

	// b's third chunk, which nobody read: b fetches it, a is not charged.
	c2 := b.chunks[2]
	read(pathB, b.chunks[0].Size+b.chunks[1].Size, 4096)
	st = e.fs.Stats()
	if lb := layerOf(st, b.digest); lb.Misses != 1 || lb.Fetches != 1 || lb.Fetched != c2.Size || lb.Written != c2.Size || lb.FetchLatency.Count != 1 {
		t.Errorf("b after fetching a chunk of its own: %+v; want 1 miss, 1 fetch of %d bytes", lb.Counts, c2.Size)
	}

	// All of a: every chunk fetched once, once only; the latency
	// histograms count every fetch, their buckets cumulative.
	if got, err := os.ReadFile(pathA); err != nil || !bytes.Equal(got, a.image) {
		t.Fatalf("read a whole: %d bytes, %v", len(got), err)
	}
	st = e.fs.Stats()
	la, lb = layerOf(st, a.digest), layerOf(st, b.digest)
	if la.Fetched+lb.Fetched != int64(len(a.image)) || st.Fetched != int64(len(a.image)) || st.Written != st.Fetched {
		t.Errorf("after reading a whole: a fetched %d, b %d, all %d, written %d; want the image's %d bytes, once",
			la.Fetched, lb.Fetched, st.Fetched, st.Written, len(a.image))
	}
	if la.Fetches != int64(len(a.chunks))-1 || lb.Fetches != 1 {
		t.Errorf("fetches: a %d, b %d; want %d and 1 (b fetched one of a's %d chunks)", la.Fetches, lb.Fetches, len(a.chunks)-1, len(a.chunks))
	}
	for _, h := range []lazy.Histogram{st.FetchLatency, la.FetchLatency, lb.FetchLatency} {
		for i := 1; i < len(h.Counts); i++ {
			if h.Counts[i] < h.Counts[i-1] {
				t.Errorf("histogram %+v: buckets not cumulative", h)
			}
		}
		if h.Counts[len(h.Counts)-1] > h.Count || h.Sum <= 0 {
			t.Errorf("histogram %+v: count or sum wrong", h)
		}
	}
	if h := st.FetchLatency; h.Count != uint64(st.Fetches) || la.FetchLatency.Count != uint64(la.Fetches) {
		t.Errorf("fetch latency counts %d (a: %d), want one per fetch: %d (a: %d)", h.Count, la.FetchLatency.Count, st.Fetches, la.Fetches)
	}
	if st.FetchTime.Seconds() != st.FetchLatency.Sum {
		t.Errorf("fetch time %v, the histogram's sum %vs", st.FetchTime, st.FetchLatency.Sum)
	}
	sums(st)

	// A removed layer's share goes; the totals stay.
	e.fs.Remove(b.digest)
	st = e.fs.Stats()
	for _, l := range st.Layers {
		if l.Digest == b.digest {
			t.Errorf("stats still have removed layer b: %+v", l)
		}
	}
	if st.Fetched != int64(len(a.image)) {
		t.Errorf("totals lost a removed layer's fetches: %d bytes fetched, want %d", st.Fetched, len(a.image))
	}
	// Plain data: it goes over the wire as it is.
	var back lazy.Stats
	if b, err := json.Marshal(st); err != nil || json.Unmarshal(b, &back) != nil || !reflect.DeepEqual(back, st) {
		t.Errorf("stats through JSON: %+v, %v; want %+v", back, err, st)
	}

	// Many layers: Stats reports a bounded number, the read one first.
	for i := range lazy.MaxLayerStats + 10 {
		d := blob.FromBytes(fmt.Appendf(nil, "manifest %d", i))
		if _, err := e.fs.Add(lazy.Layer{Digest: d, Size: a.chunks[0].Size, Chunks: a.chunks[:1]}); err != nil {
			t.Fatal(err)
		}
	}
	read(pathA, 0, 4096)
	st = e.fs.Stats()
	if len(st.Layers) != lazy.MaxLayerStats || st.Layers[0].Digest != a.digest {
		t.Errorf("%d layers on the filesystem: stats report %d, first %s; want %d, first a (%s)",
			lazy.MaxLayerStats+11, len(st.Layers), st.Layers[0].Digest, lazy.MaxLayerStats, a.digest)
	}
}

// TestStoreDownHammer: what an agent inside a sandbox might try while the
// store is down: many readers at once, at random offsets, over and over.
// Every read fails with EIO (never zeros, never a hang past the retries),
// each piece is asked of the store a bounded number of times however many
// readers want it, and once the store is back every read is right.
func TestStoreDownHammer(t *testing.T) {
	store := newStore(t)
	l := newLayer(t, store, 5, 4)
	l.blockSize = testBlock
	e := newEnv(t, store, 1<<30)
	path := e.add(t, l)
	e.store.down.Store(true)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	deadline := time.Now().Add(2 * time.Second)
	var reads atomic.Int64
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(path)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			r := rand.New(rand.NewPCG(uint64(g), 11))
			buf := make([]byte, 8192)
			for time.Now().Before(deadline) {
				off := r.Int64N(int64(len(l.image)) - int64(len(buf)))
				start := time.Now()
				_, err := f.ReadAt(buf, off)
				reads.Add(1)
				if !errors.Is(err, syscall.EIO) {
					errs <- fmt.Errorf("read at %d with the store down: %v, want EIO", off, err)
					return
				}
				if d := time.Since(start); d > 5*time.Second {
					errs <- fmt.Errorf("read at %d took %v to fail", off, d)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	pieces := int64(0)
	for _, c := range l.chunks {
		pieces += int64(len(c.Blocks))
	}
	opens := e.store.opens.Load()
	t.Logf("%d reads, %d store opens, %d pieces", reads.Load(), opens, pieces)
	// A failed fetch tries 4 times; concurrent readers of a piece share
	// its fetch. A read of 8 KiB spans at most 2 blocks, and the kernel
	// may send it twice (its readahead, then the read itself): at most
	// 4 x 2 x 2 opens per read, whatever the number of readers.
	if opens > reads.Load()*16 {
		t.Errorf("%d store opens for %d reads: fetches not shared", opens, reads.Load())
	}
	e.store.down.Store(false)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, l.image) {
		t.Fatalf("with the store back: %d bytes, %v; want the image", len(got), err)
	}
}

// TestReadaheadWithinFile: a large file read whole through EROFS, with
// the layer's extents known, fetches the file and the metadata around
// it, not the readahead window's worth of the next file.
func TestReadaheadWithinFile(t *testing.T) {
	store := newStore(t)
	l := newLayer(t, store, 6, 8)
	l.blockSize = testBlock
	var ext [][2]int64
	var names []string
	for i := 0; i < 4; i++ {
		b, err := os.ReadFile(filepath.Join(l.src, fmt.Sprintf("big/%d.bin", i)))
		if err != nil {
			t.Fatal(err)
		}
		off := bytes.Index(l.image, b[:4096])
		if off < 0 || !bytes.Equal(l.image[off:off+len(b)], b) {
			t.Fatalf("big/%d.bin is not contiguous in the image", i)
		}
		ext = append(ext, [2]int64{int64(off), int64(len(b))})
		names = append(names, fmt.Sprintf("big/%d.bin", i))
	}
	// In image order; the files read are the 1st and 3rd, so that what
	// follows each is a file not read.
	idx := []int{0, 1, 2, 3}
	sort.Slice(idx, func(i, j int) bool { return ext[idx[i]][0] < ext[idx[j]][0] })
	names = []string{names[idx[0]], names[idx[2]]}
	sort.Slice(ext, func(i, j int) bool { return ext[i][0] < ext[j][0] })
	e := newEnv(t, store, 1<<30)
	p, err := e.fs.Add(lazy.Layer{Digest: l.digest, Size: int64(len(l.image)), BlockSize: l.blockSize, Chunks: l.chunks, Extents: ext})
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if err := unix.Mount(p, mnt, "erofs", unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("mount erofs on the lazy file: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	before := e.cache.Stats().Fetched
	var read int64
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		read += int64(len(b))
	}
	time.Sleep(200 * time.Millisecond) // background readahead lands
	fetched := e.cache.Stats().Fetched - before
	t.Logf("read %d bytes of 2 files, fetched %d", read, fetched)
	// Beyond the files' bytes: the blocks holding their ends (and the
	// next file's first bytes) and EROFS's metadata. The kernel's
	// readahead on a FUSE file read through its page cache fetched
	// 128 KiB more past each file's end (6 blocks in all here).
	if fetched-read > 5*testBlock {
		t.Errorf("read %d bytes of 2 files, fetched %d: over 5 blocks more", read, fetched)
	}
	// Ours, unbounded, would go on 512 KiB into the next file. The
	// blocks 64 and 448 KiB past the end must not have been fetched.
	cached := func(off int64) bool {
		var base int64
		for _, c := range l.chunks {
			if off < base+c.Size {
				return e.cache.Has(c.Blocks[(off-base)/testBlock])
			}
			base += c.Size
		}
		return false
	}
	for _, x := range []int{0, 2} {
		end := ext[x][0] + ext[x][1]
		for _, past := range []int64{testBlock, 448 << 10} {
			if probe := end + past; probe < ext[x+1][0]+ext[x+1][1] && cached(probe) {
				t.Errorf("file at %v read whole: the block %d KiB past its end was fetched (readahead into the next file)", ext[x], past>>10)
			}
		}
	}
}
