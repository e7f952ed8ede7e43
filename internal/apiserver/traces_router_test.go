package apiserver_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node"
)

// tracedImages resolves busybox with a prefetch trace for its layer.
type tracedImages struct{ resolver }

func (r tracedImages) Get(ctx context.Context, name string) (api.Image, error) {
	img, err := r.resolver.Get(ctx, name)
	img.PrefetchTraces = map[string]string{img.Layers[0]: traceDigest}
	return img, err
}

const traceDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

// prefetching makes node id say it replays prefetch traces.
type prefetching struct {
	fleet.StatusSource
	id string
}

func (p prefetching) Status(ctx context.Context, n fleet.Registration) (api.Node, error) {
	st, err := p.StatusSource.Status(ctx, n)
	st.LayerPrefetch = st.ID == p.id
	return st, err
}

// tracedLayers records the traces its node is given.
type tracedLayers struct {
	imagetest.NoLayers
	mu     sync.Mutex
	traces []string
}

func (l *tracedLayers) FetchTraced(ctx context.Context, digest, trace string) (backend.Layer, error) {
	l.mu.Lock()
	l.traces = append(l.traces, trace)
	l.mu.Unlock()
	return l.Fetch(ctx, digest)
}

// TestRouterSendsTraces: an image's prefetch traces go with the creates
// of nodes that replay them, and not to others (a node that predates
// them would refuse the field).
func TestRouterSendsTraces(t *testing.T) {
	layers := map[string]*tracedLayers{"n1": {}, "n2": {}}
	f := newFleetWith(t, fleetOptions{
		node: func(id string, c *node.Config) {
			c.Layers = layers[id]
			c.Labels = map[string]string{"node": id}
		},
		fleet:  func(c *fleet.Config) { c.Source = prefetching{c.Source, "n2"} },
		router: func(c *apiserver.RouterConfig) { c.Images = tracedImages{resolver{imagetest.Busybox}} },
	}, "n1", "n2")
	for _, id := range []string{"n1", "n2"} {
		if code, b := f.json("POST", "/v1/sandboxes", `{"image":"busybox","node_selector":{"node":"`+id+`"}}`); code.StatusCode != http.StatusCreated {
			t.Fatalf("create on %s: %d %s", id, code.StatusCode, b)
		}
	}
	if got := layers["n1"].traces; len(got) != 0 {
		t.Errorf("a node that does not replay traces got %v", got)
	}
	if got := layers["n2"].traces; len(got) != 1 || got[0] != traceDigest {
		t.Errorf("a node that replays traces got %v, want [%s]", got, traceDigest)
	}
}
