// Package placement chooses the node a sandbox goes to. It filters the
// fleet (health, pool, backend and its runtime, labels, disk quota,
// network, headroom including in-flight reservations), then ranks by
// power-of-k choices: sample k feasible nodes uniformly and take the
// least loaded. Sampling keeps concurrent apiservers from herding onto
// the one emptiest node, and k=2 already balances almost as well as
// looking at every node (Mitzenmacher's "power of two choices").
//
// Burstable sandboxes spill from the home pool (on-prem) to the burst pool
// (cloud) once the home pool's utilisation passes a threshold. A node may
// still refuse a create (it has the final say on admission); Do retries on
// other nodes and keeps refusing nodes out of placement for a moment.
//
// Load of a node is the fullest of its dimensions: max over CPU, memory
// and sandbox count of (usage + reserved + request) / capacity, the
// request included so that a large sandbox prefers the node it fits best.
package placement

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
)

// Fleet is the view of nodes placement reads and reserves on;
// *fleet.Watcher and *fleet.Static implement it.
type Fleet interface {
	// Snapshot returns every node; the slice is shared and read-only.
	Snapshot() []fleet.NodeView
	// Reserve adds res to a node if it fits (ErrExhausted otherwise).
	Reserve(nodeID string, res api.Capacity) error
	// Release drops a reservation whose create did not happen.
	Release(nodeID string, res api.Capacity)
	// Commit keeps a reservation whose create succeeded until the node's
	// own usage includes it.
	Commit(nodeID string, res api.Capacity)
}

var (
	_ Fleet = (*fleet.Watcher)(nil)
	_ Fleet = (*fleet.Static)(nil)
)

// Strategy ranks feasible nodes.
type Strategy string

const (
	// PowerOfK samples K feasible nodes and takes the least loaded.
	PowerOfK Strategy = "power-of-k"
	// Oracle takes the least loaded of all feasible nodes: the best
	// balance a single placer can reach, at O(nodes) per placement.
	Oracle Strategy = "oracle"
	// Random takes any feasible node: the baseline.
	Random Strategy = "random"
)

// Config builds a Placer. Zero fields take the defaults.
type Config struct {
	Fleet    Fleet
	Strategy Strategy // default PowerOfK
	K        int      // nodes sampled by PowerOfK, default 2
	// HomePool takes every request that names no pool (default
	// api.PoolOnPrem); BurstPool takes burstable ones when the home pool
	// is at BurstThreshold utilisation (default 0.8) or has no room
	// (default api.PoolCloud).
	HomePool       string
	BurstPool      string
	BurstThreshold float64
	// Retries is how many other nodes Do tries after a refusal (default 3;
	// negative: none).
	Retries int
	// Cooldown keeps a node that refused out of placement for this long,
	// or for its Retry-After if shorter (default 1 s; negative: never).
	Cooldown time.Duration
	// Retryable says whether a create error means the node refused and
	// created nothing, so another node may be tried (default: ErrExhausted).
	Retryable func(error) bool
	// Rand, if set, makes choices reproducible (simulations); it is used
	// under a lock. Default: the lock-free global source.
	Rand *rand.Rand
}

// Request says what a sandbox needs of its node.
type Request struct {
	Backend   string            // "" for any
	Resources api.Capacity      // Sandboxes 0 counts as 1
	Labels    map[string]string // the node must carry each, with that value (a create's node_selector)
	// Pool restricts placement to one pool, with no spill to another; ""
	// means the home pool, with spill to the burst pool if Burstable.
	Pool      string
	Burstable bool
	Exclude   []string // node ids not to use
	// Prefer is a node to use if it can take the sandbox (a fork goes
	// where its parent's layers already are); others only if not.
	Prefer string
	// Disk: the sandbox has a disk limit, so the node must enforce one
	// (api.Node.DiskQuota); DiskInodes: an inode limit too.
	Disk, DiskInodes bool
	// Network: the sandbox has a network, so the node must give one
	// (api.Node.Network).
	Network bool
	// Runtime: the sandbox names a runtime of its backend, so the node
	// must list it available (api.Node.Runtimes); "" for the default.
	Runtime string
	// MergeGroup: the sandbox's memory may be merged with its group's
	// (api.CreateSandboxRequest.MemoryMergeGroup), so not on a node that
	// merges another group's (api.Node.MemoryMerge). Nodes that merge
	// nothing take it (it merges nothing there).
	MergeGroup string
}

// Demand returns the capacity a sandbox with resources r takes.
func Demand(r api.Resources) api.Capacity {
	return api.Capacity{CPU: r.CPU, Memory: r.Memory, Sandboxes: 1}
}

func (r Request) demand() api.Capacity {
	d := r.Resources
	if d.Sandboxes <= 0 {
		d.Sandboxes = 1
	}
	return d
}

// Load returns how full a node is with used in use: the fullest of its
// dimensions, used/capacity. A dimension with no capacity counts as full
// if anything uses it.
func Load(capacity, used api.Capacity) float64 {
	l := 0.0
	dim := func(u, c float64) {
		switch {
		case c > 0:
			l = max(l, u/c)
		case u > 0:
			l = max(l, 1)
		}
	}
	dim(used.CPU, capacity.CPU)
	dim(float64(used.Memory), float64(capacity.Memory))
	dim(float64(used.Sandboxes), float64(capacity.Sandboxes))
	return l
}

// Placer places sandboxes. It is safe for concurrent use.
type Placer struct {
	cfg    Config
	randMu sync.Mutex
	// refused maps a node id to the time.Time until which it is skipped;
	// coolUntil is the latest of those times (Unix ns), so that placement
	// skips the map while no node cools down.
	refused   sync.Map
	coolUntil atomic.Int64
}

// New returns a Placer over cfg.Fleet.
func New(cfg Config) (*Placer, error) {
	if cfg.Fleet == nil {
		return nil, errdefs.Invalid("placement: no fleet")
	}
	if cfg.Strategy == "" {
		cfg.Strategy = PowerOfK
	}
	switch cfg.Strategy {
	case PowerOfK, Oracle, Random:
	default:
		return nil, errdefs.Invalid("placement: unknown strategy %q", cfg.Strategy)
	}
	if cfg.K <= 0 {
		cfg.K = 2
	}
	if cfg.HomePool == "" {
		cfg.HomePool = api.PoolOnPrem
	}
	if cfg.BurstPool == "" {
		cfg.BurstPool = api.PoolCloud
	}
	if cfg.BurstThreshold <= 0 {
		cfg.BurstThreshold = 0.8
	}
	switch {
	case cfg.Retries == 0:
		cfg.Retries = 3
	case cfg.Retries < 0:
		cfg.Retries = 0
	}
	if cfg.Cooldown == 0 {
		cfg.Cooldown = time.Second
	}
	if cfg.Retryable == nil {
		cfg.Retryable = func(err error) bool { return errors.Is(err, errdefs.ErrExhausted) }
	}
	return &Placer{cfg: cfg}, nil
}

func (p *Placer) intN(n int) int {
	if p.cfg.Rand == nil {
		return rand.IntN(n)
	}
	p.randMu.Lock()
	defer p.randMu.Unlock()
	return p.cfg.Rand.IntN(n)
}

// Place chooses a node for req and reserves req's resources on it. The
// caller sends the create there and then calls Done. Errors:
// ErrUnavailable with code api.CodeNoMatchingNode (no healthy node has the
// backend, pool and labels) or api.CodeNoCapacity (none of those has
// room): the API answers 503; ErrExhausted with code api.CodeNodeFull when
// the only nodes with room refused a create a moment ago: 429. Cost: O(k)
// node reads when most nodes are feasible, O(nodes) for Oracle, for
// burstable requests (pool utilisation) and when few nodes are feasible.
func (p *Placer) Place(ctx context.Context, req Request) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	res := req.demand()
	nodes := p.cfg.Fleet.Snapshot()
	s := &search{p: p, nodes: nodes, req: req, res: res, now: time.Now(), exclude: map[string]bool{}, raced: map[string]bool{},
		selector: slices.Sorted(maps.Keys(req.Labels))}
	for _, id := range req.Exclude {
		s.exclude[id] = true
	}
	pools := p.pools(req, nodes)
	if id, ok := s.preferred(pools); ok {
		return id, nil
	}
	for _, pool := range pools {
		s.pool = pool
		// A reservation can lose a race with a concurrent placement:
		// choose again without that node, a few times.
		for range 8 {
			i := s.choose()
			if i < 0 {
				break
			}
			id := nodes[i].ID
			if err := p.cfg.Fleet.Reserve(id, res); err != nil {
				s.raced[id] = true
				continue
			}
			return id, nil
		}
		s.tried = append(s.tried, s.why)
	}
	return "", s.err()
}

// Done ends the reservation Place made on nodeID for req: created says
// whether the node created the sandbox.
func (p *Placer) Done(nodeID string, req Request, created bool) {
	if created {
		p.cfg.Fleet.Commit(nodeID, req.demand())
	} else {
		p.cfg.Fleet.Release(nodeID, req.demand())
	}
}

// Do places req and calls create on the chosen node. When the node refuses
// (create returns an error Retryable accepts, by default ErrExhausted: the
// node answered 429), it tries another node, up to Retries times, never a
// node that refused. It returns the node that created the sandbox; or the
// error of a create that failed otherwise; or, when every try was refused,
// the last refusal (429 with the node's Retry-After); or Place's error.
func (p *Placer) Do(ctx context.Context, req Request, create func(ctx context.Context, nodeID string) error) (string, error) {
	exclude := slices.Clone(req.Exclude)
	var refusal error
	for range p.cfg.Retries + 1 {
		r := req
		r.Exclude = exclude
		id, err := p.Place(ctx, r)
		if err != nil {
			if refusal != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				return "", refusal
			}
			return "", err
		}
		err = create(ctx, id)
		p.Done(id, req, err == nil)
		if err == nil {
			return id, nil
		}
		if !p.cfg.Retryable(err) {
			return "", err
		}
		refusal = err
		p.cool(id, err)
		exclude = append(exclude, id)
	}
	return "", refusal
}

// cool keeps a refusing node out of placement for a moment, so that
// concurrent creates do not all try it before its next poll shows it full.
func (p *Placer) cool(id string, err error) {
	if p.cfg.Cooldown < 0 {
		return
	}
	d := p.cfg.Cooldown
	if ra := errdefs.RetryAfter(err); ra > 0 && ra < d {
		d = ra
	}
	until := time.Now().Add(d)
	p.refused.Store(id, until)
	for {
		old := p.coolUntil.Load()
		if old >= until.UnixNano() || p.coolUntil.CompareAndSwap(old, until.UnixNano()) {
			return
		}
	}
}

func (p *Placer) cooling(id string, now time.Time) (time.Duration, bool) {
	if now.UnixNano() >= p.coolUntil.Load() {
		return 0, false
	}
	v, ok := p.refused.Load(id)
	if !ok {
		return 0, false
	}
	until := v.(time.Time)
	if !now.Before(until) {
		p.refused.CompareAndDelete(id, v)
		return 0, false
	}
	return until.Sub(now), true
}

// pools returns the pools to try for req, in order.
func (p *Placer) pools(req Request, nodes []fleet.NodeView) []string {
	switch {
	case req.Pool != "":
		return []string{req.Pool}
	case !req.Burstable:
		return []string{p.cfg.HomePool}
	case Utilisation(nodes, p.cfg.HomePool) >= p.cfg.BurstThreshold:
		return []string{p.cfg.BurstPool, p.cfg.HomePool}
	default:
		return []string{p.cfg.HomePool, p.cfg.BurstPool}
	}
}

// Utilisation returns how full the healthy nodes of a pool are together:
// the fullest dimension of their summed usage (with reservations) over
// their summed capacity. A pool without healthy nodes is full (1).
func Utilisation(nodes []fleet.NodeView, pool string) float64 {
	var capacity, used api.Capacity
	for _, n := range nodes {
		if n.Pool != pool || !n.Healthy {
			continue
		}
		u := n.Used()
		capacity.CPU += n.Capacity.CPU
		capacity.Memory += n.Capacity.Memory
		capacity.Sandboxes += n.Capacity.Sandboxes
		used.CPU += u.CPU
		used.Memory += u.Memory
		used.Sandboxes += u.Sandboxes
	}
	if capacity == (api.Capacity{}) {
		return 1
	}
	return Load(capacity, used)
}

// search is one placement's walk over the nodes of one pool at a time.
type search struct {
	p       *Placer
	nodes   []fleet.NodeView
	req     Request
	res     api.Capacity
	now     time.Time
	exclude map[string]bool
	raced   map[string]bool // filled up by a concurrent placement
	pool    string
	why     rejections
	tried   []rejections
	// selector is req.Labels' keys, sorted: a node that fails the
	// selector is counted under the first key it fails.
	selector []string
}

// rejections counts why the nodes of one pool were not feasible.
type rejections struct {
	pool                                    string
	nodes, unhealthy, backend, labels, full int
	disk                                    int    // cannot enforce the disk limit
	network                                 int    // give sandboxes no network
	runtime                                 int    // cannot run the runtime
	merge                                   int    // merge another group's memory (counted in full too)
	runtimeWhy                              string // a node's reason, "node: reason"
	refused                                 int
	retryAfter                              time.Duration
	// lack counts the nodes without a selector key; other counts those
	// with the key but another value, by "key=value".
	lack, other map[string]int
}

// miss counts node n under the first selector key it does not match.
func (r *rejections) miss(keys []string, want, have map[string]string) {
	for _, k := range keys {
		v, ok := have[k]
		switch {
		case !ok:
			if r.lack == nil {
				r.lack = map[string]int{}
			}
			r.lack[k]++
			return
		case v != want[k]:
			if r.other == nil {
				r.other = map[string]int{}
			}
			r.other[k+"="+v]++
			return
		}
	}
}

// feasible checks node i and returns the load it would have with the
// request on it.
func (s *search) feasible(i int) (float64, bool) {
	n := &s.nodes[i]
	if n.Pool != s.pool {
		return 0, false
	}
	s.why.nodes++
	switch {
	case !n.Healthy:
		s.why.unhealthy++
		return 0, false
	case s.req.Backend != "" && !slices.Contains(n.Backends, s.req.Backend):
		s.why.backend++
		return 0, false
	case !hasLabels(n.Labels, s.req.Labels):
		s.why.labels++
		s.why.miss(s.selector, s.req.Labels, n.Labels)
		return 0, false
	case (s.req.Disk || s.req.DiskInodes) && !api.EnforcesDisk(n.DiskQuota, s.req.DiskInodes):
		s.why.disk++
		return 0, false
	case s.req.Network && !n.Network:
		s.why.network++
		return 0, false
	case s.req.Runtime != "" && !s.runs(n):
		return 0, false
	case s.req.MergeGroup != "" && n.MemoryMerge != nil && n.MemoryMerge.Group != "" && n.MemoryMerge.Group != s.req.MergeGroup:
		// Full for this group until the other's sandboxes are gone.
		s.why.merge++
		s.why.full++
		return 0, false
	case s.exclude[n.ID]:
		s.why.refused++
		return 0, false
	}
	if d, ok := s.p.cooling(n.ID, s.now); ok {
		s.why.refused++
		if s.why.retryAfter == 0 || d < s.why.retryAfter {
			s.why.retryAfter = d
		}
		return 0, false
	}
	used := n.Used()
	if s.raced[n.ID] || !fleet.Fits(n.Capacity, used, s.res) {
		s.why.full++
		return 0, false
	}
	u := api.Capacity{CPU: used.CPU + s.res.CPU, Memory: used.Memory + s.res.Memory, Sandboxes: used.Sandboxes + s.res.Sandboxes}
	return max(Load(n.Capacity, u), RealLoad(n.InUse)), true
}

// RealLoad is how full a node is by what its sandboxes really use (its
// api.Node.InUse): the fuller of its cores busy and its memory in use
// against what it lets sandboxes have; 0 when it does not say. With CPU
// overcommitted 50x, what sandboxes ask for says little of how busy a
// node is: placement ranks by the fuller of the two.
func RealLoad(u *api.NodeInUse) float64 {
	if u == nil {
		return 0
	}
	l := 0.0
	if u.Cores > 0 && u.CPUUnmeasured == "" {
		l = (u.CPU + u.CPUBestEffort/10) / u.Cores // best-effort work yields: it counts little
	}
	if u.MemoryLimit > 0 {
		l = max(l, float64(u.Memory)/float64(u.MemoryLimit))
	}
	return l
}

// runs reports whether node n runs the request's runtime, counting it
// (and its reason) among the rejections if not.
func (s *search) runs(n *fleet.NodeView) bool {
	ok, why := n.RunsRuntime(s.req.Backend, s.req.Runtime)
	if ok {
		return true
	}
	s.why.runtime++
	if s.why.runtimeWhy == "" && why != "" { // a node without the runtime has no reason to give
		s.why.runtimeWhy = n.ID + ": " + why
	}
	return false
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// choose returns the index of the node the strategy picks in s.pool, or -1
// if none is feasible.
// preferred reserves the request's preferred node if it is in one of
// pools and feasible there.
func (s *search) preferred(pools []string) (string, bool) {
	if s.req.Prefer == "" {
		return "", false
	}
	for i := range s.nodes {
		n := &s.nodes[i]
		if n.ID != s.req.Prefer || !slices.Contains(pools, n.Pool) {
			continue
		}
		s.pool = n.Pool
		_, ok := s.feasible(i)
		s.why = rejections{}
		if ok && s.p.cfg.Fleet.Reserve(n.ID, s.res) == nil {
			return n.ID, true
		}
	}
	return "", false
}

func (s *search) choose() int {
	s.why = rejections{pool: s.pool}
	if s.p.cfg.Strategy == Oracle {
		return s.oracle()
	}
	k := s.p.cfg.K
	if s.p.cfg.Strategy == Random {
		k = 1
	}
	// A partial Fisher-Yates shuffle visits nodes in uniformly random
	// order; its first k feasible ones are a uniform sample of the
	// feasible set. Swaps live in a small map, so a placement that finds
	// k feasible nodes early costs O(k), not O(nodes).
	n := len(s.nodes)
	swapped := make(map[int]int, 2*k)
	at := func(i int) int {
		if v, ok := swapped[i]; ok {
			return v
		}
		return i
	}
	best, bestLoad, found := -1, 0.0, 0
	for i := 0; i < n && found < k; i++ {
		j := i + s.p.intN(n-i)
		vi, vj := at(i), at(j)
		swapped[j] = vi
		if load, ok := s.feasible(vj); ok {
			found++
			if best < 0 || load < bestLoad {
				best, bestLoad = vj, load
			}
		}
	}
	return best
}

// oracle returns the least loaded feasible node, ties broken at random.
func (s *search) oracle() int {
	best, bestLoad, ties := -1, 0.0, 0
	for i := range s.nodes {
		load, ok := s.feasible(i)
		switch {
		case !ok:
		case best < 0 || load < bestLoad:
			best, bestLoad, ties = i, load, 1
		case load == bestLoad:
			ties++
			if s.p.intN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// err explains why no pool had a node.
func (s *search) err() error {
	var total rejections
	var parts []string
	for _, r := range s.tried {
		total.nodes += r.nodes
		total.unhealthy += r.unhealthy
		total.backend += r.backend
		total.labels += r.labels
		total.disk += r.disk
		total.network += r.network
		total.runtime += r.runtime
		total.full += r.full
		total.refused += r.refused
		if r.retryAfter > 0 && (total.retryAfter == 0 || r.retryAfter < total.retryAfter) {
			total.retryAfter = r.retryAfter
		}
		parts = append(parts, r.String(s.req))
	}
	msg := "no node can take the sandbox: " + strings.Join(parts, "; ")
	// A required pool or selector that no node matches is named first:
	// it is the caller's constraint, not a passing shortage.
	switch {
	case total.nodes == 0 && s.req.Pool != "":
		msg = fmt.Sprintf("no node matches pool %s (%s)", s.req.Pool, strings.Join(parts, "; "))
	case total.labels > 0 && total.full == 0 && total.refused == 0 && total.disk == 0 && total.network == 0 && total.runtime == 0:
		msg = fmt.Sprintf("no node matches node_selector %s (%s)", selectorString(s.selector, s.req.Labels), strings.Join(parts, "; "))
		if s.req.Pool != "" {
			msg = fmt.Sprintf("no node in pool %s matches node_selector %s (%s)", s.req.Pool, selectorString(s.selector, s.req.Labels), strings.Join(parts, "; "))
		}
	}
	switch {
	case total.refused > 0:
		// The nodes that would fit turned creates away a moment ago.
		return errdefs.Exhausted(api.CodeNodeFull, max(total.retryAfter, time.Second), "%s", msg)
	case total.full > 0:
		return &errdefs.Error{Kind: errdefs.ErrUnavailable, Code: api.CodeNoCapacity, Msg: msg, RetryAfter: time.Second}
	case total.disk > 0:
		// The nodes that match otherwise cannot enforce the disk limit.
		return errdefs.New(errdefs.ErrUnavailable, api.CodeDiskQuotaUnsupported, "%s", msg)
	case total.network > 0:
		return errdefs.New(errdefs.ErrUnavailable, api.CodeNetworkUnavailable, "%s", msg)
	case total.runtime > 0:
		// The nodes that match otherwise cannot run the runtime.
		return errdefs.New(errdefs.ErrUnavailable, api.CodeRuntimeUnavailable, "%s", msg)
	default:
		return errdefs.New(errdefs.ErrUnavailable, api.CodeNoMatchingNode, "%s", msg)
	}
}

func diskWhat(req Request) string {
	if req.DiskInodes {
		return "without disk and inode quotas (disk_quota xfs or ext4)"
	}
	return "without disk quotas (disk_quota none)"
}

func (r rejections) String(req Request) string {
	if r.nodes == 0 {
		return fmt.Sprintf("pool %s has no nodes", r.pool)
	}
	s := fmt.Sprintf("pool %s has %d nodes", r.pool, r.nodes)
	for _, c := range []struct {
		n    int
		what string
	}{
		{r.unhealthy, "unhealthy"},
		{r.backend, fmt.Sprintf("without backend %s", req.Backend)},
		{r.labels, r.labelMisses()},
		{r.disk, diskWhat(req)},
		{r.network, "without a sandbox network"},
		{r.runtime, r.runtimeWhat(req)},
		{r.refused, "refusing creates"},
		{r.full - r.merge, "without room"},
		{r.merge, "merging another project's memory"},
	} {
		if c.n > 0 {
			s += fmt.Sprintf(", %d %s", c.n, c.what)
		}
	}
	return s
}

// runtimeWhat says how nodes fail the request's runtime, with one's
// reason: "without runtime gvisor (n1: runsc not found)".
func (r rejections) runtimeWhat(req Request) string {
	s := "without runtime " + req.Runtime
	if r.runtimeWhy != "" {
		s += " (" + r.runtimeWhy + ")"
	}
	return s
}

// labelMisses says how the nodes that fail the selector fail it, e.g.
// "lack label rack, 1 has rack=r2" after a count of 2: the first
// group's count is printed by the caller.
func (r rejections) labelMisses() string {
	type group struct {
		n    int
		what string
	}
	var gs []group
	for _, k := range slices.Sorted(maps.Keys(r.lack)) {
		gs = append(gs, group{r.lack[k], "lack label " + k})
	}
	for _, kv := range slices.Sorted(maps.Keys(r.other)) {
		gs = append(gs, group{r.other[kv], "has " + kv})
	}
	if len(gs) == 0 {
		return "not matching node_selector"
	}
	// The caller prints the total count first: make it the first group's
	// when there is only one, and spell every count out otherwise.
	if len(gs) == 1 {
		return gs[0].what
	}
	parts := make([]string, len(gs))
	for i, g := range gs {
		parts[i] = fmt.Sprintf("%d %s", g.n, g.what)
	}
	return "not matching node_selector (" + strings.Join(parts, ", ") + ")"
}

func selectorString(keys []string, sel map[string]string) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + sel[k]
	}
	return strings.Join(parts, ",")
}
