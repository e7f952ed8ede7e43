package iam_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/store"
)

// clock is a fake time source tests move by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// countingStore counts reads of token records.
type countingStore struct {
	store.Store
	tokenGets atomic.Int64
}

func (s *countingStore) Get(ctx context.Context, key string) (store.KV, error) {
	if strings.HasPrefix(key, "/iam/tokens/") {
		s.tokenGets.Add(1)
	}
	return s.Store.Get(ctx, key)
}

var root = iam.SystemPrincipal()

func newIAM(t *testing.T, c *clock, opts iam.Options) (*iam.IAM, store.Store) {
	t.Helper()
	st := store.Memory()
	t.Cleanup(func() { st.Close() })
	if c != nil {
		opts.Now = c.Now
	}
	return iam.New(st, opts), st
}

func mustCreate(t *testing.T, m *iam.IAM, path string, q iam.Quota) iam.Project {
	t.Helper()
	p, err := m.CreateProject(context.Background(), root, path, iam.ProjectSpec{Quota: q})
	if err != nil {
		t.Fatalf("CreateProject(%q): %v", path, err)
	}
	return p
}

// wantErr checks err's kind and code; kind nil means success.
func wantErr(t *testing.T, what string, err, kind error, code string) {
	t.Helper()
	if kind == nil {
		if err != nil {
			t.Fatalf("%s: got error %v, want success", what, err)
		}
		return
	}
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got error %v, want %v", what, err, kind)
	}
	if code != "" && errdefs.Code(err) != code {
		t.Fatalf("%s: got code %q (%v), want %q", what, errdefs.Code(err), err, code)
	}
}

func sandboxes(n int64) iam.Resources { return iam.Resources{Sandboxes: n} }

func quota(n int64) iam.Quota { return iam.Quota{Resources: sandboxes(n)} }
