package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/node"
)

// gcInterval is how often unreferenced blobs and unused cached layers are
// collected when nothing asks sooner.
const gcInterval = 10 * time.Minute

// cacheMinAge keeps a cached layer that a create fetched moments ago and
// whose sandbox is not live yet.
const cacheMinAge = 10 * time.Minute

// collector runs blob GC and node cache eviction every gcInterval, and
// soon after a kick (a layer or environment was deleted).
type collector struct {
	images *image.Registry
	agent  *node.Agent
	cache  *image.Cache
	log    *slog.Logger
	kicks  chan struct{}
}

func newCollector(images *image.Registry, agent *node.Agent, cache *image.Cache, log *slog.Logger) *collector {
	return &collector{images: images, agent: agent, cache: cache, log: log, kicks: make(chan struct{}, 1)}
}

// kick asks for a collection soon; it never blocks.
func (c *collector) kick() {
	select {
	case c.kicks <- struct{}{}:
	default:
	}
}

func (c *collector) run(ctx context.Context) {
	t := time.NewTicker(gcInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.kicks:
		}
		c.collect(ctx)
	}
}

func (c *collector) collect(ctx context.Context) {
	list, err := c.agent.List(ctx, node.Filter{})
	if err != nil {
		c.log.Warn("gc: list sandboxes", "err", err)
		return
	}
	live := map[string][]string{}
	for _, sb := range list {
		for _, d := range sb.Layers {
			live[d] = append(live[d], sb.ID)
		}
	}
	if _, err := c.images.GC(ctx, live); err != nil && ctx.Err() == nil {
		c.log.Warn("gc", "err", err)
	}
	keep := map[string]bool{}
	for d := range live {
		keep[d] = true
	}
	removed, err := c.cache.Prune(keep, cacheMinAge)
	if err != nil {
		c.log.Warn("prune layer cache", "err", err)
	}
	if len(removed) > 0 {
		c.log.Info("pruned layer cache", "layers", len(removed))
	}
}
