package placement_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/placement"
)

var (
	cap8   = api.Capacity{CPU: 8, Memory: 16 << 30, Sandboxes: 10}
	oneCPU = api.Capacity{CPU: 1, Memory: 1 << 30, Sandboxes: 1}
	strats = []placement.Strategy{placement.PowerOfK, placement.Oracle, placement.Random}
)

func node(id string, f func(n *api.Node)) api.Node {
	n := api.Node{ID: id, Pool: api.PoolOnPrem, Healthy: true, Backends: []string{api.BackendContainer}, Capacity: cap8}
	if f != nil {
		f(&n)
	}
	return n
}

func newPlacer(t *testing.T, cfg placement.Config) *placement.Placer {
	t.Helper()
	p, err := placement.New(cfg)
	if err != nil {
		t.Fatalf("placement.New: %v", err)
	}
	return p
}

// chosen places req n times, releasing each reservation, and returns the
// nodes chosen, sorted, or the first error.
func chosen(t *testing.T, p *placement.Placer, req placement.Request, n int) ([]string, error) {
	t.Helper()
	set := map[string]bool{}
	for range n {
		id, err := p.Place(context.Background(), req)
		if err != nil {
			return nil, err
		}
		p.Done(id, req, false)
		set[id] = true
	}
	var out []string
	for id := range set {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}

func TestFilters(t *testing.T) {
	f := fleet.NewStatic(
		node("gpu", func(n *api.Node) { n.Labels = map[string]string{"gpu-adjacent": "true", "zone": "a"} }),
		node("vm", func(n *api.Node) { n.Backends = []string{api.BackendContainer, api.BackendMicroVM} }),
		node("sick", func(n *api.Node) {
			n.Healthy = false
			n.Backends = []string{api.BackendVM}
			n.Labels = map[string]string{"only": "sick"}
		}),
		node("cloud", func(n *api.Node) { n.Pool = api.PoolCloud }),
		node("busy", func(n *api.Node) { n.Usage = api.Capacity{CPU: 7.5, Memory: 1 << 30, Sandboxes: 1} }),
		node("tiny", func(n *api.Node) {
			n.Labels = map[string]string{"tiny": "yes"}
			n.Capacity = api.Capacity{CPU: 8, Memory: 16 << 30, Sandboxes: 2}
		}),
	)
	// One sandbox reserved in flight on "tiny", one already running.
	f.Set(node("tiny", func(n *api.Node) {
		n.Labels = map[string]string{"tiny": "yes"}
		n.Capacity = api.Capacity{CPU: 8, Memory: 16 << 30, Sandboxes: 2}
		n.Usage = api.Capacity{Sandboxes: 1}
	}))
	if err := f.Reserve("tiny", api.Capacity{Sandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	cpu := func(c float64) api.Capacity { return api.Capacity{CPU: c, Memory: 1 << 30} }

	tests := []struct {
		name     string
		req      placement.Request
		want     string // chosen nodes, or an error code
		wantKind error
	}{
		{"any with room", placement.Request{Resources: cpu(0.5)}, "[busy gpu vm]", nil}, // tiny: 1 running + 1 in flight of 2
		{"headroom", placement.Request{Resources: cpu(1)}, "[gpu vm]", nil},
		{"in-flight reservation counts", placement.Request{Resources: cpu(1), Labels: map[string]string{"tiny": "yes"}}, api.CodeNoCapacity, errdefs.ErrUnavailable},
		{"backend", placement.Request{Backend: api.BackendMicroVM, Resources: cpu(1)}, "[vm]", nil},
		{"backend nowhere healthy", placement.Request{Backend: api.BackendVM, Resources: cpu(1)}, api.CodeNoMatchingNode, errdefs.ErrUnavailable},
		{"labels", placement.Request{Resources: cpu(1), Labels: map[string]string{"gpu-adjacent": "true"}}, "[gpu]", nil},
		{"labels must all match", placement.Request{Resources: cpu(1), Labels: map[string]string{"gpu-adjacent": "true", "zone": "b"}}, api.CodeNoMatchingNode, errdefs.ErrUnavailable},
		{"unhealthy node skipped", placement.Request{Resources: cpu(1), Labels: map[string]string{"only": "sick"}}, api.CodeNoMatchingNode, errdefs.ErrUnavailable},
		{"pool", placement.Request{Resources: cpu(1), Pool: api.PoolCloud}, "[cloud]", nil},
		{"not burstable stays home", placement.Request{Resources: cpu(8)}, "[gpu vm]", nil},
		{"too big everywhere", placement.Request{Resources: cpu(9)}, api.CodeNoCapacity, errdefs.ErrUnavailable},
		{"burstable spills when home is full", placement.Request{Resources: cpu(9), Burstable: true}, api.CodeNoCapacity, errdefs.ErrUnavailable},
		{"burstable spills when home has no room", placement.Request{Resources: cpu(1), Burstable: true, Labels: map[string]string{"tiny": "yes"}}, api.CodeNoCapacity, errdefs.ErrUnavailable},
		{"exclude", placement.Request{Resources: cpu(2), Exclude: []string{"gpu"}}, "[vm]", nil},
		{"all excluded: refused", placement.Request{Resources: cpu(2), Exclude: []string{"gpu", "vm"}}, api.CodeNodeFull, errdefs.ErrExhausted},
	}
	for _, s := range strats {
		p := newPlacer(t, placement.Config{Fleet: f, Strategy: s})
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/%s", s, tt.name), func(t *testing.T) {
				got, err := chosen(t, p, tt.req, 200)
				if tt.wantKind != nil {
					if !errors.Is(err, tt.wantKind) || errdefs.Code(err) != tt.want {
						t.Fatalf("got %v, %v; want %v with code %s", got, err, tt.wantKind, tt.want)
					}
					t.Logf("error: %v", err)
					return
				}
				if err != nil {
					t.Fatalf("Place: %v", err)
				}
				// Random reaches every feasible node; the others only
				// those they rank first (never the fullest, for k=2 of 3).
				if s == placement.Random && fmt.Sprint(got) != tt.want {
					t.Fatalf("chosen nodes: got %v, want %s", got, tt.want)
				}
				for _, id := range got {
					if !strings.Contains(tt.want, id) {
						t.Fatalf("chosen nodes: got %v, want only some of %s", got, tt.want)
					}
				}
			})
		}
	}
}

func TestOracleTakesLeastLoaded(t *testing.T) {
	f := fleet.NewStatic(
		node("a", func(n *api.Node) { n.Usage = api.Capacity{CPU: 4} }),
		node("b", func(n *api.Node) { n.Usage = api.Capacity{Memory: 12 << 30} }), // fuller by memory
		node("c", func(n *api.Node) { n.Usage = api.Capacity{CPU: 2} }),
	)
	p := newPlacer(t, placement.Config{Fleet: f, Strategy: placement.Oracle})
	got, err := chosen(t, p, placement.Request{Resources: oneCPU}, 20)
	if err != nil || fmt.Sprint(got) != "[c]" {
		t.Fatalf("oracle: got %v, %v; want [c]", got, err)
	}
}

// TestOracleRanksByRealUse: nodes that asked for the same show their
// real use; the oracle takes the one least busy by it (best-effort CPU
// counting little), and a node that reports none is not thought busy.
func TestOracleRanksByRealUse(t *testing.T) {
	inUse := func(cpu, be float64, mem api.Quantity) func(*api.Node) {
		return func(n *api.Node) {
			n.Usage = api.Capacity{CPU: 2}
			n.InUse = &api.NodeInUse{CPU: cpu, CPUBestEffort: be, Cores: 2, Memory: mem, MemoryLimit: 10 << 30}
		}
	}
	f := fleet.NewStatic(
		node("a", inUse(1.5, 0, 1<<30)),   // busy CPU
		node("b", inUse(0.1, 0, 9<<30)),   // memory nearly all in use
		node("c", inUse(0.2, 1.8, 2<<30)), // busy with best-effort work only
	)
	p := newPlacer(t, placement.Config{Fleet: f, Strategy: placement.Oracle})
	got, err := chosen(t, p, placement.Request{Resources: oneCPU}, 20)
	if err != nil || fmt.Sprint(got) != "[c]" {
		t.Fatalf("oracle by real use: got %v, %v; want [c]", got, err)
	}
	if l := placement.RealLoad(nil); l != 0 {
		t.Errorf("RealLoad(nil) = %v", l)
	}
	if l := placement.RealLoad(&api.NodeInUse{CPU: 1, Cores: 2, CPUUnmeasured: "no cgroup", Memory: 1, MemoryLimit: 4}); l != 0.25 {
		t.Errorf("RealLoad with CPU unmeasured = %v, want memory's 0.25", l)
	}
}

func TestLoad(t *testing.T) {
	c := api.Capacity{CPU: 10, Memory: 100, Sandboxes: 4}
	for _, tt := range []struct {
		used api.Capacity
		want float64
	}{
		{api.Capacity{}, 0},
		{api.Capacity{CPU: 5}, 0.5},
		{api.Capacity{CPU: 5, Memory: 80}, 0.8},
		{api.Capacity{CPU: 1, Memory: 10, Sandboxes: 4}, 1},
	} {
		if got := placement.Load(c, tt.used); got != tt.want {
			t.Errorf("Load(%+v): got %v, want %v", tt.used, got, tt.want)
		}
	}
	if got := placement.Load(api.Capacity{CPU: 1}, api.Capacity{Memory: 1}); got != 1 {
		t.Errorf("Load with use of a dimension without capacity: got %v, want 1", got)
	}
}

// TestSamplesUniformly: with k=1 every feasible node is equally likely.
func TestSamplesUniformly(t *testing.T) {
	var nodes []api.Node
	for i := range 8 {
		nodes = append(nodes, node(fmt.Sprint(i), func(n *api.Node) { n.Healthy = i%2 == 0 }))
	}
	p := newPlacer(t, placement.Config{Fleet: fleet.NewStatic(nodes...), Strategy: placement.Random, Rand: rand.New(rand.NewPCG(1, 2))})
	counts := map[string]int{}
	const n = 8000
	for range n {
		id, err := p.Place(context.Background(), placement.Request{Resources: oneCPU})
		if err != nil {
			t.Fatal(err)
		}
		p.Done(id, placement.Request{Resources: oneCPU}, false)
		counts[id]++
	}
	for _, id := range []string{"0", "2", "4", "6"} {
		if c := counts[id]; c < n/4*85/100 || c > n/4*115/100 {
			t.Errorf("node %s chosen %d times of %d, want about %d", id, c, n, n/4)
		}
	}
	if len(counts) != 4 {
		t.Errorf("chosen: got %v, want only the 4 healthy nodes", counts)
	}
}

// TestPowerOfKBalance simulates one DSec unit (160 nodes) through 50,000
// placements with random sizes and departures, and checks that k=2
// balances within 10% of the all-nodes oracle and far better than random.
func TestPowerOfKBalance(t *testing.T) {
	cfg := placement.SimConfig{Seed: 42}
	if testing.Short() || raceEnabled {
		cfg.Placements = 20_000
	}
	res, err := placement.Simulate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]placement.SimResult{}
	for _, r := range res {
		t.Logf("%v", r)
		by[r.Name] = r
		if r.Rejected > 0 {
			t.Errorf("%s rejected %d placements at %.0f%% mean load", r.Name, r.Rejected, 100*r.MeanLoad)
		}
	}
	random, k2, k3, oracle := by["random"], by["k=2"], by["k=3"], by["oracle"]
	if ratio := k2.Imbalance / oracle.Imbalance; ratio > 1.10 {
		t.Errorf("k=2 max/mean %.3f is %.1f%% above the oracle's %.3f, want <= 10%%", k2.Imbalance, 100*(ratio-1), oracle.Imbalance)
	}
	if k3.Imbalance > k2.Imbalance+0.01 {
		t.Errorf("k=3 max/mean %.3f, worse than k=2's %.3f", k3.Imbalance, k2.Imbalance)
	}
	// Excess over perfect balance: random's should be several times k=2's.
	if ex2, exr := k2.Imbalance-1, random.Imbalance-1; exr < 2.5*ex2 {
		t.Errorf("random max/mean %.3f vs k=2 %.3f: want random's excess >= 2.5x k=2's", random.Imbalance, k2.Imbalance)
	}
}

// refusing is a create func whose nodes in refuse answer 429.
type refusing struct {
	mu     sync.Mutex
	refuse map[string]bool
	tried  []string
}

func (r *refusing) create(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tried = append(r.tried, id)
	if r.refuse[id] {
		return errdefs.Exhausted(api.CodeNodeFull, 2*time.Second, "node %s is full", id)
	}
	return nil
}

func TestDoRetriesOnRefusal(t *testing.T) {
	nodes := []api.Node{node("a", nil), node("b", nil), node("c", nil), node("d", nil), node("e", nil)}
	req := placement.Request{Resources: oneCPU}

	t.Run("another node takes it", func(t *testing.T) {
		f := fleet.NewStatic(nodes...)
		p := newPlacer(t, placement.Config{Fleet: f, Strategy: placement.Oracle})
		r := &refusing{refuse: map[string]bool{"a": true, "b": true, "c": true}}
		// Make the refusers the least loaded, so they are tried first.
		for _, id := range []string{"d", "e"} {
			f.Set(node(id, func(n *api.Node) { n.Usage = api.Capacity{CPU: 4} }))
		}
		id, err := p.Do(context.Background(), req, r.create)
		if err != nil || (id != "d" && id != "e") {
			t.Fatalf("Do: got %q, %v; want d or e", id, err)
		}
		if len(r.tried) != 4 || fmt.Sprint(sorted(r.tried[:3])) != "[a b c]" {
			t.Fatalf("tried: got %v, want a, b, c in some order, then d or e", r.tried)
		}
		for _, n := range f.Snapshot() {
			want := api.Capacity{}
			if n.ID == id {
				want = oneCPU // committed until the node reports it
			}
			if got := n.Reserved(); got != want {
				t.Errorf("node %s reserved: got %+v, want %+v", n.ID, got, want)
			}
		}
		// The refusers cool down: the next placements avoid them.
		got, err := chosen(t, p, req, 50)
		if err != nil || fmt.Sprint(got) == "" || containsAny(got, "a", "b", "c") {
			t.Fatalf("after refusals: chose %v, %v; want only d and e", got, err)
		}
	})

	t.Run("every try refused", func(t *testing.T) {
		f := fleet.NewStatic(nodes...)
		p := newPlacer(t, placement.Config{Fleet: f, Retries: 3})
		r := &refusing{refuse: map[string]bool{"a": true, "b": true, "c": true, "d": true, "e": true}}
		_, err := p.Do(context.Background(), req, r.create)
		if !errors.Is(err, errdefs.ErrExhausted) || errdefs.RetryAfter(err) != 2*time.Second {
			t.Fatalf("Do: got %v, want the nodes' 429 with Retry-After 2s", err)
		}
		if len(r.tried) != 4 || len(sorted(r.tried)) != len(dedup(r.tried)) {
			t.Fatalf("tried: got %v, want 4 distinct nodes (1 + 3 retries)", r.tried)
		}
		// With every other node cooling down, placement itself answers 429.
		var untried []string
		for _, n := range nodes {
			if !dedup(r.tried)[n.ID] {
				untried = append(untried, n.ID)
			}
		}
		_, err = p.Place(context.Background(), placement.Request{Resources: oneCPU, Exclude: untried})
		if !errors.Is(err, errdefs.ErrExhausted) || errdefs.RetryAfter(err) <= 0 {
			t.Fatalf("Place with every node refusing or excluded: got %v, want ErrExhausted with a Retry-After", err)
		}
		for _, n := range f.Snapshot() {
			if got := n.Reserved(); got != (api.Capacity{}) {
				t.Errorf("node %s reserved after refusals: got %+v, want none", n.ID, got)
			}
		}
	})

	t.Run("fewer nodes than retries", func(t *testing.T) {
		f := fleet.NewStatic(nodes[:2]...)
		p := newPlacer(t, placement.Config{Fleet: f, Retries: 5})
		r := &refusing{refuse: map[string]bool{"a": true, "b": true}}
		_, err := p.Do(context.Background(), req, r.create)
		if !errors.Is(err, errdefs.ErrExhausted) || len(r.tried) != 2 {
			t.Fatalf("Do: got %v after %v, want ErrExhausted after a and b", err, r.tried)
		}
	})

	t.Run("other errors are not retried", func(t *testing.T) {
		f := fleet.NewStatic(nodes...)
		p := newPlacer(t, placement.Config{Fleet: f})
		tries := 0
		_, err := p.Do(context.Background(), req, func(ctx context.Context, id string) error {
			tries++
			return errdefs.Invalid("bad image")
		})
		if !errors.Is(err, errdefs.ErrInvalid) || tries != 1 {
			t.Fatalf("Do: got %v after %d tries, want ErrInvalid after 1", err, tries)
		}
	})

	t.Run("no node at all", func(t *testing.T) {
		p := newPlacer(t, placement.Config{Fleet: fleet.NewStatic()})
		_, err := p.Do(context.Background(), req, func(context.Context, string) error { t.Fatal("create called"); return nil })
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("Do on an empty fleet: got %v, want ErrUnavailable", err)
		}
	})
}

func sorted(s []string) []string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	return s
}

func dedup(s []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range s {
		m[x] = true
	}
	return m
}

func containsAny(s []string, xs ...string) bool {
	for _, a := range s {
		for _, x := range xs {
			if a == x {
				return true
			}
		}
	}
	return false
}

func TestBurstSpill(t *testing.T) {
	const onprem = 10
	f := fleet.NewStatic()
	setUsage := func(cpu float64) {
		for i := range onprem {
			f.Set(node(fmt.Sprintf("p%d", i), func(n *api.Node) {
				n.Capacity = api.Capacity{CPU: 10, Memory: 100 << 30, Sandboxes: 100}
				n.Usage = api.Capacity{CPU: cpu}
			}))
		}
	}
	setUsage(0)
	for i := range 2 {
		f.Set(node(fmt.Sprintf("c%d", i), func(n *api.Node) { n.Pool = api.PoolCloud }))
	}
	p := newPlacer(t, placement.Config{Fleet: f})
	small := api.Capacity{CPU: 0.1}
	pools := func(req placement.Request) string {
		got, err := chosen(t, p, req, 100)
		if err != nil {
			return errdefs.Code(err)
		}
		seen := map[byte]bool{}
		for _, id := range got {
			seen[id[0]] = true
		}
		switch {
		case seen['p'] && seen['c']:
			return "both"
		case seen['c']:
			return api.PoolCloud
		default:
			return api.PoolOnPrem
		}
	}
	burst := placement.Request{Resources: small, Burstable: true}
	steady := placement.Request{Resources: small}
	for _, tt := range []struct {
		cpu                   float64 // used on each on-prem node of 10
		wantBurst, wantSteady string
	}{
		{0, api.PoolOnPrem, api.PoolOnPrem},
		{7.9, api.PoolOnPrem, api.PoolOnPrem}, // 79%
		{8.0, api.PoolCloud, api.PoolOnPrem},  // 80%: the threshold
		{9.5, api.PoolCloud, api.PoolOnPrem},
		{10, api.PoolCloud, api.CodeNoCapacity}, // full: only burstable work has somewhere to go
	} {
		setUsage(tt.cpu)
		u := placement.Utilisation(f.Snapshot(), api.PoolOnPrem)
		if got := pools(burst); got != tt.wantBurst {
			t.Errorf("on-prem at %.0f%%: burstable went to %s, want %s", 100*u, got, tt.wantBurst)
		}
		if got := pools(steady); got != tt.wantSteady {
			t.Errorf("on-prem at %.0f%%: non-burstable went to %s, want %s", 100*u, got, tt.wantSteady)
		}
	}
	// Spilling stops when the cloud pool is full too: back to on-prem.
	setUsage(8.5)
	for i := range 2 {
		f.Set(node(fmt.Sprintf("c%d", i), func(n *api.Node) { n.Pool = api.PoolCloud; n.Usage = cap8 }))
	}
	if got := pools(burst); got != api.PoolOnPrem {
		t.Errorf("cloud full: burstable went to %s, want onprem", got)
	}
	// An explicit pool is the only pool.
	if got := pools(placement.Request{Resources: small, Pool: api.PoolCloud}); got != api.CodeNoCapacity {
		t.Errorf("pool cloud, full: got %s, want no_capacity", got)
	}
}

// TestConcurrentPlace: many placers on one fleet never overfill a node;
// run with -race.
func TestConcurrentPlace(t *testing.T) {
	var nodes []api.Node
	for i := range 20 {
		nodes = append(nodes, node(fmt.Sprintf("n%02d", i), nil)) // 10 sandboxes each
	}
	f := fleet.NewStatic(nodes...)
	for _, s := range strats {
		t.Run(string(s), func(t *testing.T) {
			for _, n := range nodes {
				f.Set(n) // reset usage; reservations drop below
			}
			p := newPlacer(t, placement.Config{Fleet: f, Strategy: s})
			var mu sync.Mutex
			placed := map[string]int{}
			failed := 0
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 40 {
						id, err := p.Place(context.Background(), placement.Request{Resources: api.Capacity{CPU: 0.5}})
						mu.Lock()
						if err != nil {
							failed++
							if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != api.CodeNoCapacity {
								t.Errorf("Place: got %v, want no_capacity once full", err)
							}
						} else {
							placed[id]++
						}
						mu.Unlock()
						placement.Utilisation(f.Snapshot(), api.PoolOnPrem)
					}
				})
			}
			wg.Go(func() { // a node re-registering meanwhile
				for range 20 {
					f.Set(nodes[0])
				}
			})
			wg.Wait()
			total := 0
			for id, n := range placed {
				total += n
				if n > 10 && id != "n00" {
					t.Errorf("node %s got %d sandboxes, capacity 10", id, n)
				}
			}
			if total+failed != 320 || total < 200 {
				t.Fatalf("placed %d, failed %d; want all 320 answered and >= 200 placed", total, failed)
			}
			for _, n := range f.Snapshot() {
				f.Release(n.ID, n.Reserved())
			}
		})
	}
}

func TestDiskFilter(t *testing.T) {
	withDisk := func(mech string) func(n *api.Node) { return func(n *api.Node) { n.DiskQuota = mech } }
	f := fleet.NewStatic(
		node("btr", withDisk(api.DiskQuotaBtrfs)),
		node("xfs", withDisk(api.DiskQuotaXFS)),
		node("none", withDisk(api.DiskQuotaNone)),
		node("old", nil), // predates disk_quota: none
	)
	bare := fleet.NewStatic(node("none", withDisk(api.DiskQuotaNone)), node("old", nil))
	res := api.Capacity{CPU: 1, Memory: 1 << 30}
	tests := []struct {
		name  string
		fleet placement.Fleet
		req   placement.Request
		want  string // chosen nodes, or an error code
	}{
		{"no disk limit: any node", f, placement.Request{Resources: res}, "[btr none old xfs]"},
		{"disk limit: nodes with quotas", f, placement.Request{Resources: res, Disk: true}, "[btr xfs]"},
		{"inode limit: project quotas only", f, placement.Request{Resources: res, Disk: true, DiskInodes: true}, "[xfs]"},
		{"no node enforces it", bare, placement.Request{Resources: res, Disk: true}, api.CodeDiskQuotaUnsupported},
		{"no node enforces inodes", fleet.NewStatic(node("btr", withDisk(api.DiskQuotaBtrfs))), placement.Request{Resources: res, Disk: true, DiskInodes: true}, api.CodeDiskQuotaUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlacer(t, placement.Config{Fleet: tt.fleet, Strategy: placement.Random})
			got, err := chosen(t, p, tt.req, 200)
			if strings.HasPrefix(tt.want, "[") {
				if err != nil || fmt.Sprint(got) != tt.want {
					t.Fatalf("got %v, %v; want %s", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != tt.want || !strings.Contains(err.Error(), "without disk") {
				t.Fatalf("got %v, %v (code %q); want ErrUnavailable %s saying which nodes lack disk quotas", got, err, errdefs.Code(err), tt.want)
			}
			t.Logf("error: %v", err)
		})
	}
}

// TestConstraints: a node_selector and a required pool are honoured
// exactly, never spilled past, and a create no node matches names the
// constraint and how each node fails it.
func TestConstraints(t *testing.T) {
	f := fleet.NewStatic(
		node("a", nil),
		node("b", func(n *api.Node) { n.Labels = map[string]string{"zone": "x"} }),
		node("c", func(n *api.Node) { n.Labels = map[string]string{"rack": "r2"} }),
		node("d", func(n *api.Node) { n.Pool = api.PoolCloud; n.Labels = map[string]string{"rack": "r1", "gpu": "yes"} }),
	)
	one := api.Capacity{CPU: 1, Memory: 1 << 30}
	for _, tt := range []struct {
		name string
		req  placement.Request
		want string   // the node, or the error code
		msg  []string // in the error
	}{
		{"selector in the home pool", placement.Request{Resources: one, Labels: map[string]string{"rack": "r1"}},
			api.CodeNoMatchingNode, []string{"no node matches node_selector rack=r1", "3 nodes", "2 lack label rack", "1 has rack=r2"}},
		{"selector and pool", placement.Request{Resources: one, Labels: map[string]string{"rack": "r1"}, Pool: api.PoolCloud}, "d", nil},
		{"every key must match", placement.Request{Resources: one, Labels: map[string]string{"rack": "r1", "gpu": "no"}, Pool: api.PoolCloud},
			api.CodeNoMatchingNode, []string{"node_selector gpu=no,rack=r1", "1 has gpu=yes"}},
		{"one reason", placement.Request{Resources: one, Labels: map[string]string{"zone": "y"}},
			api.CodeNoMatchingNode, []string{"no node matches node_selector zone=y", "2 lack label zone, 1 has zone=x"}},
		{"burstable with a selector spills only to matching nodes", placement.Request{Resources: one, Labels: map[string]string{"rack": "r1"}, Burstable: true}, "d", nil},
		{"required pool", placement.Request{Resources: one, Pool: api.PoolCloud}, "d", nil},
		{"required pool without nodes", placement.Request{Resources: one, Pool: "edge"},
			api.CodeNoMatchingNode, []string{"no node matches pool edge", "pool edge has no nodes"}},
	} {
		for _, s := range strats {
			t.Run(fmt.Sprintf("%s/%s", s, tt.name), func(t *testing.T) {
				p := newPlacer(t, placement.Config{Fleet: f, Strategy: s})
				got, err := chosen(t, p, tt.req, 50)
				if tt.msg == nil {
					if err != nil || fmt.Sprint(got) != "["+tt.want+"]" {
						t.Fatalf("got %v, %v; want [%s]", got, err, tt.want)
					}
					return
				}
				if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != tt.want {
					t.Fatalf("got %v, %v; want 503 %s", got, err, tt.want)
				}
				for _, m := range tt.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error %q lacks %q", err, m)
					}
				}
			})
		}
	}

	// A required pool that is full does not spill, burstable or not.
	f.Set(node("d", func(n *api.Node) { n.Pool = api.PoolCloud; n.Usage = cap8 }))
	p := newPlacer(t, placement.Config{Fleet: f})
	for _, burst := range []bool{false, true} {
		_, err := p.Place(context.Background(), placement.Request{Resources: one, Pool: api.PoolCloud, Burstable: burst})
		if errdefs.Code(err) != api.CodeNoCapacity {
			t.Errorf("pool cloud full, burstable %v: got %v, want no_capacity (no spill)", burst, err)
		}
	}
}

// TestRuntimeFilter: a create that names a runtime goes only to nodes
// that list it available for its backend; when none does, the answer is
// 503 runtime_unavailable with a node's reason.
func TestRuntimeFilter(t *testing.T) {
	runtimes := func(gvisor bool, why string) func(n *api.Node) {
		return func(n *api.Node) {
			n.Runtimes = []api.NodeRuntime{{Backend: api.BackendContainer, Name: api.RuntimeRunc, Available: true},
				{Backend: api.BackendContainer, Name: api.RuntimeGVisor, Available: gvisor, Reason: why}}
		}
	}
	f := fleet.NewStatic(
		node("gv", runtimes(true, "")),
		node("nogv", runtimes(false, "runsc not found")),
		node("old", nil), // predates runtimes
	)
	bare := fleet.NewStatic(node("nogv", runtimes(false, "runsc not found")), node("old", nil))
	res := api.Capacity{CPU: 1, Memory: 1 << 30}
	for _, tt := range []struct {
		name  string
		fleet placement.Fleet
		req   placement.Request
		want  string // chosen nodes, or an error code
	}{
		{"default runtime: any node", f, placement.Request{Backend: api.BackendContainer, Resources: res}, "[gv nogv old]"},
		{"gvisor: nodes that run it", f, placement.Request{Backend: api.BackendContainer, Resources: res, Runtime: api.RuntimeGVisor}, "[gv]"},
		{"runc named: nodes that list it", f, placement.Request{Backend: api.BackendContainer, Resources: res, Runtime: api.RuntimeRunc}, "[gv nogv]"},
		{"gvisor of another backend", f, placement.Request{Backend: api.BackendMicroVM, Resources: res, Runtime: api.RuntimeGVisor}, api.CodeNoMatchingNode},
		{"no node runs gvisor", bare, placement.Request{Backend: api.BackendContainer, Resources: res, Runtime: api.RuntimeGVisor}, api.CodeRuntimeUnavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlacer(t, placement.Config{Fleet: tt.fleet, Strategy: placement.Random})
			got, err := chosen(t, p, tt.req, 200)
			if strings.HasPrefix(tt.want, "[") {
				if err != nil || fmt.Sprint(got) != tt.want {
					t.Fatalf("got %v, %v; want %s", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != tt.want {
				t.Fatalf("got %v, %v (code %q); want ErrUnavailable %s", got, err, errdefs.Code(err), tt.want)
			}
			if tt.want == api.CodeRuntimeUnavailable && !strings.Contains(err.Error(), "2 without runtime gvisor (nogv: runsc not found)") {
				t.Errorf("error %q does not say which nodes lack gvisor and why", err)
			}
			t.Logf("error: %v", err)
		})
	}
}

// TestMergeGroupFilter: a merging create never lands on a node merging
// another group's memory; other creates and nodes merging nothing (or
// unable to) take it; when only other groups' nodes have room, the
// answer is 503 no_capacity naming them.
func TestMergeGroupFilter(t *testing.T) {
	merging := func(group string) func(n *api.Node) {
		return func(n *api.Node) { n.MemoryMerge = &api.NodeMemoryMerge{Mechanism: "ksm", Group: group} }
	}
	f := fleet.NewStatic(node("a", merging("ga")), node("b", merging("gb")), node("idle", merging("")), node("old", nil))
	onlyB := fleet.NewStatic(node("b", merging("gb")))
	res := api.Capacity{CPU: 1, Memory: 1 << 30}
	for _, tt := range []struct {
		name  string
		fleet placement.Fleet
		req   placement.Request
		want  string
	}{
		{"no group: any node", f, placement.Request{Resources: res}, "[a b idle old]"},
		{"group ga: its node and those merging nothing", f, placement.Request{Resources: res, MergeGroup: "ga"}, "[a idle old]"},
		{"group gc: none merging another", f, placement.Request{Resources: res, MergeGroup: "gc"}, "[idle old]"},
		{"only another group's node", onlyB, placement.Request{Resources: res, MergeGroup: "ga"}, api.CodeNoCapacity},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlacer(t, placement.Config{Fleet: tt.fleet, Strategy: placement.Random})
			got, err := chosen(t, p, tt.req, 200)
			if strings.HasPrefix(tt.want, "[") {
				if err != nil || fmt.Sprint(got) != tt.want {
					t.Fatalf("got %v, %v; want %s", got, err, tt.want)
				}
				return
			}
			if errdefs.Code(err) != tt.want || !strings.Contains(err.Error(), "1 merging another project's memory") {
				t.Fatalf("got %v, %v (code %q); want %s saying why", got, err, errdefs.Code(err), tt.want)
			}
		})
	}
}
