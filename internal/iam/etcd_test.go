package iam_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/store"
)

// TestEtcd runs the cases where concurrency meets the real store against
// one embedded etcd member, each in its own key prefix.
func TestEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("embedded etcd: not in -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := store.StartEmbedded(ctx, t.TempDir())
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	defer e.Close()
	var n atomic.Int64
	ns := func() store.Store { return store.NewEtcd(e.Client(), fmt.Sprintf("/iamtest%d", n.Add(1))) }

	t.Run("ConcurrentDelegation", func(t *testing.T) { testConcurrentDelegation(t, ns()) })
	t.Run("IdempotencyConcurrentReplays", func(t *testing.T) { testIdempotencyConcurrentReplays(t, ns()) })
	t.Run("TokensAcrossReplicas", func(t *testing.T) {
		st := ns()
		a, b := iam.New(st, iam.Options{}), iam.New(st, iam.Options{AuthCacheTTL: 100 * time.Millisecond})
		const bootstrap = "bootstrap-secret-0123456789"
		if _, err := a.EnsureAdmin(ctx, bootstrap); err != nil {
			t.Fatal(err)
		}
		admin, err := b.Authenticate(ctx, bootstrap)
		if err != nil {
			t.Fatalf("b authenticates the bootstrap token: %v", err)
		}
		if _, err := b.CreateProject(ctx, admin, "research", iam.ProjectSpec{Quota: quota(5)}); err != nil {
			t.Fatal(err)
		}
		tok, secret, err := b.CreateToken(ctx, admin, iam.TokenSpec{Project: "research", Role: iam.RoleRunner})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Authenticate(ctx, secret); err != nil { // a never saw "research" before
			t.Fatalf("a authenticates b's token: %v", err)
		}
		if _, err := b.Authenticate(ctx, secret); err != nil {
			t.Fatal(err)
		}
		if err := a.RevokeToken(ctx, admin, tok.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond)
		_, err = b.Authenticate(ctx, secret)
		wantErr(t, "b after the cache bound", err, errdefs.ErrUnauthenticated, "")
	})
}
