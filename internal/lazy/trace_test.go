package lazy_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/lazy"
	"github.com/warrenhq/warren/internal/testutil"
)

// pieces are the offsets and sizes of the pieces l is served in.
func (l *layer) pieces() (offs, sizes []int64) {
	var off int64
	for _, c := range l.chunks {
		if l.blockSize == 0 {
			offs, sizes = append(offs, off), append(sizes, c.Size)
		} else {
			for b := int64(0); b < c.Size; b += l.blockSize {
				offs, sizes = append(offs, off+b), append(sizes, min(l.blockSize, c.Size-b))
			}
		}
		off += c.Size
	}
	return offs, sizes
}

func (l *layer) lazy(trace string) lazy.Layer {
	return lazy.Layer{Digest: l.digest, Size: int64(len(l.image)), BlockSize: l.blockSize, Chunks: l.chunks, Trace: trace}
}

// readPieces reads a byte in the middle of each piece of path at
// indices, in order, with no readahead by the kernel.
func readPieces(t *testing.T, l *layer, path string, indices ...int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM)
	offs, sizes := l.pieces()
	for _, i := range indices {
		off := offs[i] + sizes[i]/2
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, off); err != nil && err != io.EOF || b[0] != l.image[off] {
			t.Fatalf("read piece %d at %d: %v", i, off, err)
		}
	}
}

// mountWith mounts a filesystem of its own over a new cache of store.
func mountWith(t *testing.T, store blob.Store, opts ...lazy.MountOption) *env {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.Unavailable(t, "needs /dev/fuse: %v", err)
	}
	e := &env{store: &flaky{Store: store}}
	var err error
	if e.cache, err = lazy.OpenCache(t.TempDir(), e.store, 1<<30); err != nil {
		t.Fatal(err)
	}
	if e.fs, err = lazy.Mount(t.TempDir(), e.cache, opts...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.fs.Close() })
	return e
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
	}
}

// TestTraceRecordReplay: a layer read in a known order yields a trace
// of that order once its window closes (the first read of each piece
// only, none recorded for a layer added with a trace); a new cache and
// filesystem given the trace fetch those pieces with no read, counted
// as prefetched, and the reads then find them all.
func TestTraceRecordReplay(t *testing.T) { modes(t, testTraceRecordReplay) }

func testTraceRecordReplay(t *testing.T, blockSize int64) {
	store := newStore(t)
	l := newLayer(t, store, 5, 8)
	l.blockSize = blockSize
	e := mountWith(t, store, lazy.WithTraceWindow(300*time.Millisecond))
	path, err := e.fs.Add(l.lazy(""))
	if err != nil {
		t.Fatal(err)
	}
	offs, sizes := l.pieces()
	last := len(offs) - 1
	order := []int{last / 2, 1, last, last / 2, 3, 1}
	readPieces(t, l, path, order...)
	if got := e.fs.Traces(); len(got) != 0 {
		t.Fatalf("a trace before its window closed: %+v", got)
	}
	var traces []lazy.Trace
	waitFor(t, "the trace is ready", func() bool { traces = e.fs.Traces(); return len(traces) > 0 })
	want := lazy.Trace{Schema: lazy.TraceSchema, Layer: l.digest, BlockSize: blockSize, Pieces: []int{last / 2, 1, last, 3}}
	if len(traces) != 1 || !reflect.DeepEqual(traces[0], want) {
		t.Fatalf("traces %+v, want %+v", traces, want)
	}
	readPieces(t, l, path, 5) // after the window: not recorded
	time.Sleep(400 * time.Millisecond)
	if got := e.fs.Traces(); len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Errorf("traces after more reads: %+v, want only %+v", got, want)
	}
	e.fs.AckTrace(l.digest)
	if got := e.fs.Traces(); len(got) != 0 {
		t.Errorf("traces after the ack: %+v", got)
	}

	enc, err := traces[0].Encode()
	if err != nil {
		t.Fatal(err)
	}
	if back, err := lazy.DecodeTrace(enc); err != nil || !reflect.DeepEqual(back, want) {
		t.Fatalf("decode of the encoded trace: %+v, %v", back, err)
	}
	digest, _, err := store.Put(context.Background(), bytes.NewReader(enc))
	if err != nil {
		t.Fatal(err)
	}

	// Another node: a new cache, given the trace.
	o := mountWith(t, store, lazy.WithTraceWindow(300*time.Millisecond))
	path, err = o.fs.Add(l.lazy(digest))
	if err != nil {
		t.Fatal(err)
	}
	var wantBytes int64
	for _, i := range want.Pieces {
		wantBytes += sizes[i]
	}
	waitFor(t, "the trace's pieces are prefetched", func() bool { return o.cache.Stats().Prefetched >= wantBytes })
	st := o.fs.Stats()
	if st.Prefetched != wantBytes || st.Fetched != wantBytes || st.Hits+st.Misses != 0 {
		t.Errorf("after the replay: %+v; want %d bytes prefetched, no read", st.Counts, wantBytes)
	}
	if len(st.Layers) != 1 || st.Layers[0].Prefetched != wantBytes {
		t.Errorf("the layer's share: %+v, want %d bytes prefetched", st.Layers, wantBytes)
	}
	readPieces(t, l, path, order...)
	if st := o.fs.Stats(); st.Misses != 0 || st.Hits < int64(len(want.Pieces)) || st.Fetched != wantBytes {
		t.Errorf("the traced reads after the replay: %+v; want %d hits or more, no miss, nothing more fetched", st.Counts, len(want.Pieces))
	}
	// A layer added with a trace is not traced again.
	time.Sleep(500 * time.Millisecond)
	if got := o.fs.Traces(); len(got) != 0 {
		t.Errorf("a layer added with a trace recorded one: %+v", got)
	}
}

// TestTraceBad: traces that are not what they claim, not traces, or do
// not fit the layer are ignored: the add succeeds, nothing is
// prefetched, and reads work.
func TestTraceBad(t *testing.T) {
	store := newStore(t)
	l := newLayer(t, store, 6, 4)
	l.blockSize = testBlock
	offs, _ := l.pieces()
	put := func(b []byte) string {
		d, _, err := store.Put(context.Background(), bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	enc := func(tr lazy.Trace) []byte {
		b, err := tr.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := lazy.Trace{Layer: l.digest, BlockSize: testBlock, Pieces: []int{0, 1, 2}}
	other := good
	other.Layer = blob.FromBytes([]byte("another layer"))
	outside := good
	outside.Pieces = []int{0, len(offs)}
	block := good
	block.BlockSize = 0
	for name, trace := range map[string]string{
		"missing blob":       blob.FromBytes(enc(good)),
		"not a trace":        l.chunks[0].Digest,
		"another layer":      put(enc(other)),
		"past the layer":     put(enc(outside)),
		"another block size": put(enc(block)),
		"another schema":     put(bytes.Replace(enc(good), []byte(lazy.TraceSchema), []byte("warren.trace.v0"), 1)),
		"malformed digest":   "sha256:zz",
	} {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			e := mountWith(t, store)
			path, err := e.fs.Add(l.lazy(trace))
			if err != nil {
				t.Fatalf("add with a bad trace: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
			if st := e.cache.Stats(); st.Prefetched != 0 || st.Fetched != 0 {
				t.Errorf("a bad trace prefetched: %+v", st.Counts)
			}
			readPieces(t, l, path, 0, 3)
		})
	}
}

// TestDecodeTrace: what a trace blob must be.
func TestDecodeTrace(t *testing.T) {
	d := blob.FromBytes([]byte("a layer"))
	for _, tc := range []struct {
		name, blob string
		ok         bool
	}{
		{"good", `{"schema":"warren.trace.v1","layer":"` + d + `","block_size":65536,"pieces":[3,1,2]}`, true},
		{"whole chunks", `{"schema":"warren.trace.v1","layer":"` + d + `","block_size":0,"pieces":[0]}`, true},
		{"no schema", `{"layer":"` + d + `","block_size":65536,"pieces":[3]}`, false},
		{"no pieces", `{"schema":"warren.trace.v1","layer":"` + d + `","block_size":65536,"pieces":[]}`, false},
		{"negative", `{"schema":"warren.trace.v1","layer":"` + d + `","block_size":65536,"pieces":[-1]}`, false},
		{"twice", `{"schema":"warren.trace.v1","layer":"` + d + `","block_size":65536,"pieces":[1,2,1]}`, false},
		{"bad layer", `{"schema":"warren.trace.v1","layer":"sha256:x","block_size":65536,"pieces":[1]}`, false},
		{"bad block size", `{"schema":"warren.trace.v1","layer":"` + d + `","block_size":-5,"pieces":[1]}`, false},
		{"unknown field", `{"schema":"warren.trace.v1","layer":"` + d + `","block_size":0,"pieces":[1],"x":1}`, false},
		{"not json", `pieces`, false},
		{"too many", `{"schema":"warren.trace.v1","layer":"` + d + `","block_size":0,"pieces":[` + strings.Repeat("1,", 9000) + `1]}`, false},
		{"too big", strings.Repeat(" ", lazy.MaxTraceBytes+1), false},
	} {
		_, err := lazy.DecodeTrace([]byte(tc.blob))
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v; want ok=%v (or ErrInvalid)", tc.name, err, tc.ok)
		}
	}
}

// FuzzDecodeTrace: whatever a trace blob holds, decoding it never
// panics, and what it accepts fits its bounds and encodes back to a blob
// that decodes the same.
func FuzzDecodeTrace(f *testing.F) {
	d := blob.FromBytes([]byte("a layer"))
	f.Add([]byte(`{"schema":"warren.trace.v1","layer":"` + d + `","block_size":65536,"pieces":[3,1,2]}`))
	f.Add([]byte(`{"schema":"warren.trace.v1","layer":"` + d + `","block_size":0,"pieces":[0]}`))
	f.Add([]byte(`{"schema":"warren.trace.v1","pieces":[1e9,-1]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := lazy.DecodeTrace(b)
		if err != nil {
			return
		}
		if len(tr.Pieces) == 0 || len(tr.Pieces) > 8192 || tr.BlockSize < 0 {
			t.Fatalf("accepted %+v", tr)
		}
		enc, err := tr.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if back, err := lazy.DecodeTrace(enc); err != nil || !reflect.DeepEqual(back, tr) {
			t.Fatalf("re-encoded: %+v, %v; want %+v", back, err, tr)
		}
	})
}
