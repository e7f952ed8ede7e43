package apiserver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// countingResolver answers name@<reads so far> and counts its reads; a
// name in missing is not found; gate, if set, holds every read.
type countingResolver struct {
	reads   atomic.Int64
	missing map[string]bool
	gate    chan struct{}
}

func (r *countingResolver) Get(ctx context.Context, name string) (api.Image, error) {
	n := r.reads.Add(1)
	if r.gate != nil {
		<-r.gate
	}
	if r.missing[name] {
		return api.Image{}, errdefs.New(errdefs.ErrNotFound, api.CodeImageNotFound, "image %q not found", name)
	}
	return api.Image{Name: name, Layers: []string{"sha256:" + string(rune('a'+n))}}, nil
}

func (r *countingResolver) ResolveLayers(ctx context.Context, refs []string) (api.Image, error) {
	r.reads.Add(1)
	return api.Image{Name: "layers", Layers: refs}, nil
}

func TestImageCache(t *testing.T) {
	ctx := context.Background()
	res := &countingResolver{missing: map[string]bool{"nope": true}}
	c := newImageCache(res, time.Second)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }

	a, _ := c.Get(ctx, "busybox")
	b, _ := c.Get(ctx, "busybox")
	if res.reads.Load() != 1 || a.Layers[0] != b.Layers[0] {
		t.Fatalf("two gets within the ttl: %d reads, %v then %v; want one read", res.reads.Load(), a.Layers, b.Layers)
	}
	if _, err := c.ResolveLayers(ctx, []string{"base", "tools"}); err != nil || res.reads.Load() != 2 {
		t.Fatalf("a layer stack is its own key: %v, %d reads", err, res.reads.Load())
	}
	c.ResolveLayers(ctx, []string{"base", "tools"})
	if res.reads.Load() != 2 {
		t.Fatalf("the same stack again: %d reads, want 2", res.reads.Load())
	}

	now = now.Add(time.Second)
	if c.Get(ctx, "busybox"); res.reads.Load() != 3 {
		t.Fatalf("after the ttl: %d reads, want 3", res.reads.Load())
	}
	c.invalidate()
	if c.Get(ctx, "busybox"); res.reads.Load() != 4 {
		t.Fatalf("after invalidate: %d reads, want 4", res.reads.Load())
	}

	// Errors are not kept: an image made a moment later is found at once.
	for range 2 {
		if _, err := c.Get(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("missing image: %v", err)
		}
	}
	if res.reads.Load() != 6 {
		t.Fatalf("two misses: %d reads, want 6", res.reads.Load())
	}
}

// Concurrent misses for one name share one read.
func TestImageCacheSharesReads(t *testing.T) {
	res := &countingResolver{gate: make(chan struct{})}
	c := newImageCache(res, time.Minute)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if img, err := c.Get(context.Background(), "busybox"); err != nil || img.Name != "busybox" {
				t.Errorf("get: %+v, %v", img, err)
			}
		})
	}
	for res.reads.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // let the others queue behind it
	close(res.gate)
	wg.Wait()
	if n := res.reads.Load(); n != 1 {
		t.Errorf("8 concurrent gets: %d reads, want 1", n)
	}

	// A caller that gives up does not wait for a read under way.
	res2 := &countingResolver{gate: make(chan struct{})}
	c2 := newImageCache(res2, time.Minute)
	go c2.Get(context.Background(), "busybox")
	for res2.reads.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c2.Get(ctx, "busybox"); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled waiter: %v", err)
	}
	close(res2.gate)
}
