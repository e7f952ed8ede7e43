package apiserver

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
)

// DefaultImageTTL is how long a Router reuses what an image name or layer
// stack resolved to (RouterConfig.ImageTTL).
const DefaultImageTTL = time.Second

// imageCache resolves what creates start from through a Resolver, keeping
// each answer for ttl: a burst of creates of one environment costs one
// store read per ttl instead of one per create. Concurrent misses for one
// key share a read. Errors are not kept, so an image created a moment ago
// is found at once; a new version of an image named without one, or a
// deleted image, is seen within ttl by creates through other apiservers
// (and at once through this one, which calls invalidate after its own
// writes). Answers are shared between callers: read them, do not change
// them.
type imageCache struct {
	r   Resolver
	ttl time.Duration
	now func() time.Time

	mu  sync.Mutex
	gen uint64 // bumped by invalidate, so a read racing a write is not kept
	m   map[string]*imageEntry
}

type imageEntry struct {
	done  chan struct{} // closed once img and err are set
	img   api.Image
	err   error
	until time.Time
}

// maxImageKeys bounds the cache; when full it starts over (entries cost
// one store read to refill).
const maxImageKeys = 4096

func newImageCache(r Resolver, ttl time.Duration) *imageCache {
	return &imageCache{r: r, ttl: ttl, now: time.Now, m: map[string]*imageEntry{}}
}

// Get resolves an image by name.
func (c *imageCache) Get(ctx context.Context, name string) (api.Image, error) {
	return c.resolve(ctx, "i\x00"+name, func(ctx context.Context) (api.Image, error) { return c.r.Get(ctx, name) })
}

// ResolveLayers resolves an explicit layer stack.
func (c *imageCache) ResolveLayers(ctx context.Context, refs []string) (api.Image, error) {
	return c.resolve(ctx, "l\x00"+strings.Join(refs, "\x00"), func(ctx context.Context) (api.Image, error) {
		return c.r.ResolveLayers(ctx, refs)
	})
}

// invalidate forgets every answer: this apiserver changed layers or
// environments.
func (c *imageCache) invalidate() {
	c.mu.Lock()
	c.gen++
	clear(c.m)
	c.mu.Unlock()
}

func (c *imageCache) resolve(ctx context.Context, key string, load func(context.Context) (api.Image, error)) (api.Image, error) {
	now := c.now()
	c.mu.Lock()
	e := c.m[key]
	if e != nil {
		select {
		case <-e.done:
			if e.err == nil && now.Before(e.until) {
				c.mu.Unlock()
				return e.img, nil
			}
			e = nil // expired or failed: read again
		default: // a read is under way: share it
		}
	}
	if e != nil {
		c.mu.Unlock()
		select {
		case <-e.done:
		case <-ctx.Done():
			return api.Image{}, ctx.Err()
		}
		if e.err != nil {
			return api.Image{}, e.err
		}
		return e.img, nil
	}
	e = &imageEntry{done: make(chan struct{})}
	if len(c.m) >= maxImageKeys {
		clear(c.m)
	}
	c.m[key] = e
	gen := c.gen
	c.mu.Unlock()

	// Shared by whoever waits meanwhile: not bound to this caller's
	// cancellation alone.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	e.img, e.err = load(lctx)
	cancel()
	e.until = c.now().Add(c.ttl)
	c.mu.Lock()
	if e.err != nil || c.gen != gen {
		if c.m[key] == e {
			delete(c.m, key)
		}
	}
	c.mu.Unlock()
	close(e.done)
	if e.err != nil {
		return api.Image{}, e.err
	}
	return e.img, nil
}
