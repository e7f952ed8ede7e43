// Package blobtest is the conformance suite every blob.Store passes (the
// directory store, later S3). A new implementation is done when Run passes
// against it.
package blobtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand"
	"strings"
	"sync"
	"testing"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Run runs the suite. newStore returns an empty store for one subtest.
// Stores that implement blob.RangeReader are checked through it.
func Run(t *testing.T, newStore func(t *testing.T) blob.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s blob.Store)
	}{
		{"PutOpen", testPutOpen},
		{"Empty", testEmpty},
		{"Large", testLarge},
		{"PutTwice", testPutTwice},
		{"Missing", testMissing},
		{"Delete", testDelete},
		{"List", testList},
		{"InvalidDigests", testInvalidDigests},
		{"FailedPutLeavesNothing", testFailedPut},
		{"PartialPutInvisible", testPartialPutInvisible},
		{"CanceledPut", testCanceledPut},
		{"PutExpected", testPutExpected},
		{"ConcurrentPuts", testConcurrentPuts},
		{"Range", testRange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore(t)) })
	}
}

func mustPut(t *testing.T, s blob.Store, content []byte) string {
	t.Helper()
	d, size, err := s.Put(context.Background(), bytes.NewReader(content))
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if want := blob.FromBytes(content); d != want || size != int64(len(content)) {
		t.Fatalf("Put: got %s (%d bytes), want %s (%d bytes)", d, size, want, len(content))
	}
	return d
}

func read(t *testing.T, s blob.Store, digest string) []byte {
	t.Helper()
	rc, err := s.Open(context.Background(), digest)
	if err != nil {
		t.Fatalf("Open(%s): %v", digest, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", digest, err)
	}
	return b
}

func list(t *testing.T, s blob.Store) []string {
	t.Helper()
	l, err := s.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return l
}

func wantKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got error %v, want %v", what, err, kind)
	}
}

func testPutOpen(t *testing.T, s blob.Store) {
	content := []byte("hello, warren")
	d := mustPut(t, s, content)
	if got := read(t, s, d); !bytes.Equal(got, content) {
		t.Fatalf("Open: got %q, want %q", got, content)
	}
	size, err := s.Stat(context.Background(), d)
	if err != nil || size != int64(len(content)) {
		t.Fatalf("Stat: got %d, %v; want %d", size, err, len(content))
	}
}

func testEmpty(t *testing.T, s blob.Store) {
	d := mustPut(t, s, nil)
	if got := read(t, s, d); len(got) != 0 {
		t.Fatalf("Open empty blob: got %d bytes", len(got))
	}
}

func testLarge(t *testing.T, s blob.Store) {
	content := make([]byte, 3<<20+17)
	rand.New(rand.NewSource(1)).Read(content)
	d := mustPut(t, s, content)
	if got := read(t, s, d); !bytes.Equal(got, content) {
		t.Fatalf("Open large blob: content differs (%d bytes, want %d)", len(got), len(content))
	}
}

func testPutTwice(t *testing.T, s blob.Store) {
	d1 := mustPut(t, s, []byte("same"))
	d2 := mustPut(t, s, []byte("same"))
	if d1 != d2 {
		t.Fatalf("digests differ: %s, %s", d1, d2)
	}
	if l := list(t, s); len(l) != 1 {
		t.Fatalf("List: got %v, want one blob", l)
	}
}

func testMissing(t *testing.T, s blob.Store) {
	ctx := context.Background()
	d := blob.FromBytes([]byte("never stored"))
	_, err := s.Open(ctx, d)
	wantKind(t, "Open missing", err, errdefs.ErrNotFound)
	_, err = s.Stat(ctx, d)
	wantKind(t, "Stat missing", err, errdefs.ErrNotFound)
}

func testDelete(t *testing.T, s blob.Store) {
	ctx := context.Background()
	d := mustPut(t, s, []byte("doomed"))
	if err := s.Delete(ctx, d); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	_, err := s.Stat(ctx, d)
	wantKind(t, "Stat after Delete", err, errdefs.ErrNotFound)
	if err := s.Delete(ctx, d); err != nil {
		t.Fatalf("Delete absent: %v", err)
	}
	if l := list(t, s); len(l) != 0 {
		t.Fatalf("List after Delete: got %v, want none", l)
	}
	mustPut(t, s, []byte("doomed")) // and it can come back
}

func testList(t *testing.T, s blob.Store) {
	if l := list(t, s); len(l) != 0 {
		t.Fatalf("List empty store: got %v", l)
	}
	var want []string
	for _, c := range []string{"a", "b", "c", "d", "e"} {
		want = append(want, mustPut(t, s, []byte(c)))
	}
	got := list(t, s)
	if len(got) != len(want) {
		t.Fatalf("List: got %v, want %d digests", got, len(want))
	}
	for i := range got {
		if i > 0 && got[i-1] >= got[i] {
			t.Fatalf("List not sorted: %v", got)
		}
	}
	seen := map[string]bool{}
	for _, d := range got {
		seen[d] = true
	}
	for _, d := range want {
		if !seen[d] {
			t.Fatalf("List: %s missing from %v", d, got)
		}
	}
}

func testInvalidDigests(t *testing.T, s blob.Store) {
	ctx := context.Background()
	hex := strings.Repeat("a", 64)
	for _, d := range []string{
		"",
		"sha256:",
		hex,
		"sha256:" + strings.ToUpper(hex),
		"sha512:" + hex,
		"sha256:" + hex[:63],
		"sha256:" + hex + "a",
		"sha256:../../../../etc/passwd" + strings.Repeat("a", 64-len("../../../../etc/passwd")),
		"sha256:" + hex[:62] + "/a",
	} {
		_, err := s.Open(ctx, d)
		wantKind(t, "Open("+d+")", err, errdefs.ErrInvalid)
		_, err = s.Stat(ctx, d)
		wantKind(t, "Stat("+d+")", err, errdefs.ErrInvalid)
		wantKind(t, "Delete("+d+")", s.Delete(ctx, d), errdefs.ErrInvalid)
	}
}

// failingReader yields some content, then an error.
type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("source broke")
	}
	n := min(len(p), f.n)
	f.n -= n
	return n, nil
}

func testFailedPut(t *testing.T, s blob.Store) {
	if _, _, err := s.Put(context.Background(), &failingReader{n: 1 << 20}); err == nil {
		t.Fatal("Put from a failing reader: got nil error")
	}
	if l := list(t, s); len(l) != 0 {
		t.Fatalf("List after failed Put: got %v, want none", l)
	}
}

// testPartialPutInvisible checks that a blob being written is not listed
// before its Put returns.
func testPartialPutInvisible(t *testing.T, s blob.Store) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, _, err := s.Put(context.Background(), pr)
		done <- err
	}()
	if _, err := pw.Write(bytes.Repeat([]byte("x"), 64<<10)); err != nil {
		t.Fatal(err)
	}
	if l := list(t, s); len(l) != 0 {
		t.Fatalf("List during Put: got %v, want none", l)
	}
	pw.CloseWithError(errors.New("writer gave up"))
	if err := <-done; err == nil {
		t.Fatal("Put of an aborted stream: got nil error")
	}
	if l := list(t, s); len(l) != 0 {
		t.Fatalf("List after aborted Put: got %v, want none", l)
	}
}

func testCanceledPut(t *testing.T, s blob.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := s.Put(ctx, strings.NewReader("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with canceled ctx: got %v, want context.Canceled", err)
	}
	if l := list(t, s); len(l) != 0 {
		t.Fatalf("List after canceled Put: got %v, want none", l)
	}
}

// unreadable fails the test if read: PutExpected must not read content
// that is already stored.
type unreadable struct{ t *testing.T }

func (u unreadable) Read([]byte) (int, error) {
	u.t.Error("PutExpected read content that was already stored")
	return 0, io.EOF
}

func testPutExpected(t *testing.T, s blob.Store) {
	ctx := context.Background()
	content := []byte("expected content")
	want := blob.FromBytes(content)

	_, err := blob.PutExpected(ctx, s, want, strings.NewReader("substituted content"))
	wantKind(t, "PutExpected(wrong content)", err, errdefs.ErrInvalid)
	if l := list(t, s); len(l) != 0 {
		t.Fatalf("List after mismatched PutExpected: got %v, want none", l)
	}
	_, err = blob.PutExpected(ctx, s, "sha256:nope", bytes.NewReader(content))
	wantKind(t, "PutExpected(bad digest)", err, errdefs.ErrInvalid)

	size, err := blob.PutExpected(ctx, s, want, bytes.NewReader(content))
	if err != nil || size != int64(len(content)) {
		t.Fatalf("PutExpected: got %d, %v; want %d", size, err, len(content))
	}
	if got := read(t, s, want); !bytes.Equal(got, content) {
		t.Fatalf("Open: got %q, want %q", got, content)
	}
	if _, err := blob.PutExpected(ctx, s, want, unreadable{t}); err != nil {
		t.Fatalf("PutExpected(present): %v", err)
	}
}

func testConcurrentPuts(t *testing.T, s blob.Store) {
	content := bytes.Repeat([]byte("concurrent "), 10000)
	want := blob.FromBytes(content)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, _, err := s.Put(context.Background(), bytes.NewReader(content))
			if err == nil && d != want {
				err = errors.New("wrong digest " + d)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Put: %v", err)
	}
	if got := read(t, s, want); !bytes.Equal(got, content) {
		t.Fatal("content differs after concurrent Puts")
	}
}
