// Package storetest is the conformance suite every store.Store passes:
// Memory in unit tests, and etcd (embedded) in integration tests. A new
// implementation is done when Run passes against it. Stores that are also a
// store.Watcher pass its cases too (watches and leases); the others skip
// them.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

// Run runs the suite. newStore returns an empty store for one subtest; the
// suite closes it.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"GetMissing", testGetMissing},
		{"PutGet", testPutGet},
		{"PutBumpsVersion", testPutBumpsVersion},
		{"EmptyValue", testEmptyValue},
		{"Create", testCreate},
		{"CompareAndPut", testCompareAndPut},
		{"Delete", testDelete},
		{"DeleteThenCreate", testDeleteThenCreate},
		{"List", testList},
		{"ValuesAreCopies", testValuesAreCopies},
		{"InvalidKeys", testInvalidKeys},
		{"CanceledContext", testCanceledContext},
		{"ConcurrentCompareAndPut", testConcurrentCompareAndPut},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tt.fn(t, s)
		})
	}
	runWatcher(t, newStore)
}

func mustPut(t *testing.T, s store.Store, key, value string) {
	t.Helper()
	if err := s.Put(context.Background(), key, []byte(value)); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

func mustGet(t *testing.T, s store.Store, key string) store.KV {
	t.Helper()
	kv, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return kv
}

func wantKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got error %v, want %v", what, err, kind)
	}
}

func testGetMissing(t *testing.T, s store.Store) {
	_, err := s.Get(context.Background(), "/missing")
	wantKind(t, "Get missing", err, errdefs.ErrNotFound)
}

func testPutGet(t *testing.T, s store.Store) {
	mustPut(t, s, "/a/b", "hello")
	kv := mustGet(t, s, "/a/b")
	if kv.Key != "/a/b" || string(kv.Value) != "hello" {
		t.Fatalf("Get: got %q=%q, want /a/b=hello", kv.Key, kv.Value)
	}
	if kv.Version <= 0 {
		t.Fatalf("Get: got version %d, want > 0", kv.Version)
	}
}

func testPutBumpsVersion(t *testing.T, s store.Store) {
	mustPut(t, s, "/k", "1")
	v1 := mustGet(t, s, "/k").Version
	mustPut(t, s, "/other", "x") // versions are store-wide revisions
	mustPut(t, s, "/k", "1")     // same value: still a write
	v2 := mustGet(t, s, "/k").Version
	if v2 <= v1 {
		t.Fatalf("version after rewrite: got %d, want > %d", v2, v1)
	}
}

func testEmptyValue(t *testing.T, s store.Store) {
	mustPut(t, s, "/empty", "")
	if kv := mustGet(t, s, "/empty"); len(kv.Value) != 0 {
		t.Fatalf("Get: got %q, want empty", kv.Value)
	}
}

func testCreate(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.Create(ctx, "/c", []byte("first")); err != nil {
		t.Fatalf("Create: %v", err)
	}
	err := s.Create(ctx, "/c", []byte("second"))
	wantKind(t, "Create existing", err, errdefs.ErrConflict)
	if kv := mustGet(t, s, "/c"); string(kv.Value) != "first" {
		t.Fatalf("after failed Create: got %q, want first", kv.Value)
	}
}

func testCompareAndPut(t *testing.T, s store.Store) {
	ctx := context.Background()
	wantKind(t, "CompareAndPut(version 5) on absent key",
		s.CompareAndPut(ctx, "/cas", []byte("x"), 5), errdefs.ErrConflict)
	if err := s.CompareAndPut(ctx, "/cas", []byte("v1"), 0); err != nil {
		t.Fatalf("CompareAndPut(0) on absent key: %v", err)
	}
	kv := mustGet(t, s, "/cas")
	wantKind(t, "CompareAndPut(0) on present key",
		s.CompareAndPut(ctx, "/cas", []byte("x"), 0), errdefs.ErrConflict)
	if err := s.CompareAndPut(ctx, "/cas", []byte("v2"), kv.Version); err != nil {
		t.Fatalf("CompareAndPut(current): %v", err)
	}
	wantKind(t, "CompareAndPut(stale)",
		s.CompareAndPut(ctx, "/cas", []byte("v3"), kv.Version), errdefs.ErrConflict)
	if got := mustGet(t, s, "/cas"); string(got.Value) != "v2" || got.Version <= kv.Version {
		t.Fatalf("after CAS: got %q@%d, want v2@>%d", got.Value, got.Version, kv.Version)
	}
	wantKind(t, "CompareAndPut(negative)",
		s.CompareAndPut(ctx, "/cas", []byte("x"), -1), errdefs.ErrInvalid)
}

func testDelete(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.Delete(ctx, "/never"); err != nil {
		t.Fatalf("Delete absent: %v", err)
	}
	mustPut(t, s, "/d", "x")
	if err := s.Delete(ctx, "/d"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	_, err := s.Get(ctx, "/d")
	wantKind(t, "Get after Delete", err, errdefs.ErrNotFound)
}

func testDeleteThenCreate(t *testing.T, s store.Store) {
	ctx := context.Background()
	mustPut(t, s, "/r", "old")
	old := mustGet(t, s, "/r").Version
	if err := s.Delete(ctx, "/r"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := s.Create(ctx, "/r", []byte("new")); err != nil {
		t.Fatalf("Create after Delete: %v", err)
	}
	// A version seen before the delete must not match the new key.
	wantKind(t, "CompareAndPut(pre-delete version)",
		s.CompareAndPut(ctx, "/r", []byte("x"), old), errdefs.ErrConflict)
}

func testList(t *testing.T, s store.Store) {
	ctx := context.Background()
	got, err := s.List(ctx, "/images/")
	if err != nil || len(got) != 0 {
		t.Fatalf("List empty: got %v, %v; want none", got, err)
	}
	for _, k := range []string{"/images/z", "/images/a", "/images/m/n", "/imagesX", "/nodes/1"} {
		mustPut(t, s, k, "v"+k)
	}
	got, err = s.List(ctx, "/images/")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var keys []string
	for _, kv := range got {
		keys = append(keys, kv.Key)
		if string(kv.Value) != "v"+kv.Key || kv.Version <= 0 {
			t.Errorf("List: got %q=%q@%d, want value v%s and a version", kv.Key, kv.Value, kv.Version, kv.Key)
		}
	}
	if want := "[/images/a /images/m/n /images/z]"; fmt.Sprint(keys) != want {
		t.Fatalf("List(/images/): got %v, want %s", keys, want)
	}
	all, err := s.List(ctx, "")
	if err != nil || len(all) != 5 {
		t.Fatalf("List(\"\"): got %d keys, %v; want 5", len(all), err)
	}
}

func testValuesAreCopies(t *testing.T, s store.Store) {
	v := []byte("abc")
	if err := s.Put(context.Background(), "/copy", v); err != nil {
		t.Fatal(err)
	}
	v[0] = 'X'
	kv := mustGet(t, s, "/copy")
	kv.Value[1] = 'Y'
	if got := mustGet(t, s, "/copy"); string(got.Value) != "abc" {
		t.Fatalf("stored value changed through a caller's slice: got %q, want abc", got.Value)
	}
}

func testInvalidKeys(t *testing.T, s store.Store) {
	ctx := context.Background()
	for _, key := range []string{"", "images/x", "x"} {
		_, err := s.Get(ctx, key)
		wantKind(t, fmt.Sprintf("Get(%q)", key), err, errdefs.ErrInvalid)
		wantKind(t, fmt.Sprintf("Put(%q)", key), s.Put(ctx, key, nil), errdefs.ErrInvalid)
		wantKind(t, fmt.Sprintf("Create(%q)", key), s.Create(ctx, key, nil), errdefs.ErrInvalid)
		wantKind(t, fmt.Sprintf("Delete(%q)", key), s.Delete(ctx, key), errdefs.ErrInvalid)
	}
	_, err := s.List(ctx, "images")
	wantKind(t, "List(images)", err, errdefs.ErrInvalid)
}

func testCanceledContext(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Put(ctx, "/x", []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with canceled ctx: got %v, want context.Canceled", err)
	}
	if _, err := s.Get(ctx, "/x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with canceled ctx: got %v, want context.Canceled", err)
	}
}

// testConcurrentCompareAndPut increments one counter from several
// goroutines with read-modify-CAS loops: no increment may be lost.
func testConcurrentCompareAndPut(t *testing.T, s store.Store) {
	ctx := context.Background()
	const workers, each = 4, 10
	mustPut(t, s, "/counter", "0")
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; {
				kv, err := s.Get(ctx, "/counter")
				if err != nil {
					errs <- err
					return
				}
				var n int
				fmt.Sscan(string(kv.Value), &n)
				err = s.CompareAndPut(ctx, "/counter", []byte(fmt.Sprint(n+1)), kv.Version)
				switch {
				case err == nil:
					i++
				case !errors.Is(err, errdefs.ErrConflict):
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent CompareAndPut: %v", err)
	}
	if got := mustGet(t, s, "/counter"); !bytes.Equal(got.Value, []byte(fmt.Sprint(workers*each))) {
		t.Fatalf("counter: got %s, want %d", got.Value, workers*each)
	}
}
