package storetest

import (
	"context"
	"testing"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

// testLeaseTxn: PutAllLeased writes every key under the lease, or none when
// one key is not at its version; the keys go with the lease; a gone lease
// is ErrNotFound.
func testLeaseTxn(t *testing.T, s store.Watcher) {
	lt, ok := s.(store.LeaseTxn)
	if !ok {
		t.Skipf("%T is not a store.LeaseTxn", s)
	}
	ctx := context.Background()
	id, err := lt.Grant(ctx, leaseTTL)
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	mustPut(t, s, "/t/taken", "x")
	taken := mustGet(t, s, "/t/taken")
	// One stale version: nothing written.
	err = lt.PutAllLeased(ctx, id, []store.KV{{Key: "/t/a", Value: []byte("a")}, {Key: "/t/taken", Value: []byte("y")}})
	wantKind(t, "PutAllLeased over a taken key", err, errdefs.ErrConflict)
	if _, err := s.Get(ctx, "/t/a"); err == nil {
		t.Fatalf("a refused PutAllLeased wrote /t/a")
	}
	if err := lt.PutAllLeased(ctx, id, []store.KV{{Key: "/t/a", Value: []byte("a")},
		{Key: "/t/taken", Value: []byte("y"), Version: taken.Version}}); err != nil {
		t.Fatalf("PutAllLeased at the right versions: %v", err)
	}
	if kv := mustGet(t, s, "/t/taken"); string(kv.Value) != "y" {
		t.Fatalf("/t/taken = %q, want y", kv.Value)
	}
	if err := s.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"/t/a", "/t/taken"} {
		_, err := s.Get(ctx, k)
		wantKind(t, k+" after its lease was revoked", err, errdefs.ErrNotFound)
	}
	wantKind(t, "PutAllLeased on a revoked lease", lt.PutAllLeased(ctx, id, []store.KV{{Key: "/t/b", Value: []byte("b")}}), errdefs.ErrNotFound)
	_, err = lt.Grant(ctx, 0)
	wantKind(t, "Grant(0)", err, errdefs.ErrInvalid)
}
