package lazy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
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
		l.chunks = append(l.chunks, lazy.Chunk{Digest: d, Size: int64(n)})
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
	p, err := e.fs.Add(l.digest, int64(len(l.image)), l.chunks)
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
func TestReads(t *testing.T) {
	store := newStore(t)
	l := newLayer(t, store, 1, 12)
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
func TestFailures(t *testing.T) {
	store := newStore(t)
	l := newLayer(t, store, 2, 6)
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
	if _, err := f.ReadAt(buf, off); !errors.Is(err, syscall.EIO) {
		t.Errorf("read with the store down: %v, want EIO", err)
	}
	t.Logf("failed after %v, %d opens", time.Since(start).Round(time.Millisecond), e.store.opens.Load())
	e.store.down.Store(false)
	if _, err := f.ReadAt(buf, off); err != nil || !bytes.Equal(buf, l.image[off:off+4096]) {
		t.Errorf("read with the store back: %v (same bytes: %v)", err, bytes.Equal(buf, l.image[off:off+4096]))
	}
	if st := e.cache.Stats(); st.FetchErrors == 0 {
		t.Errorf("stats %+v: want the failed fetches counted", st)
	}
}

// TestEviction: a cache far smaller than the layer, read by many readers
// at once: every byte right, the cache within its limit, chunks evicted
// and fetched again.
func TestEviction(t *testing.T) {
	store := newStore(t)
	l := newLayer(t, store, 3, 10)
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
