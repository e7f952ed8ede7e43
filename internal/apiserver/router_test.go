package apiserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/placement"
	"github.com/warrenhq/warren/internal/store"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// resolver is the image registry as the router sees it: busybox by name,
// and any layer list as an image of those layers.
type resolver struct{ imagetest.Images }

func (resolver) ResolveLayers(_ context.Context, refs []string) (api.Image, error) {
	return api.Image{Name: strings.Join(refs, "+"), Layers: refs}, nil
}

// fleetNode is one agent of a test fleet: the agent, its node API server
// (which a test can stop, or make refuse creates) and its registration.
type fleetNode struct {
	agent   *node.Agent
	srv     *httptest.Server
	refuse  atomic.Bool // answer every create 429
	hang    atomic.Bool // answer nothing, as behind a cut link
	creates atomic.Int32
	stopReg context.CancelFunc
	regDone chan struct{}

	// refuseAfter, if > 0, answers 429 to every create after that many.
	refuseAfter atomic.Int32
	// loseAnswers: creates happen, but the connection breaks before the
	// answer, as when a link fails at the wrong moment.
	loseAnswers atomic.Bool
}

type fleetHarness struct {
	*harness
	nodes   map[string]*fleetNode
	st      store.Watcher
	watcher *fleet.Watcher
}

// newFleet starts agents ids (fake backend, no image registry: the router
// resolves images) behind node API servers, registered with a 1 s TTL in
// a memory store, and an apiserver whose Router watches them with 50 ms
// polls (unreachable after 2 misses).
func newFleet(t *testing.T, ids ...string) *fleetHarness {
	t.Helper()
	return newFleetWith(t, fleetOptions{}, ids...)
}

// fleetOptions change what newFleetWith builds, after its defaults.
type fleetOptions struct {
	node   func(id string, c *node.Config)
	fleet  func(c *fleet.Config)
	server func(c *apiserver.Config)
	router func(c *apiserver.RouterConfig)
}

func newFleetWith(t *testing.T, o fleetOptions, ids ...string) *fleetHarness {
	t.Helper()
	st := store.Memory().(store.Watcher)
	f := &fleetHarness{nodes: map[string]*fleetNode{}, st: st}
	for _, id := range ids {
		fn := &fleetNode{}
		fn.agent = nodetest.New(t, func(c *node.Config) {
			c.ID = id
			c.Images = nil
			if o.node != nil {
				o.node(id, c)
			}
		})
		// Each node takes its own secret only, as agents do.
		h := nodeapi.NewServer(fn.agent, nodeapi.Secret("secret-"+id), quietLog)
		fn.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if fn.hang.Load() {
				<-r.Context().Done()
				return
			}
			if r.Method == "POST" && r.URL.Path == "/v1/sandboxes" {
				n := fn.creates.Add(1)
				if after := fn.refuseAfter.Load(); fn.refuse.Load() || after > 0 && n > after {
					w.Header().Set("Retry-After", "3")
					w.WriteHeader(http.StatusTooManyRequests)
					io.WriteString(w, `{"error":{"code":"node_full","message":"node `+id+` is full","retry_after":3}}`)
					return
				}
				if fn.loseAnswers.Load() {
					h.ServeHTTP(httptest.NewRecorder(), r)
					panic(http.ErrAbortHandler)
				}
			}
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(fn.srv.Close)
		status := fn.agent.Status()
		reg, err := fleet.NewRegistrar(fleet.RegistrarConfig{
			Store: st, TTL: time.Second, Log: quietLog, Secret: "secret-" + id,
			Node: api.Node{ID: id, Address: fn.srv.Listener.Addr().String(), Pool: status.Pool, Labels: status.Labels, Backends: status.Backends, Capacity: status.Capacity},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		fn.stopReg, fn.regDone = cancel, make(chan struct{})
		go func() { reg.Run(ctx); close(fn.regDone) }()
		t.Cleanup(fn.stopRegistration)
		f.nodes[id] = fn
	}
	clients := nodeapi.NewClients(nil)
	fc := fleet.Config{Store: st, Source: clients, PollInterval: 50 * time.Millisecond, MaxMissed: 2, Log: quietLog}
	if o.fleet != nil {
		o.fleet(&fc)
	}
	w, err := fleet.New(fc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go w.Run(ctx)
	f.watcher = w
	waitUntil(t, "every node polled", 5*time.Second, func() bool {
		n := 0
		for _, v := range w.Snapshot() {
			if v.Healthy {
				n++
			}
		}
		return n == len(ids)
	})
	rc := apiserver.RouterConfig{
		Fleet:     w,
		Clients:   clients,
		Placement: placement.Config{Cooldown: -1},
		Images:    resolver{imagetest.Busybox},
		Known:     func(ctx context.Context, id string) (bool, error) { return fleet.Known(ctx, st, id) },
		Refresh:   100 * time.Millisecond,
		Log:       quietLog,
	}
	if o.router != nil {
		o.router(&rc)
	}
	r, err := apiserver.NewRouter(rc)
	if err != nil {
		t.Fatal(err)
	}
	go r.Run(ctx)
	cfg := apiserver.Config{
		Cluster: r,
		Images:  imagetest.Busybox,
		Tokens:  apiserver.StaticToken(token),
		Log:     quietLog,
	}
	if o.server != nil {
		o.server(&cfg)
	}
	srv := httptest.NewServer(apiserver.New(cfg))
	t.Cleanup(srv.Close)
	f.harness = &harness{t: t, url: srv.URL}
	return f
}

func (fn *fleetNode) stopRegistration() {
	fn.stopReg()
	<-fn.regDone
}

// kill makes a node stop answering, as a kill -9 would: its server closes
// every connection and refuses new ones.
func (fn *fleetNode) kill() {
	fn.srv.CloseClientConnections()
	fn.srv.Listener.Close()
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *fleetHarness) get(id string) (int, api.Sandbox, []byte) {
	resp, b := f.json("GET", "/v1/sandboxes/"+id, "")
	var sb api.Sandbox
	if resp.StatusCode == http.StatusOK {
		json.Unmarshal(b, &sb)
	}
	return resp.StatusCode, sb, b
}

func (f *fleetHarness) list(query string) []api.Sandbox {
	f.t.Helper()
	resp, b := f.json("GET", "/v1/sandboxes"+query, "")
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("list: %d %s", resp.StatusCode, b)
	}
	var l api.SandboxList
	if err := json.Unmarshal(b, &l); err != nil {
		f.t.Fatal(err)
	}
	return l.Sandboxes
}

func (f *fleetHarness) nodeList() []api.Node {
	f.t.Helper()
	resp, b := f.json("GET", "/v1/nodes", "")
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("nodes: %d %s", resp.StatusCode, b)
	}
	var l api.NodeList
	json.Unmarshal(b, &l)
	return l.Nodes
}

func TestRouterPlacesAndRoutes(t *testing.T) {
	f := newFleet(t, "a1", "b2")
	perNode := map[string][]string{}
	for i := range 10 {
		sb := f.create(fmt.Sprintf(`{"image":"busybox","labels":{"i":"%d"}}`, i))
		perNode[sb.Node] = append(perNode[sb.Node], sb.ID)
		if !strings.HasPrefix(sb.ID, sb.Node+"-") {
			t.Errorf("sandbox %s on node %s", sb.ID, sb.Node)
		}
	}
	if len(perNode["a1"]) < 3 || len(perNode["b2"]) < 3 {
		t.Fatalf("placement: %d on a1, %d on b2; want both used", len(perNode["a1"]), len(perNode["b2"]))
	}
	// Explicit layers are resolved by the router too.
	sb := f.create(`{"layers":["base@1","tools@2"]}`)
	if sb.Image != "base@1+tools@2" {
		t.Errorf("create from layers: image %q", sb.Image)
	}

	for nid, ids := range perNode {
		id := ids[0]
		code, got, b := f.get(id)
		if code != http.StatusOK || got.Node != nid || got.State != api.StateRunning {
			t.Errorf("get %s: %d %s", id, code, b)
		}
		resp, b := f.json("POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":"echo routed to `+nid+`"}`)
		var res api.ExecResult
		json.Unmarshal(b, &res)
		if resp.StatusCode != http.StatusOK || res.Stdout != "routed to "+nid+"\n" {
			t.Errorf("exec on %s: %d %s", id, resp.StatusCode, b)
		}
		// Streamed through two hops.
		resp, b = f.json("POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":"echo one; echo two >&2","stream":true}`)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"data":"one\n"`) || !strings.Contains(string(b), `"result"`) {
			t.Errorf("streamed exec on %s: %d %s", id, resp.StatusCode, b)
		}
		resp, b = f.do("PUT", "/v1/sandboxes/"+id+"/files?path=/hello.txt", "application/octet-stream", strings.NewReader("hi "+nid))
		if resp.StatusCode != http.StatusNoContent {
			t.Errorf("write file on %s: %d %s", id, resp.StatusCode, b)
		}
		resp, b = f.do("GET", "/v1/sandboxes/"+id+"/files?path=/hello.txt", "", nil)
		if resp.StatusCode != http.StatusOK || string(b) != "hi "+nid {
			t.Errorf("read file on %s: %d %q", id, resp.StatusCode, b)
		}
	}

	list := f.list("")
	if len(list) != 11 {
		t.Fatalf("list: %d sandboxes, want 11", len(list))
	}
	for i := 1; i < len(list); i++ {
		if list[i].CreatedAt.Before(list[i-1].CreatedAt) {
			t.Errorf("list not oldest first at %d", i)
		}
	}
	if l := f.list("?label=i=3"); len(l) != 1 || l[0].Labels["i"] != "3" {
		t.Errorf("list ?label=i=3: %+v", l)
	}

	id := perNode["b2"][0]
	if resp, b := f.json("DELETE", "/v1/sandboxes/"+id, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d %s", resp.StatusCode, b)
	}
	if code, _, b := f.get(id); code != http.StatusNotFound {
		t.Errorf("get deleted: %d %s", code, b)
	}
	if code, _, _ := f.get("zz9-aaaaaaaaaaaaaaaa"); code != http.StatusNotFound {
		t.Errorf("get on a node never seen: %d, want 404", code)
	}
	nodes := f.nodeList()
	if len(nodes) != 2 || !nodes[0].Healthy || nodes[0].Address == "" || nodes[0].Pool != api.PoolOnPrem {
		t.Errorf("nodes: %+v", nodes)
	}
}

func TestRouterLostNode(t *testing.T) {
	f := newFleet(t, "a1", "b2")
	var onB []string
	for len(onB) < 2 {
		sb := f.create(`{"image":"busybox","labels":{"job":"x"}}`)
		if sb.Node == "b2" {
			onB = append(onB, sb.ID)
		}
	}
	time.Sleep(200 * time.Millisecond) // a refresh or two: b2's list cached
	b := f.nodes["b2"]
	b.kill()

	waitUntil(t, "b2's sandbox reported lost", 3*time.Second, func() bool {
		_, sb, _ := f.get(onB[0])
		return sb.State == api.StateLost
	})
	_, sb, _ := f.get(onB[0])
	if sb.Reason == "" || sb.Labels["job"] != "x" {
		t.Errorf("lost sandbox: %+v; want its reason and its cached labels", sb)
	}
	resp, body := f.json("POST", "/v1/sandboxes/"+onB[0]+"/exec", `{"cmd":"true"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != api.CodeSandboxLost {
		t.Errorf("exec on a lost sandbox: %d %s", resp.StatusCode, body)
	}
	lostN := 0
	for _, sb := range f.list("?label=job=x") {
		if sb.Node == "b2" {
			if sb.State != api.StateLost {
				t.Errorf("listed %s on unreachable b2 as %s", sb.ID, sb.State)
			}
			lostN++
		}
	}
	if lostN != len(onB) {
		t.Errorf("list shows %d lost sandboxes of b2, want %d", lostN, len(onB))
	}
	if l := f.list("?state=lost"); len(l) != len(onB) {
		t.Errorf("list ?state=lost: %d, want %d", len(l), len(onB))
	}
	for _, n := range f.nodeList() {
		if n.ID == "b2" && (n.Healthy || len(n.Problems) == 0) {
			t.Errorf("node ls shows unreachable b2 as %+v", n)
		}
	}
	// Placement avoids it.
	before := b.creates.Load()
	for range 5 {
		if sb := f.create(`{"image":"busybox"}`); sb.Node != "a1" {
			t.Errorf("created on %s with b2 down", sb.Node)
		}
	}
	if b.creates.Load() != before {
		t.Errorf("b2 was sent creates while unreachable")
	}

	// Its registration expires: the node left, its sandboxes stay lost.
	b.stopRegistration()
	waitUntil(t, "b2 deregistered", 5*time.Second, func() bool {
		_, ok := f.watcher.Node("b2")
		return !ok
	})
	if _, sb, body := f.get(onB[1]); sb.State != api.StateLost {
		t.Errorf("get on a node that left: %s", body)
	}
	lostN = 0
	for _, sb := range f.list("") {
		if sb.Node == "b2" && sb.State == api.StateLost {
			lostN++
		}
	}
	if lostN != len(onB) {
		t.Errorf("after deregistration, list shows %d lost sandboxes of b2, want %d", lostN, len(onB))
	}
	// Deleting a lost sandbox cannot happen now: 503, retryable.
	resp, body = f.json("DELETE", "/v1/sandboxes/"+onB[0], "")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("delete a lost sandbox: %d %s", resp.StatusCode, body)
	}
}

func TestRouterRetriesRefusals(t *testing.T) {
	f := newFleet(t, "a1", "b2")
	a, b := f.nodes["a1"], f.nodes["b2"]
	a.refuse.Store(true)
	for range 4 {
		if sb := f.create(`{"image":"busybox"}`); sb.Node != "b2" {
			t.Errorf("created on %s while a1 refuses", sb.Node)
		}
	}
	if a.creates.Load() == 0 {
		t.Errorf("a1 was never tried: the test shows no retry")
	}
	// Both refuse: the last refusal comes back, with the node's hint.
	b.refuse.Store(true)
	resp, body := f.json("POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if resp.StatusCode != http.StatusTooManyRequests || errorCode(t, body) != api.CodeNodeFull || resp.Header.Get("Retry-After") != "3" {
		t.Errorf("create with every node refusing: %d %s (Retry-After %q)", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
}

func TestRouterGCNeedsEveryNode(t *testing.T) {
	f := newFleet(t, "a1", "b2")
	f.create(`{"image":"busybox"}`)
	ctx := context.Background()
	r, err := apiserver.NewRouter(apiserver.RouterConfig{Fleet: f.watcher, Clients: nodeapi.NewClients(nil), Log: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	live, err := r.LiveLayers(ctx)
	if err != nil || len(live[imagetest.Busybox["busybox"].Layers[0]]) != 1 {
		t.Fatalf("live layers: %v, %v", live, err)
	}
	// With b2 gone, r goes by what b2 last said; a fresh router, which
	// never heard from b2, cannot tell.
	f.nodes["b2"].kill()
	waitUntil(t, "b2 unreachable", 3*time.Second, func() bool { return f.watcher.Lost("b2") })
	if _, err := r.LiveLayers(ctx); err != nil {
		t.Errorf("live layers with b2's cache: %v", err)
	}
	fresh, _ := apiserver.NewRouter(apiserver.RouterConfig{Fleet: f.watcher, Clients: nodeapi.NewClients(nil), Log: quietLog})
	if _, err := fresh.LiveLayers(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("live layers with an unknown node: %v, want ErrUnavailable", err)
	}
}

func TestRouterEndsCallsToANodeThatHangs(t *testing.T) {
	f := newFleet(t, "a1", "b2")
	var id string
	for id == "" {
		if sb := f.create(`{"image":"busybox"}`); sb.Node == "b2" {
			id = sb.ID
		}
	}
	f.nodes["b2"].hang.Store(true)
	start := time.Now()
	code, sb, body := f.get(id)
	if code != http.StatusOK || sb.State != api.StateLost {
		t.Errorf("get on a node that hangs: %d %s; want 200 lost", code, body)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("get on a node that hangs took %v", took)
	}
	// An exec started before the node hung ends as lost, not with the
	// TCP timeout.
	f.nodes["b2"].hang.Store(false)
	waitUntil(t, "b2 back", 3*time.Second, func() bool { return !f.watcher.Lost("b2") })
	done := make(chan []byte, 1)
	go func() {
		_, b := f.json("POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":"sleep 30"}`)
		done <- b
	}()
	time.Sleep(300 * time.Millisecond)
	f.nodes["b2"].hang.Store(true)
	select {
	case b := <-done:
		if !strings.Contains(string(b), api.CodeSandboxLost) {
			t.Errorf("exec cut by a lost node: %s", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("exec to a node that went lost still running after 5s")
	}
}
