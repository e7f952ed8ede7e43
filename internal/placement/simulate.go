package placement

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/fleet"
)

// SimConfig describes a placement simulation: identical nodes, sandboxes
// of random sizes arriving one at a time and leaving after random
// lifetimes, placed through a real Placer over a fleet.Static.
type SimConfig struct {
	Nodes      int          // default 160, one DSec unit
	Capacity   api.Capacity // per node; default 64 CPU, 256 GiB, 500 sandboxes
	Placements int          // arrivals, default 50,000
	// Utilisation is the mean load the arrivals and lifetimes keep the
	// fleet at once warm (default 0.7).
	Utilisation float64
	Seed        uint64
	// Strategies to compare, each over the same arrivals (default:
	// random, k=2, k=3, oracle).
	Strategies []SimStrategy
}

// SimStrategy is one placer configuration of a simulation.
type SimStrategy struct {
	Name     string
	Strategy Strategy
	K        int
}

// SimResult is how evenly one strategy loaded the nodes. Loads are
// sampled every Placements/1000 arrivals after a warm-up of two mean
// lifetimes; Max, Mean and Imbalance are averages over the samples.
type SimResult struct {
	Name      string
	MaxLoad   float64 // load of the fullest node
	MeanLoad  float64 // mean node load
	Imbalance float64 // MaxLoad/MeanLoad per sample: 1 is perfect balance
	WorstLoad float64 // highest load any node reached in any sample
	Rejected  int     // arrivals no node had room for
}

func (r SimResult) String() string {
	return fmt.Sprintf("%-8s max %.3f  mean %.3f  max/mean %.3f  worst %.3f  rejected %d",
		r.Name, r.MaxLoad, r.MeanLoad, r.Imbalance, r.WorstLoad, r.Rejected)
}

// DefaultSimStrategies are the strategies the control-plane benchmark
// compares.
var DefaultSimStrategies = []SimStrategy{
	{Name: "random", Strategy: Random},
	{Name: "k=2", Strategy: PowerOfK, K: 2},
	{Name: "k=3", Strategy: PowerOfK, K: 3},
	{Name: "oracle", Strategy: Oracle},
}

// Request sizes, as (value, weight): mostly small sandboxes, a few large.
var (
	simCPU    = []struct{ v, w float64 }{{0.25, 30}, {0.5, 30}, {1, 20}, {2, 15}, {4, 5}}
	simMemory = []struct{ v, w float64 }{{256 << 20, 25}, {512 << 20, 25}, {1 << 30, 20}, {2 << 30, 15}, {4 << 30, 10}, {8 << 30, 5}}
)

func draw(r *rand.Rand, dist []struct{ v, w float64 }) float64 {
	total := 0.0
	for _, d := range dist {
		total += d.w
	}
	x := r.Float64() * total
	for _, d := range dist {
		if x -= d.w; x < 0 {
			return d.v
		}
	}
	return dist[len(dist)-1].v
}

func mean(dist []struct{ v, w float64 }) float64 {
	s, t := 0.0, 0.0
	for _, d := range dist {
		s += d.v * d.w
		t += d.w
	}
	return s / t
}

type arrival struct {
	res      api.Capacity
	lifetime int // arrivals until it leaves
}

// Simulate runs every strategy of cfg over the same arrivals and returns
// their balance, in the order of cfg.Strategies.
func Simulate(cfg SimConfig) ([]SimResult, error) {
	if cfg.Nodes <= 0 {
		cfg.Nodes = 160
	}
	if cfg.Capacity == (api.Capacity{}) {
		cfg.Capacity = api.Capacity{CPU: 64, Memory: 256 << 30, Sandboxes: 500}
	}
	if cfg.Placements <= 0 {
		cfg.Placements = 50_000
	}
	if cfg.Utilisation <= 0 {
		cfg.Utilisation = 0.7
	}
	if len(cfg.Strategies) == 0 {
		cfg.Strategies = DefaultSimStrategies
	}
	// Live sandboxes at steady state equal the mean lifetime (one arrival
	// per step); pick it so the fullest dimension sits at Utilisation.
	share := max(mean(simCPU)/cfg.Capacity.CPU, mean(simMemory)/float64(cfg.Capacity.Memory), 1/float64(cfg.Capacity.Sandboxes))
	lifetime := cfg.Utilisation * float64(cfg.Nodes) / share
	r := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	arrivals := make([]arrival, cfg.Placements)
	for i := range arrivals {
		arrivals[i] = arrival{
			res:      api.Capacity{CPU: draw(r, simCPU), Memory: api.Quantity(draw(r, simMemory)), Sandboxes: 1},
			lifetime: 1 + int(r.ExpFloat64()*lifetime),
		}
	}
	warmup := min(int(2*lifetime), cfg.Placements/2)
	every := max(cfg.Placements/1000, 1)

	var out []SimResult
	for _, st := range cfg.Strategies {
		res, err := simulate(cfg, st, arrivals, warmup, every)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

func simulate(cfg SimConfig, st SimStrategy, arrivals []arrival, warmup, every int) (SimResult, error) {
	nodes := make([]api.Node, cfg.Nodes)
	for i := range nodes {
		nodes[i] = api.Node{
			ID: fmt.Sprintf("n%03d", i), Pool: api.PoolOnPrem, Healthy: true,
			Backends: []string{api.BackendContainer}, Capacity: cfg.Capacity,
		}
	}
	f := fleet.NewStatic(nodes...)
	p, err := New(Config{
		Fleet: f, Strategy: st.Strategy, K: st.K,
		Rand: rand.New(rand.NewPCG(cfg.Seed, uint64(len(st.Name))<<32|uint64(st.K))),
	})
	if err != nil {
		return SimResult{}, err
	}
	ctx := context.Background()
	res := SimResult{Name: st.Name}
	var live departures
	samples := 0
	for step, a := range arrivals {
		for len(live) > 0 && live[0].at <= step {
			d := heap.Pop(&live).(departure)
			f.Release(d.node, d.res)
		}
		req := Request{Backend: api.BackendContainer, Resources: a.res}
		id, err := p.Place(ctx, req)
		if err != nil {
			res.Rejected++
		} else {
			heap.Push(&live, departure{at: step + a.lifetime, node: id, res: a.res})
		}
		if step >= warmup && (step-warmup)%every == 0 {
			hi, sum := 0.0, 0.0
			for _, n := range f.Snapshot() {
				l := Load(n.Capacity, n.Used())
				hi, sum = max(hi, l), sum+l
			}
			m := sum / float64(cfg.Nodes)
			res.MaxLoad += hi
			res.MeanLoad += m
			if m > 0 {
				res.Imbalance += hi / m
			}
			res.WorstLoad = math.Max(res.WorstLoad, hi)
			samples++
		}
	}
	if samples > 0 {
		res.MaxLoad /= float64(samples)
		res.MeanLoad /= float64(samples)
		res.Imbalance /= float64(samples)
	}
	return res, nil
}

type departure struct {
	at   int
	node string
	res  api.Capacity
}

// departures is a min-heap by departure step.
type departures []departure

func (h departures) Len() int           { return len(h) }
func (h departures) Less(i, j int) bool { return h[i].at < h[j].at }
func (h departures) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *departures) Push(x any)        { *h = append(*h, x.(departure)) }
func (h *departures) Pop() any {
	old := *h
	d := old[len(old)-1]
	*h = old[:len(old)-1]
	return d
}
