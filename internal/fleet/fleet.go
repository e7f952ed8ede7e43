// Package fleet keeps an apiserver's view of the nodes: which are
// registered, what they can run, how much of them is in use, and whether they
// still answer.
//
// Nodes register themselves under Prefix with a lease they keep alive
// (Registrar); a node that stops renewing it drops out. A registration
// carries the secret the node's API accepts, so that each node has its own
// and an apiserver presents the right one (Registration). Each apiserver runs a
// Watcher that follows the registrations through a store watch and polls
// every node's status with a bounded pool of workers, so it holds no state of
// its own: a restarted apiserver rebuilds the whole view from registrations
// and polls. A node that misses a few polls in a row is marked unreachable,
// and its sandboxes are reported lost.
//
// Placement reads the view through Snapshot (a shared, copy-on-write slice:
// no copy, no lock) and adds its in-flight creates with Reserve, Release and
// Commit, so concurrent placements see each other before the next poll does.
// Static is the same view with nodes set by hand, for tests and simulations.
package fleet

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Prefix is where nodes register, one key per node: Prefix+id.
const Prefix = "/nodes/"

// Key returns the registration key of a node.
func Key(id string) string { return Prefix + id }

// NodeView is one node as the fleet sees it. Its api.Node merges the
// registration (id, address, pool, labels) with the node's last answer to a
// poll (backends, capacity, usage, problems, updated_at); Healthy holds only
// while the node answers its polls and says it is healthy itself.
//
// The fields are as of the last publication of the view (at most a poll
// tick old); Used and Reserved read the node's accounting live.
type NodeView struct {
	api.Node
	// Polled: the node has answered at least one poll. Until then its
	// usage is unknown and it is not Healthy.
	Polled bool
	// Missed counts polls failed in a row.
	Missed int
	// LastPoll is when the node last answered; zero if never.
	LastPoll time.Time
	// Unreachable: the node missed MaxMissed polls in a row. Its sandboxes
	// are lost.
	Unreachable bool
	// Secret is the node API's secret, as registered (Registration): for
	// calling the node only, never to be shown.
	Secret string `json:"-"`

	e *entry
}

// Used returns the node's usage as of its last poll plus what placement
// reserved on it since (creates in flight, and creates done but not yet in
// a poll's answer). It reads the node's accounting now, without a lock.
func (v NodeView) Used() api.Capacity {
	if u := v.e.usedNow.Load(); u != nil {
		return *u
	}
	return api.Capacity{}
}

// Reserved returns what placement reserved on the node and no poll has
// covered yet.
func (v NodeView) Reserved() api.Capacity {
	v.e.mu.Lock()
	defer v.e.mu.Unlock()
	return v.e.pending()
}

// Fits reports whether req fits on a node of capacity cap with used in
// use: every dimension req asks for stays within capacity.
func Fits(capacity, used, req api.Capacity) bool {
	const eps = 1e-9 // CPU sums of fractions
	return (req.CPU <= 0 || used.CPU+req.CPU <= capacity.CPU+eps) &&
		(req.Memory <= 0 || used.Memory+req.Memory <= capacity.Memory) &&
		(req.Sandboxes <= 0 || used.Sandboxes+req.Sandboxes <= capacity.Sandboxes)
}

func add(a, b api.Capacity) api.Capacity {
	return api.Capacity{CPU: a.CPU + b.CPU, Memory: a.Memory + b.Memory, Sandboxes: a.Sandboxes + b.Sandboxes}
}

// sub returns a-b, never below zero in any dimension.
func sub(a, b api.Capacity) api.Capacity {
	c := api.Capacity{CPU: max(a.CPU-b.CPU, 0), Memory: max(a.Memory-b.Memory, 0), Sandboxes: max(a.Sandboxes-b.Sandboxes, 0)}
	if c.CPU < 1e-9 {
		c.CPU = 0
	}
	return c
}

// entry is the mutable state of one node. Its mutex is taken after the
// table's, never before.
type entry struct {
	id string

	mu       sync.Mutex
	reg      api.Node // as registered
	secret   string   // as registered
	status   api.Node // the last answer to a poll
	polled   bool
	missed   int
	attempts int // polls finished, answered or not
	lastPoll time.Time
	due      time.Time // next poll
	polling  bool      // queued or running
	seq      uint64    // polls started
	reserved api.Capacity
	commits  []commit
	// usedNow is used(), republished after every change, so that placement
	// reads it without the lock.
	usedNow atomic.Pointer[api.Capacity]
}

// changed republishes usedNow; e.mu is held.
func (e *entry) changed() {
	u := e.used()
	e.usedNow.Store(&u)
}

// commit is a reservation for a create that succeeded: it counts until a
// poll that started after it (seq greater than its seq) answers, since that
// answer includes the new sandbox.
type commit struct {
	res api.Capacity
	seq uint64
}

// pending is what placement added on top of the last poll; e.mu is held.
func (e *entry) pending() api.Capacity {
	p := e.reserved
	for _, c := range e.commits {
		p = add(p, c.res)
	}
	return p
}

// used is the usage placement counts; e.mu is held.
func (e *entry) used() api.Capacity {
	if !e.polled {
		return e.pending()
	}
	return add(e.status.Usage, e.pending())
}

func (e *entry) capacity() api.Capacity {
	if e.polled {
		return e.status.Capacity
	}
	return e.reg.Capacity
}

// answered records a successful poll that started as poll seq; e.mu is held.
func (e *entry) answered(st api.Node, seq uint64, at time.Time) {
	e.status = st
	e.polled = true
	e.missed = 0
	e.lastPoll = at
	e.commits = slices.DeleteFunc(e.commits, func(c commit) bool { return c.seq < seq })
	e.changed()
}

// view builds the entry's NodeView; e.mu is held.
func (e *entry) view(maxMissed int) NodeView {
	n := e.reg
	n.ID = e.id
	if n.Pool == "" {
		n.Pool = api.PoolOnPrem
	}
	n.Usage = api.Capacity{}
	n.Healthy = false
	if e.polled {
		n.Backends = e.status.Backends
		n.Capacity = e.status.Capacity
		n.Usage = e.status.Usage
		n.Problems = e.status.Problems
		n.UpdatedAt = e.status.UpdatedAt
		n.FnRuntimes = e.status.FnRuntimes
		n.DiskQuota = e.status.DiskQuota
		n.Network = e.status.Network
		n.Runtimes = e.status.Runtimes
		n.Machines = e.status.Machines
		n.Security = e.status.Security
		n.Snapshots = e.status.Snapshots
		n.PauseReclaim = e.status.PauseReclaim
		n.LayerPrefetch = e.status.LayerPrefetch
	}
	v := NodeView{Node: n, Polled: e.polled, Missed: e.missed, LastPoll: e.lastPoll, Secret: e.secret, e: e}
	v.Unreachable = maxMissed > 0 && e.missed >= maxMissed
	v.Healthy = e.polled && !v.Unreachable && e.status.Healthy
	return v
}

// table is the node view shared by Watcher and Static.
type table struct {
	maxMissed int

	mu      sync.Mutex // guards entries and publishing
	entries map[string]*entry
	snap    atomic.Pointer[snapshot]
	dirty   atomic.Bool // an entry changed in a way only the fields show
}

type snapshot struct {
	nodes []NodeView // sorted by id
	byID  map[string]int
}

func (t *table) init(maxMissed int) {
	t.maxMissed = maxMissed
	t.entries = map[string]*entry{}
	t.snap.Store(&snapshot{byID: map[string]int{}})
}

// Snapshot returns every node, sorted by id. The slice is shared by every
// caller until the next change: read it, do not modify it. Cost: one atomic
// load.
func (t *table) Snapshot() []NodeView {
	return t.snap.Load().nodes
}

// Node returns one node's view; false if the node is not registered.
func (t *table) Node(id string) (NodeView, bool) {
	s := t.snap.Load()
	i, ok := s.byID[id]
	if !ok {
		return NodeView{}, false
	}
	return s.nodes[i], true
}

func (t *table) lookup(id string) *entry {
	s := t.snap.Load()
	if i, ok := s.byID[id]; ok {
		return s.nodes[i].e
	}
	return nil
}

// Reserve adds res to the node's usage if it fits: placement calls it for
// a create it is about to send, and Release or Commit once the node has
// answered. Errors: ErrNotFound (no such node), ErrExhausted with code
// node_full (res does not fit next to the node's usage and reservations).
func (t *table) Reserve(id string, res api.Capacity) error {
	e := t.lookup(id)
	if e == nil {
		return errdefs.New(errdefs.ErrNotFound, "node_not_found", "node %s is not registered", id)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !Fits(e.capacity(), e.used(), res) {
		return errdefs.Exhausted(api.CodeNodeFull, 0, "node %s has no room for cpu %g, memory %v", id, res.CPU, res.Memory)
	}
	e.reserved = add(e.reserved, res)
	e.changed()
	return nil
}

// Release drops a reservation whose create did not happen.
func (t *table) Release(id string, res api.Capacity) {
	if e := t.lookup(id); e != nil {
		e.mu.Lock()
		e.reserved = sub(e.reserved, res)
		e.changed()
		e.mu.Unlock()
	}
}

// Commit turns a reservation into usage the node has not reported yet: the
// create succeeded. It keeps counting until a poll started after now
// answers.
func (t *table) Commit(id string, res api.Capacity) {
	if e := t.lookup(id); e != nil {
		e.mu.Lock()
		e.reserved = sub(e.reserved, res)
		e.commits = append(e.commits, commit{res: res, seq: e.seq})
		e.changed()
		e.mu.Unlock()
	}
}

// publish rebuilds the snapshot from the entries.
func (t *table) publish() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.publishLocked()
}

func (t *table) publishLocked() {
	t.dirty.Store(false)
	ids := make([]string, 0, len(t.entries))
	for id := range t.entries {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	s := &snapshot{nodes: make([]NodeView, len(ids)), byID: make(map[string]int, len(ids))}
	for i, id := range ids {
		e := t.entries[id]
		e.mu.Lock()
		s.nodes[i] = e.view(t.maxMissed)
		e.mu.Unlock()
		s.byID[id] = i
	}
	t.snap.Store(s)
}

// validID: ids become one key segment and prefix sandbox ids.
func validID(id string) bool {
	return id != "" && !strings.ContainsAny(id, "/-")
}

// Static is a fleet view whose nodes are set by hand: a fake for tests of
// what reads a fleet, and the fleet of placement simulations. It is safe
// for concurrent use.
type Static struct {
	table
}

// NewStatic returns a view holding nodes, as Set would store them.
func NewStatic(nodes ...api.Node) *Static {
	s := &Static{}
	s.init(0)
	for _, n := range nodes {
		s.set(n)
	}
	s.publish()
	return s
}

// Set adds or replaces a node, as if it had registered and just answered a
// poll with n: n.Usage and n.Healthy are taken as they are, and committed
// reservations are dropped (n.Usage is taken to include them).
func (s *Static) Set(n api.Node) {
	s.set(n)
	s.publish()
}

func (s *Static) set(n api.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[n.ID]
	if e == nil {
		e = &entry{id: n.ID}
		s.entries[n.ID] = e
	}
	e.mu.Lock()
	e.reg = n
	e.seq++
	e.answered(n, e.seq, time.Now())
	e.mu.Unlock()
}

// Lost reports whether sandboxes on node id are lost: the node is not in
// the view.
func (s *Static) Lost(id string) bool {
	_, ok := s.Node(id)
	return !ok
}

// Remove drops a node.
func (s *Static) Remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.entries, id)
	s.publishLocked()
}
