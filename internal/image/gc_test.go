package image

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestGCHonoursPins(t *testing.T) {
	ctx := context.Background()
	bs, err := blob.NewDir(t.TempDir())
	mustT(t, err)
	r := NewRegistry(store.Memory(), bs, WithGCGrace(0), WithLogger(quietLog))
	d, _, err := bs.Put(ctx, strings.NewReader("pinned"))
	mustT(t, err)
	unpin, err := r.pin(ctx, nil, []string{d})
	mustT(t, err)
	if res, err := r.GC(ctx, nil); err != nil || res.Deleted != 0 || res.Live != 1 {
		t.Fatalf("GC with a pin: %+v, %v", res, err)
	}
	unpin()
	if res, err := r.GC(ctx, nil); err != nil || res.Deleted != 1 {
		t.Fatalf("GC after unpin: %+v, %v", res, err)
	}
}

func TestGCOneAtATime(t *testing.T) {
	ctx := context.Background()
	bs, err := blob.NewDir(t.TempDir())
	mustT(t, err)
	st := store.Memory()
	r := NewRegistry(st, bs, WithGCGrace(0), WithLogger(quietLog))
	marker := func(expires time.Time) {
		b, _ := json.Marshal(gcLeaseRecord{ID: "other", ExpiresAt: expires})
		mustT(t, st.Put(ctx, gcSweepKey, b))
	}
	marker(time.Now().Add(time.Minute))
	if res, err := r.GC(ctx, nil); err != nil || !res.Skipped {
		t.Fatalf("GC while another sweeps: %+v, %v; want skipped", res, err)
	}
	marker(time.Now().Add(-time.Minute)) // a dead collector's
	if res, err := r.GC(ctx, nil); err != nil || res.Skipped {
		t.Fatalf("GC over a stale marker: %+v, %v; want a run", res, err)
	}
	if _, err := st.Get(ctx, gcSweepKey); err == nil {
		t.Error("GC left its marker behind")
	}
}

// gatedStore blocks Deletes until gate closes and reports the first one.
type gatedStore struct {
	blob.Store
	gate    chan struct{}
	started chan struct{}
	once    sync.Once
}

func (g *gatedStore) Delete(ctx context.Context, d string) error {
	g.once.Do(func() { close(g.started) })
	<-g.gate
	return g.Store.Delete(ctx, d)
}

// TestPublishWaitsForSweep: a layer whose chunks are garbage from a
// deleted layer is published while a collection deletes them. The publish
// must not reuse chunks the collection is about to delete: it waits, then
// writes them again, and the new layer assembles.
func TestPublishWaitsForSweep(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs")
	ctx := context.Background()
	dir, err := blob.NewDir(t.TempDir())
	mustT(t, err)
	bs := &gatedStore{Store: dir, gate: make(chan struct{}), started: make(chan struct{})}
	r := NewRegistry(store.Memory(), bs, WithGCGrace(0), WithWorkDir(t.TempDir()), WithLogger(quietLog))
	src := t.TempDir()
	mustT(t, os.WriteFile(filepath.Join(src, "big"), randomBytes(3<<20), 0o644))
	_, err = r.BuildLayer(ctx, LayerSpec{Name: "old", Version: "1", Kind: api.LayerBase}, src)
	mustT(t, err)
	mustT(t, r.DeleteLayer(ctx, "old@1", nil))

	gcDone := make(chan error, 1)
	go func() { _, err := r.GC(ctx, nil); gcDone <- err }()
	<-bs.started // the collection is deleting the old chunks

	type result struct {
		l   api.Layer
		err error
	}
	pubDone := make(chan result, 1)
	go func() {
		l, err := r.BuildLayer(ctx, LayerSpec{Name: "new", Version: "1", Kind: api.LayerBase}, src)
		pubDone <- result{l, err}
	}()
	select {
	case res := <-pubDone:
		t.Fatalf("publish finished during the sweep: %+v", res)
	case <-time.After(500 * time.Millisecond):
	}
	close(bs.gate)
	mustT(t, <-gcDone)
	res := <-pubDone
	mustT(t, res.err)
	if _, err := NewCache(t.TempDir(), bs).Fetch(ctx, res.l.Digest); err != nil {
		t.Fatalf("layer published across a sweep does not assemble: %v", err)
	}
}
