package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

// leaseTTL is the shortest TTL every implementation honours: etcd counts
// leases in whole seconds.
const leaseTTL = time.Second

func runWatcher(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Watcher)
	}{
		{"WatchSnapshotThenChanges", testWatchSnapshotThenChanges},
		{"WatchAll", testWatchAll},
		{"WatchCancel", testWatchCancel},
		{"WatchInvalidPrefix", testWatchInvalidPrefix},
		{"LeaseKeepAliveRevoke", testLeaseKeepAliveRevoke},
		{"LeaseExpires", testLeaseExpires},
		{"PutMovesKeyOffLease", testPutMovesKeyOffLease},
		{"LeaseInvalid", testLeaseInvalid},
		{"LeaseTxn", testLeaseTxn},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			w, ok := s.(store.Watcher)
			if !ok {
				t.Skipf("%T is not a store.Watcher", s)
			}
			tt.fn(t, w)
		})
	}
}

func watch(t *testing.T, s store.Watcher, prefix string) <-chan store.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := s.Watch(ctx, prefix)
	if err != nil {
		t.Fatalf("Watch(%q): %v", prefix, err)
	}
	return ch
}

// next returns the next event, failing the test if none comes within 5 s.
func next(t *testing.T, ch <-chan store.Event) store.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatalf("watch closed, want an event")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatalf("no watch event within 5s")
	}
	panic("unreachable")
}

func wantEvent(t *testing.T, ch <-chan store.Event, typ store.EventType, key, value string) store.Event {
	t.Helper()
	ev := next(t, ch)
	if ev.Type != typ || ev.KV.Key != key || string(ev.KV.Value) != value {
		t.Fatalf("watch event: got %v %q=%q, want %v %q=%q", ev.Type, ev.KV.Key, ev.KV.Value, typ, key, value)
	}
	if ev.KV.Version <= 0 {
		t.Fatalf("watch event %v %q: got version %d, want > 0", ev.Type, ev.KV.Key, ev.KV.Version)
	}
	return ev
}

func wantSynced(t *testing.T, ch <-chan store.Event) {
	t.Helper()
	if ev := next(t, ch); ev.Type != store.EventSynced {
		t.Fatalf("watch event: got %v %q, want synced", ev.Type, ev.KV.Key)
	}
}

func testWatchSnapshotThenChanges(t *testing.T, s store.Watcher) {
	ctx := context.Background()
	mustPut(t, s, "/w/b", "b1")
	mustPut(t, s, "/w/a", "a1")
	mustPut(t, s, "/wx", "outside")
	ch := watch(t, s, "/w/")
	a := wantEvent(t, ch, store.EventPut, "/w/a", "a1")
	if want := mustGet(t, s, "/w/a").Version; a.KV.Version != want {
		t.Fatalf("snapshot version of /w/a: got %d, want %d", a.KV.Version, want)
	}
	wantEvent(t, ch, store.EventPut, "/w/b", "b1")
	wantSynced(t, ch)

	mustPut(t, s, "/w/c", "c1")
	mustPut(t, s, "/wx", "still outside")
	mustPut(t, s, "/w/a", "a2")
	if err := s.Delete(ctx, "/w/b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "/w/never"); err != nil {
		t.Fatal(err)
	}
	c := wantEvent(t, ch, store.EventPut, "/w/c", "c1")
	a2 := wantEvent(t, ch, store.EventPut, "/w/a", "a2")
	del := wantEvent(t, ch, store.EventDelete, "/w/b", "")
	if !(c.KV.Version < a2.KV.Version && a2.KV.Version < del.KV.Version) {
		t.Fatalf("event versions: got %d, %d, %d; want increasing", c.KV.Version, a2.KV.Version, del.KV.Version)
	}
	if got := mustGet(t, s, "/w/a").Version; got != a2.KV.Version {
		t.Fatalf("version of /w/a: event says %d, Get says %d", a2.KV.Version, got)
	}
}

func testWatchAll(t *testing.T, s store.Watcher) {
	mustPut(t, s, "/x", "1")
	ch := watch(t, s, "")
	wantEvent(t, ch, store.EventPut, "/x", "1")
	wantSynced(t, ch)
	mustPut(t, s, "/y/z", "2")
	wantEvent(t, ch, store.EventPut, "/y/z", "2")
}

func testWatchCancel(t *testing.T, s store.Watcher) {
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := s.Watch(ctx, "/c/")
	if err != nil {
		t.Fatal(err)
	}
	wantSynced(t, ch)
	cancel()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatalf("watch not closed 5s after its context was canceled")
		}
	}
}

func testWatchInvalidPrefix(t *testing.T, s store.Watcher) {
	_, err := s.Watch(context.Background(), "nodes/")
	wantKind(t, "Watch(nodes/)", err, errdefs.ErrInvalid)
}

func testLeaseKeepAliveRevoke(t *testing.T, s store.Watcher) {
	ctx := context.Background()
	ch := watch(t, s, "/l/")
	wantSynced(t, ch)
	id, err := s.PutWithLease(ctx, "/l/k", []byte("v"), leaseTTL)
	if err != nil {
		t.Fatalf("PutWithLease: %v", err)
	}
	wantEvent(t, ch, store.EventPut, "/l/k", "v")
	// Kept alive for twice its TTL, the key stays.
	for end := time.Now().Add(2 * leaseTTL); time.Now().Before(end); {
		if err := s.KeepAlive(ctx, id); err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		time.Sleep(leaseTTL / 4)
	}
	if kv := mustGet(t, s, "/l/k"); string(kv.Value) != "v" {
		t.Fatalf("kept-alive key: got %q, want v", kv.Value)
	}
	if err := s.Revoke(ctx, id); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	_, err = s.Get(ctx, "/l/k")
	wantKind(t, "Get after Revoke", err, errdefs.ErrNotFound)
	wantEvent(t, ch, store.EventDelete, "/l/k", "")
	wantKind(t, "KeepAlive after Revoke", s.KeepAlive(ctx, id), errdefs.ErrNotFound)
	if err := s.Revoke(ctx, id); err != nil {
		t.Fatalf("second Revoke: got %v, want nil", err)
	}
}

func testLeaseExpires(t *testing.T, s store.Watcher) {
	ctx := context.Background()
	ch := watch(t, s, "/l/")
	wantSynced(t, ch)
	start := time.Now()
	id, err := s.PutWithLease(ctx, "/l/gone", []byte("v"), leaseTTL)
	if err != nil {
		t.Fatalf("PutWithLease: %v", err)
	}
	mustPut(t, s, "/l/plain", "p")
	wantEvent(t, ch, store.EventPut, "/l/gone", "v")
	wantEvent(t, ch, store.EventPut, "/l/plain", "p")
	wantEvent(t, ch, store.EventDelete, "/l/gone", "")
	if d := time.Since(start); d < leaseTTL*9/10 {
		t.Fatalf("leased key deleted after %v, before its TTL %v", d, leaseTTL)
	}
	t.Logf("leased key expired after %v (TTL %v)", time.Since(start).Round(time.Millisecond), leaseTTL)
	_, err = s.Get(ctx, "/l/gone")
	wantKind(t, "Get after expiry", err, errdefs.ErrNotFound)
	mustGet(t, s, "/l/plain")
	wantKind(t, "KeepAlive after expiry", s.KeepAlive(ctx, id), errdefs.ErrNotFound)
}

func testPutMovesKeyOffLease(t *testing.T, s store.Watcher) {
	ctx := context.Background()
	old, err := s.PutWithLease(ctx, "/m/a", []byte("1"), leaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutWithLease(ctx, "/m/b", []byte("1"), leaseTTL); err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, "/m/a", "2") // no lease now
	newer, err := s.PutWithLease(ctx, "/m/b", []byte("2"), 10*leaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Revoke(ctx, newer)
	if err := s.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * leaseTTL) // /m/b's first lease expires
	for _, k := range []string{"/m/a", "/m/b"} {
		if kv := mustGet(t, s, k); string(kv.Value) != "2" {
			t.Fatalf("Get(%s): got %q, want 2", k, kv.Value)
		}
	}
}

func testLeaseInvalid(t *testing.T, s store.Watcher) {
	ctx := context.Background()
	_, err := s.PutWithLease(ctx, "/k", nil, 0)
	wantKind(t, "PutWithLease(ttl 0)", err, errdefs.ErrInvalid)
	_, err = s.PutWithLease(ctx, "k", nil, leaseTTL)
	wantKind(t, "PutWithLease(k)", err, errdefs.ErrInvalid)
	wantKind(t, "KeepAlive(unknown)", s.KeepAlive(ctx, 0x7eadbeef), errdefs.ErrNotFound)
	if err := s.Revoke(ctx, 0x7eadbeef); err != nil {
		t.Fatalf("Revoke(unknown): got %v, want nil", err)
	}
}
