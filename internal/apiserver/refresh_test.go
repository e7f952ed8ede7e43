package apiserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/node/nodetest"
)

// anyToken lets every caller through: a static fleet view has no
// registration secrets to present.
type anyToken struct{}

func (anyToken) Check(context.Context, string) error { return nil }

// The Router's refresh reads each node's changes: a whole list the first
// time, then what changed since, which is enough to follow what happens on
// the node behind its back (here: creates and deletes made on the agent
// directly).
func TestRouterRefreshFollowsChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent := nodetest.New(t, nil)
	h := nodeapi.NewServer(agent, anyToken{}, quietLog)
	var mu sync.Mutex
	var calls []string // "epoch/since" of each GET /v1/changes
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/changes" {
			mu.Lock()
			calls = append(calls, r.URL.Query().Get("epoch")+"/"+r.URL.Query().Get("since"))
			mu.Unlock()
		}
		r.Header.Set("Authorization", "Bearer any")
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	status := agent.Status()
	f := fleet.NewStatic(api.Node{ID: agent.ID(), Address: srv.Listener.Addr().String(), Pool: api.PoolOnPrem,
		Healthy: true, Backends: status.Backends, Capacity: status.Capacity})
	usage := apiserver.NewUsage()
	r, err := apiserver.NewRouter(apiserver.RouterConfig{
		Fleet: f, Clients: nodeapi.NewClients(nil), Usage: usage, Refresh: 20 * time.Millisecond, Log: quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	go r.Run(ctx)

	create := func() api.Sandbox {
		sb, err := agent.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Project: "p",
			Resources: api.Resources{CPU: 0.5, Memory: 64 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	counted := func(want int64) func() bool {
		return func() bool {
			return usage.Usage("p") == iam.Resources{Sandboxes: want, MilliCPU: 500 * want, Memory: want * 64 << 20}
		}
	}
	a, b := create(), create()
	waitUntil(t, "two sandboxes counted", 5*time.Second, counted(2))
	if err := agent.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the deleted one uncounted", 5*time.Second, counted(1))
	list, err := r.List(ctx, node.Filter{})
	if err != nil || len(list) != 1 || list[0].ID != b.ID {
		t.Fatalf("list: %v, %v; want [%s]", list, err, b.ID)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(calls) < 2 || calls[0] != "/0" || calls[len(calls)-1] == "/0" {
		t.Errorf("changes calls %v: want a first full read (no epoch, since 0), then reads since a revision", calls)
	}
}

// A delta may predate the creates and deletes this apiserver sees while it
// is read: they survive it, as they survive a full resync.
func TestUsageUpdateKeepsConcurrentChanges(t *testing.T) {
	u := apiserver.NewUsage()
	u.Created(sbx("n1-a", "p", 1))
	u.Created(sbx("n1-b", "p", 1))
	err := u.Update("n1", func() (node.Changes, error) {
		u.Deleted("n1", "n1-a")        // deleted here while the node answered
		u.Created(sbx("n1-d", "p", 1)) // created here meanwhile
		failed := sbx("n1-a", "p", 1)  // the node's (older) word on a: failed
		failed.State = api.StateFailed
		lost := sbx("n1-b", "p", 1)
		lost.State = api.StateLost
		return node.Changes{Sandboxes: []api.Sandbox{failed, lost, sbx("n1-c", "q", 2)}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// a: deleted (this apiserver's later word); b: lost, counts nothing;
	// c: new from the node; d: this apiserver's create.
	if got := u.Usage("p"); got.Sandboxes != 1 || got.MilliCPU != 1000 {
		t.Errorf("p after the delta: %+v, want d alone", got)
	}
	if got := u.Usage("q"); got.Sandboxes != 1 || got.MilliCPU != 2000 {
		t.Errorf("q after the delta: %+v, want c", got)
	}
	u.Update("n1", func() (node.Changes, error) { return node.Changes{Deleted: []string{"n1-c"}}, nil })
	if got := u.Usage("q"); !got.IsZero() {
		t.Errorf("q after c's tombstone: %+v", got)
	}
	if got := u.Usage(""); got.Sandboxes != 1 {
		t.Errorf("everything: %+v, want d alone", got)
	}
}

// imageCluster is a Cluster that keeps resolved images, and counts the
// times it is told to forget them.
type imageCluster struct {
	apiserver.Cluster // nil: no other method is called
	forgot            atomic.Int32
}

func (c *imageCluster) ImagesChanged() { c.forgot.Add(1) }

// A write to layers or environments through an apiserver makes its cluster
// forget the images it resolved, so that its next create sees the write.
func TestLayerWritesForgetResolvedImages(t *testing.T) {
	c := &imageCluster{}
	srv := httptest.NewServer(apiserver.New(apiserver.Config{Cluster: c, Tokens: apiserver.StaticToken(token), Log: quietLog}))
	t.Cleanup(srv.Close)
	h := &harness{t: t, url: srv.URL}
	for _, tc := range []struct {
		method, path string
		forgets      bool
	}{
		{"GET", "/v1/environments", false},
		{"GET", "/v1/layers", false},
		{"POST", "/v1/environments", true},
		{"DELETE", "/v1/environments/busybox@1", true},
		{"POST", "/v1/layers?name=x&kind=base", true},
		{"DELETE", "/v1/layers/x@1", true},
		{"POST", "/v1/gc", true},
		{"POST", "/v1/images:import?format=oci&name=x", true},
	} {
		before := c.forgot.Load()
		h.do(tc.method, tc.path, "application/json", strings.NewReader("{}"))
		if got := c.forgot.Load() > before; got != tc.forgets {
			t.Errorf("%s %s: images forgotten %v, want %v", tc.method, tc.path, got, tc.forgets)
		}
	}
}
