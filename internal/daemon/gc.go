package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/warrenhq/warren/internal/fncall"
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
// soon after a kick (a layer or environment was deleted). An apiserver
// collects blobs only, an agent evicts its cache only, `warren up` both.
type collector struct {
	images *image.Registry // nil: no blob GC
	live   liveLayers
	cache  *image.Cache // nil: no cache eviction
	log    *slog.Logger
	kicks  chan struct{}
}

// liveLayers maps the layer digests live sandboxes use to their ids; it
// fails when it cannot be sure (a node did not answer).
type liveLayers func(ctx context.Context) (map[string][]string, error)

// agentLayers is the liveLayers of one node's own sandboxes.
func agentLayers(agent *node.Agent, fn *fncall.Service) liveLayers {
	return func(ctx context.Context) (map[string][]string, error) {
		list, err := agent.List(ctx, node.Filter{})
		if err != nil {
			return nil, err
		}
		live := map[string][]string{}
		if fn != nil { // FnCall's runtimes hold their layers mounted
			for _, d := range fn.LayerDigests() {
				live[d] = append(live[d], "fncall")
			}
		}
		for _, sb := range list {
			for _, d := range sb.Layers {
				live[d] = append(live[d], sb.ID)
			}
		}
		return live, nil
	}
}

func newCollector(images *image.Registry, agent *node.Agent, fn *fncall.Service, cache *image.Cache, log *slog.Logger) *collector {
	return newLayerCollector(images, agentLayers(agent, fn), cache, log)
}

func newLayerCollector(images *image.Registry, live liveLayers, cache *image.Cache, log *slog.Logger) *collector {
	return &collector{images: images, live: live, cache: cache, log: log, kicks: make(chan struct{}, 1)}
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
	live, err := c.live(ctx)
	if err != nil {
		c.log.Warn("gc: which layers are in use is not known; not collecting", "err", err)
		return
	}
	if c.images != nil {
		if _, err := c.images.GC(ctx, live); err != nil && ctx.Err() == nil {
			c.log.Warn("gc", "err", err)
		}
	}
	if c.cache == nil {
		return
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
