package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/store"
)

// fakeSource answers polls for nodes that are up, fails fast for nodes
// that are down, and hangs until the poll's deadline for nodes that hang.
type fakeSource struct {
	mu          sync.Mutex
	down, hang  map[string]bool
	usage       map[string]api.Capacity
	calls       map[string]int
	secrets     map[string]string // the secret each node was last polled with
	inflight    int
	maxInflight int
}

func newSource() *fakeSource {
	return &fakeSource{down: map[string]bool{}, hang: map[string]bool{}, usage: map[string]api.Capacity{}, calls: map[string]int{}, secrets: map[string]string{}}
}

func (s *fakeSource) Status(ctx context.Context, n fleet.Registration) (api.Node, error) {
	s.mu.Lock()
	s.calls[n.ID]++
	s.secrets[n.ID] = n.Secret
	s.inflight++
	s.maxInflight = max(s.maxInflight, s.inflight)
	down, hang, usage := s.down[n.ID], s.hang[n.ID], s.usage[n.ID]
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight--
		s.mu.Unlock()
	}()
	switch {
	case hang:
		<-ctx.Done()
		return api.Node{}, ctx.Err()
	case down:
		return api.Node{}, errdefs.Unavailable("connection refused")
	}
	return api.Node{
		ID: n.ID, Backends: []string{api.BackendContainer}, Capacity: n.Capacity,
		Usage: usage, Healthy: true, UpdatedAt: time.Now(),
	}, nil
}

func (s *fakeSource) set(f func(s *fakeSource)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *fakeSource) callsTo(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

var nodeCapacity = api.Capacity{CPU: 16, Memory: 64 << 30, Sandboxes: 100}

func memStore(t *testing.T) store.Watcher {
	s := store.Memory().(store.Watcher)
	t.Cleanup(func() { s.Close() })
	return s
}

// register runs a Registrar for node id, with secret "secret-<id>", until
// the test ends or the returned cancel is called.
func register(t *testing.T, st store.Watcher, id string, ttl time.Duration) (*fleet.Registrar, context.CancelFunc) {
	t.Helper()
	return registerSecret(t, st, id, "secret-"+id, ttl)
}

func registerSecret(t *testing.T, st store.Watcher, id, secret string, ttl time.Duration) (*fleet.Registrar, context.CancelFunc) {
	t.Helper()
	r, err := fleet.NewRegistrar(fleet.RegistrarConfig{
		Store: st, TTL: ttl, Secret: secret,
		Node: api.Node{ID: id, Address: "http://" + id + ":7000", Labels: map[string]string{"rack": "r1"},
			Backends: []string{api.BackendContainer}, Capacity: nodeCapacity},
	})
	if err != nil {
		t.Fatalf("NewRegistrar: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	waitFor(t, "registration of "+id, 5*time.Second, func() bool {
		_, err := st.Get(context.Background(), fleet.Key(id))
		return err == nil
	})
	return r, stop
}

// start runs a watcher until the test ends or the returned stop is called,
// and waits until it is Ready.
func start(t *testing.T, cfg fleet.Config) (*fleet.Watcher, func()) {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	w, err := fleet.New(cfg)
	if err != nil {
		t.Fatalf("fleet.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	select {
	case <-w.Ready():
	case <-time.After(5 * time.Second):
		t.Fatalf("watcher not ready within 5s")
	}
	return w, stop
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ids(nodes []fleet.NodeView) string {
	var s []string
	for _, n := range nodes {
		s = append(s, n.ID)
	}
	return fmt.Sprint(s)
}

func TestWatcherRebuildsAfterRestart(t *testing.T) {
	st := memStore(t)
	src := newSource()
	for i, id := range []string{"a", "b", "c"} {
		register(t, st, id, time.Second)
		src.usage[id] = api.Capacity{CPU: float64(i + 1), Memory: 1 << 30, Sandboxes: i + 1}
	}
	w1, stop1 := start(t, fleet.Config{Store: st, Source: src})
	check := func(w *fleet.Watcher) {
		t.Helper()
		nodes := w.Snapshot()
		if got := ids(nodes); got != "[a b c]" {
			t.Fatalf("nodes: got %s, want [a b c]", got)
		}
		for i, n := range nodes {
			if !n.Healthy || n.Unreachable || !n.Polled {
				t.Errorf("node %s: got healthy %v unreachable %v polled %v, want a healthy polled node", n.ID, n.Healthy, n.Unreachable, n.Polled)
			}
			if n.Usage.Sandboxes != i+1 || n.Capacity != nodeCapacity {
				t.Errorf("node %s: got usage %+v capacity %+v, want %d sandboxes and %+v", n.ID, n.Usage, n.Capacity, i+1, nodeCapacity)
			}
			if n.Pool != api.PoolOnPrem || n.Labels["rack"] != "r1" || n.Address != "http://"+n.ID+":7000" {
				t.Errorf("node %s: registration not in view: pool %q labels %v address %q", n.ID, n.Pool, n.Labels, n.Address)
			}
		}
	}
	check(w1)
	stop1()

	// A new watcher, e.g. after an apiserver restart, holds nothing of
	// the old one's and rebuilds the same view.
	w2, _ := start(t, fleet.Config{Store: st, Source: src})
	check(w2)
}

func TestWatcherFollowsRegistrations(t *testing.T) {
	st := memStore(t)
	src := newSource()
	w, _ := start(t, fleet.Config{Store: st, Source: src})
	if got := ids(w.Snapshot()); got != "[]" {
		t.Fatalf("empty fleet: got %s", got)
	}
	if !w.Lost("x") {
		t.Fatalf("Lost(x) of an unregistered node: got false, want true")
	}
	_, stopA := register(t, st, "a", time.Second)
	waitFor(t, "node a healthy", 5*time.Second, func() bool {
		n, ok := w.Node("a")
		return ok && n.Healthy
	})
	stopA()
	if err := st.Delete(context.Background(), fleet.Key("a")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node a gone", 5*time.Second, func() bool {
		_, ok := w.Node("a")
		return !ok
	})
	if !w.Lost("a") {
		t.Fatalf("Lost(a) after deregistration: got false, want true")
	}
	// A malformed registration is skipped, not fatal.
	if err := st.Put(context.Background(), fleet.Key("bad"), []byte("{")); err != nil {
		t.Fatal(err)
	}
	register(t, st, "b", time.Second)
	waitFor(t, "node b", 5*time.Second, func() bool { _, ok := w.Node("b"); return ok })
	if got := ids(w.Snapshot()); got != "[b]" {
		t.Fatalf("nodes: got %s, want [b]", got)
	}
}

func TestLeaseExpiryRemovesNode(t *testing.T) {
	st := memStore(t)
	src := newSource()
	const ttl = 300 * time.Millisecond
	register(t, st, "a", ttl)
	_, stopB := register(t, st, "b", ttl)
	w, _ := start(t, fleet.Config{Store: st, Source: src})
	if got := ids(w.Snapshot()); got != "[a b]" {
		t.Fatalf("nodes: got %s, want [a b]", got)
	}
	// b's agent dies: nothing renews its lease. Its answers to polls are
	// beside the point: the registration is gone.
	stopB()
	start := time.Now()
	waitFor(t, "node b to drop out", 5*time.Second, func() bool { _, ok := w.Node("b"); return !ok })
	if d := time.Since(start); d < ttl/2 {
		t.Fatalf("node b dropped after %v, before its lease's TTL %v", d, ttl)
	}
	if !w.Lost("b") || w.Lost("a") {
		t.Fatalf("Lost: got a=%v b=%v, want a=false b=true", w.Lost("a"), w.Lost("b"))
	}
	// a, kept alive for many TTLs, stays.
	time.Sleep(3 * ttl)
	if n, ok := w.Node("a"); !ok || !n.Healthy {
		t.Fatalf("node a: got %+v, %v; want healthy", n, ok)
	}
}

func TestRegistrarReregistersAfterLeaseLoss(t *testing.T) {
	st := memStore(t)
	r, _ := register(t, st, "a", 300*time.Millisecond)
	first := r.Lease()
	if first == 0 {
		t.Fatalf("Lease: got 0 after registering")
	}
	// Lost the lease, as after etcd was out of reach for a TTL.
	if err := st.Revoke(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new registration", 5*time.Second, func() bool {
		_, err := st.Get(context.Background(), fleet.Key("a"))
		return err == nil && r.Lease() != first
	})
}

func TestRegistrarDeregister(t *testing.T) {
	st := memStore(t)
	r, stop := register(t, st, "a", time.Second)
	stop()
	if err := r.Deregister(context.Background()); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	if _, err := st.Get(context.Background(), fleet.Key("a")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("registration after Deregister: got %v, want ErrNotFound", err)
	}
}

// TestRegistrationSecret: each node's secret goes from its registration to
// the polls of that node and to its view, and a new registration (an agent
// restarted with a fresh secret) replaces it.
func TestRegistrationSecret(t *testing.T) {
	st := memStore(t)
	src := newSource()
	register(t, st, "a", time.Second)
	_, stopB := register(t, st, "b", time.Second)
	w, _ := start(t, fleet.Config{Store: st, Source: src})
	for _, id := range []string{"a", "b"} {
		v, _ := w.Node(id)
		src.mu.Lock()
		polled := src.secrets[id]
		src.mu.Unlock()
		if v.Secret != "secret-"+id || polled != "secret-"+id {
			t.Errorf("node %s: view secret %q, polled with %q; want %q", id, v.Secret, polled, "secret-"+id)
		}
	}
	stopB()
	registerSecret(t, st, "b", "fresh", time.Second)
	waitFor(t, "b's new secret in its polls", 5*time.Second, func() bool {
		v, _ := w.Node("b")
		src.mu.Lock()
		defer src.mu.Unlock()
		return v.Secret == "fresh" && src.secrets["b"] == "fresh"
	})
	// The stored registration holds the secret; the node's fields stay
	// where api.Node has them.
	kv, err := st.Get(context.Background(), fleet.Key("a"))
	if err != nil {
		t.Fatal(err)
	}
	var reg fleet.Registration
	if err := json.Unmarshal(kv.Value, &reg); err != nil || reg.Secret != "secret-a" || reg.ID != "a" || reg.Address == "" {
		t.Errorf("stored registration %s: %+v, %v", kv.Value, reg, err)
	}
}

// refusingLeaser is a registration endpoint that refuses the node's
// credentials, as an apiserver does a revoked node token.
type refusingLeaser struct {
	store.Watcher
	puts atomic.Int32
}

func (l *refusingLeaser) PutWithLease(context.Context, string, []byte, time.Duration) (store.LeaseID, error) {
	l.puts.Add(1)
	return 0, errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, "invalid token")
}

func TestRegistrarStopsWhenRefused(t *testing.T) {
	l := &refusingLeaser{Watcher: memStore(t)}
	r, err := fleet.NewRegistrar(fleet.RegistrarConfig{Store: l, TTL: time.Second, Node: api.Node{ID: "a", Address: "a:1"}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrUnauthenticated) || l.puts.Load() != 1 {
			t.Errorf("Run: %v after %d tries, want ErrUnauthenticated after 1", err, l.puts.Load())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run still retrying a refused registration after 5s")
	}
}

func TestRegistrarValidates(t *testing.T) {
	st := memStore(t)
	for _, n := range []api.Node{{ID: ""}, {ID: "a/b"}, {ID: "a-b"}, {ID: "a", Pool: "moon"}} {
		if _, err := fleet.NewRegistrar(fleet.RegistrarConfig{Store: st, Node: n}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("NewRegistrar(id %q pool %q): got %v, want ErrInvalid", n.ID, n.Pool, err)
		}
	}
}

func TestUnreachableAfterMissedPolls(t *testing.T) {
	st := memStore(t)
	src := newSource()
	register(t, st, "a", time.Second)
	register(t, st, "b", time.Second)
	const interval = 50 * time.Millisecond
	w, _ := start(t, fleet.Config{Store: st, Source: src, PollInterval: interval, MaxMissed: 3})

	src.set(func(s *fakeSource) { s.down["b"] = true })
	down := time.Now()
	waitFor(t, "node b unreachable", 5*time.Second, func() bool { n, _ := w.Node("b"); return n.Unreachable })
	// Three misses take at least two intervals after the first.
	if d := time.Since(down); d < 2*interval {
		t.Fatalf("node b unreachable after %v, want >= %v (3 missed polls)", d, 2*interval)
	}
	t.Logf("node b unreachable %v after it went down (3 polls at %v)", time.Since(down).Round(time.Millisecond), interval)
	b, _ := w.Node("b")
	if b.Healthy || b.Missed < 3 || !w.Lost("b") {
		t.Fatalf("node b: got healthy %v missed %d lost %v, want unhealthy, >=3, lost", b.Healthy, b.Missed, w.Lost("b"))
	}
	if a, _ := w.Node("a"); !a.Healthy || w.Lost("a") {
		t.Fatalf("node a: got healthy %v lost %v, want healthy and not lost", a.Healthy, w.Lost("a"))
	}

	src.set(func(s *fakeSource) { s.down["b"] = false })
	waitFor(t, "node b healthy again", 5*time.Second, func() bool { n, _ := w.Node("b"); return n.Healthy })
	if b, _ := w.Node("b"); b.Missed != 0 || b.Unreachable || w.Lost("b") {
		t.Fatalf("node b after recovery: got missed %d unreachable %v lost %v", b.Missed, b.Unreachable, w.Lost("b"))
	}
}

func TestSlowNodeDoesNotDelayOthers(t *testing.T) {
	st := memStore(t)
	src := newSource()
	for _, id := range []string{"a", "b", "c", "slow"} {
		register(t, st, id, time.Second)
	}
	src.hang["slow"] = true
	const interval = 20 * time.Millisecond
	w, _ := start(t, fleet.Config{Store: st, Source: src, PollInterval: interval, PollTimeout: 200 * time.Millisecond, Workers: 2})
	before := src.callsTo("a")
	time.Sleep(400 * time.Millisecond)
	// Two workers, one of them stuck on the slow node for 200 ms at a
	// time: the other keeps every fast node polled at about its interval.
	for _, id := range []string{"a", "b", "c"} {
		if n := src.callsTo(id) - before; n < 5 {
			t.Errorf("node %s polled %d times in 400ms at %v, want >= 5", id, n, interval)
		}
		if n, _ := w.Node(id); !n.Healthy {
			t.Errorf("node %s: unhealthy", id)
		}
	}
	waitFor(t, "slow node unreachable", 5*time.Second, func() bool { n, _ := w.Node("slow"); return n.Unreachable })
}

func TestPollWorkersBounded(t *testing.T) {
	st := memStore(t)
	src := newSource()
	for i := range 100 {
		id := fmt.Sprintf("n%d", i)
		if err := st.Put(context.Background(), fleet.Key(id), []byte(`{"capacity":{"cpu":1}}`)); err != nil {
			t.Fatal(err)
		}
		src.hang[id] = true
	}
	w, _ := start(t, fleet.Config{Store: st, Source: src, PollInterval: 10 * time.Millisecond, PollTimeout: 20 * time.Millisecond, Workers: 8, MaxMissed: 2})
	waitFor(t, "every node unreachable", 10*time.Second, func() bool {
		for _, n := range w.Snapshot() {
			if !n.Unreachable {
				return false
			}
		}
		return true
	})
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.maxInflight > 8 {
		t.Fatalf("concurrent polls: got %d, want <= 8 workers", src.maxInflight)
	}
}

func TestCommitCountsUntilPolled(t *testing.T) {
	st := memStore(t)
	src := newSource()
	register(t, st, "a", time.Second)
	w, _ := start(t, fleet.Config{Store: st, Source: src, PollInterval: 20 * time.Millisecond})
	one := api.Capacity{CPU: 1, Memory: 1 << 30, Sandboxes: 1}
	if err := w.Reserve("a", one); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	n, _ := w.Node("a")
	if got := n.Used(); got != one {
		t.Fatalf("Used after Reserve: got %+v, want %+v", got, one)
	}
	// The create succeeded; the node reports it from now on.
	src.set(func(s *fakeSource) { s.usage["a"] = one })
	w.Commit("a", one)
	waitFor(t, "the commit to be covered by a poll", 5*time.Second, func() bool { return n.Reserved() == api.Capacity{} })
	if got := n.Used(); got != one {
		t.Fatalf("Used after a poll covered the commit: got %+v, want %+v (counted once)", got, one)
	}
	if err := w.Reserve("a", one); err != nil {
		t.Fatal(err)
	}
	w.Release("a", one)
	if got := n.Reserved(); got != (api.Capacity{}) {
		t.Fatalf("Reserved after Release: got %+v, want none", got)
	}
	if err := w.Reserve("nope", one); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Reserve on an unknown node: got %v, want ErrNotFound", err)
	}
}

func TestReserveHeadroom(t *testing.T) {
	f := fleet.NewStatic(api.Node{ID: "a", Healthy: true, Capacity: api.Capacity{CPU: 2, Memory: 4 << 30, Sandboxes: 3}, Usage: api.Capacity{Sandboxes: 1}})
	big := api.Capacity{CPU: 1.5, Memory: 1 << 30, Sandboxes: 1}
	small := api.Capacity{CPU: 1, Sandboxes: 1}
	if err := f.Reserve("a", big); err != nil {
		t.Fatalf("Reserve(1.5 cpu) on 2 cpu: %v", err)
	}
	if err := f.Reserve("a", small); !errors.Is(err, errdefs.ErrExhausted) || errdefs.Code(err) != api.CodeNodeFull {
		t.Fatalf("Reserve(1 cpu) next to 1.5: got %v, want ErrExhausted node_full", err)
	}
	f.Release("a", big)
	if err := f.Reserve("a", small); err != nil {
		t.Fatalf("Reserve after Release: %v", err)
	}
	if err := f.Reserve("a", api.Capacity{Sandboxes: 1}); err != nil {
		t.Fatalf("Reserve(3rd sandbox of 3): %v", err)
	}
	if err := f.Reserve("a", api.Capacity{Sandboxes: 1}); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("Reserve(4th sandbox of 3): got %v, want ErrExhausted", err)
	}
}

func TestStatic(t *testing.T) {
	f := fleet.NewStatic(api.Node{ID: "b", Healthy: true}, api.Node{ID: "a", Pool: api.PoolCloud})
	nodes := f.Snapshot()
	if got := ids(nodes); got != "[a b]" {
		t.Fatalf("Snapshot: got %s, want [a b]", got)
	}
	if nodes[0].Healthy || !nodes[1].Healthy || nodes[1].Pool != api.PoolOnPrem || nodes[0].Pool != api.PoolCloud {
		t.Fatalf("Snapshot: got %+v", nodes)
	}
	f.Remove("a")
	if got := ids(f.Snapshot()); got != "[b]" {
		t.Fatalf("after Remove: got %s, want [b]", got)
	}
	if got := ids(nodes); got != "[a b]" {
		t.Fatalf("an earlier snapshot changed: got %s, want [a b]", got)
	}
}

// TestWatcherConcurrency exercises reads, reservations, registrations and
// polls at once; run with -race.
func TestWatcherConcurrency(t *testing.T) {
	st := memStore(t)
	src := newSource()
	for i := range 10 {
		register(t, st, fmt.Sprintf("n%d", i), time.Second)
	}
	w, _ := start(t, fleet.Config{Store: st, Source: src, PollInterval: 5 * time.Millisecond, Workers: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	res := api.Capacity{CPU: 0.1, Sandboxes: 1}
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				for _, n := range w.Snapshot() {
					_ = n.Used()
				}
				id := fmt.Sprintf("n%d", (g+i)%10)
				if w.Reserve(id, res) == nil {
					if i%2 == 0 {
						w.Commit(id, res)
					} else {
						w.Release(id, res)
					}
				}
				w.Lost(id)
			}
		})
	}
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			id := fmt.Sprintf("x%d", i%5)
			st.Put(context.Background(), fleet.Key(id), []byte(`{}`))
			src.set(func(s *fakeSource) { s.down[id] = i%3 == 0 })
			if i%2 == 0 {
				st.Delete(context.Background(), fleet.Key(id))
			}
			time.Sleep(time.Millisecond)
		}
	})
	wg.Wait()
}

// TestWatcherEtcd runs registration, watch and lease expiry over a real
// (embedded) etcd member.
func TestWatcherEtcd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, err := store.StartEmbedded(ctx, t.TempDir())
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	defer e.Close()
	src := newSource()
	register(t, e, "a", time.Second)
	_, stopB := register(t, e, "b", time.Second)
	w, _ := start(t, fleet.Config{Store: e, Source: src})
	if got := ids(w.Snapshot()); got != "[a b]" {
		t.Fatalf("nodes: got %s, want [a b]", got)
	}
	stopB()
	waitFor(t, "node b's lease to expire", 10*time.Second, func() bool { _, ok := w.Node("b"); return !ok })
	if _, ok := w.Node("a"); !ok || !w.Lost("b") {
		t.Fatalf("after b expired: a present %v, b lost %v; want true, true", ok, w.Lost("b"))
	}
}
