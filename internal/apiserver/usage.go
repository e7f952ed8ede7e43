package apiserver

import (
	"context"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
)

// Usage is the usage source quota admission reads (iam.UsageSource): what
// the sandboxes of each project use, node by node. It is exact for this
// apiserver's own creates, which it counts the moment they return
// (Created), so iam may drop a reservation at Commit (CommitHold < 0)
// instead of counting it twice until the next poll, which would halve a
// quota during a burst. Resync replaces a node's figures with its own list,
// which catches everything else: TTL and idle expiry, deletes, other
// apiservers' creates. Safe for concurrent use.
type Usage struct {
	tally *iam.Tally

	mu    sync.Mutex
	nodes map[string]*nodeUsage
}

var _ iam.UsageSource = (*Usage)(nil)

type nodeUsage struct {
	resync    sync.Mutex // one resync at a time
	sandboxes map[string]counted
	byProject map[string]iam.Resources // sums of sandboxes, kept up to date
	// While a resync lists the node, creates and deletes seen meanwhile
	// are kept to re-apply on top of the list, which may predate them.
	listing bool
	events  []usageEvent
}

type counted struct {
	project string
	res     iam.Resources
}

type usageEvent struct {
	id      string
	c       counted
	deleted bool
}

// NewUsage returns an empty Usage.
func NewUsage() *Usage {
	return &Usage{tally: iam.NewTally(), nodes: map[string]*nodeUsage{}}
}

// Usage implements iam.UsageSource: the whole subtree of project.
func (u *Usage) Usage(project string) iam.Resources { return u.tally.Usage(project) }

func (u *Usage) nodeLocked(id string) *nodeUsage {
	n := u.nodes[id]
	if n == nil {
		n = &nodeUsage{sandboxes: map[string]counted{}, byProject: map[string]iam.Resources{}}
		u.nodes[id] = n
	}
	return n
}

// Created counts a sandbox a node has just created.
func (u *Usage) Created(sb api.Sandbox) {
	u.apply(sb.Node, usageEvent{id: sb.ID, c: countOf(sb)})
}

// Deleted stops counting a sandbox a node has just deleted.
func (u *Usage) Deleted(nodeID, id string) {
	u.apply(nodeID, usageEvent{id: id, deleted: true})
}

func (u *Usage) apply(nodeID string, ev usageEvent) {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := u.nodeLocked(nodeID)
	if n.listing {
		n.events = append(n.events, ev)
	}
	if n.applyEvent(ev) {
		// O(the node's projects): cheap next to a create.
		u.tally.SetNode(nodeID, n.byProject)
	}
}

// applyEvent counts or uncounts one sandbox and reports whether anything
// changed; u.mu is held.
func (n *nodeUsage) applyEvent(ev usageEvent) bool {
	if ev.deleted {
		return n.remove(ev.id)
	}
	return n.set(ev.id, ev.c)
}

// set counts sandbox id as c; u.mu is held.
func (n *nodeUsage) set(id string, c counted) bool {
	old, had := n.sandboxes[id]
	if had && old == c {
		return false
	}
	if had {
		n.uncount(old)
	}
	n.sandboxes[id] = c
	n.byProject[c.project] = n.byProject[c.project].Add(c.res)
	return true
}

// remove stops counting sandbox id; u.mu is held.
func (n *nodeUsage) remove(id string) bool {
	old, had := n.sandboxes[id]
	if !had {
		return false
	}
	n.uncount(old)
	delete(n.sandboxes, id)
	return true
}

func (n *nodeUsage) uncount(c counted) {
	left := n.byProject[c.project].Sub(c.res)
	if left.IsZero() {
		delete(n.byProject, c.project)
	} else {
		n.byProject[c.project] = left
	}
}

// Resync replaces nodeID's figures with what list (the node's own list of
// its sandboxes) says, keeping the creates and deletes this apiserver saw
// while list ran. On error the previous figures stay: forgetting them
// would let a burst in.
func (u *Usage) Resync(nodeID string, list func() ([]api.Sandbox, error)) error {
	return u.Update(nodeID, func() (node.Changes, error) {
		l, err := list()
		return node.Changes{Full: true, Sandboxes: l}, err
	})
}

// Update brings nodeID's figures up to date with what changes (the node's
// own account, node.Changes) says: a full list replaces them, changes
// since the last call are applied to them. The creates and deletes this
// apiserver saw while changes ran are applied again on top, since the
// node's answer may predate them. On error the previous figures stay.
// Lost sandboxes count for nothing.
func (u *Usage) Update(nodeID string, changes func() (node.Changes, error)) error {
	u.mu.Lock()
	n := u.nodeLocked(nodeID)
	u.mu.Unlock()
	n.resync.Lock()
	defer n.resync.Unlock()

	u.mu.Lock()
	n.listing, n.events = true, nil
	u.mu.Unlock()
	ch, err := changes()
	u.mu.Lock()
	defer u.mu.Unlock()
	events := n.events
	n.listing, n.events = false, nil
	if err != nil {
		return err
	}
	if ch.Full {
		n.sandboxes = make(map[string]counted, len(ch.Sandboxes))
		n.byProject = map[string]iam.Resources{}
	}
	for _, sb := range ch.Sandboxes {
		if sb.State == api.StateLost {
			n.remove(sb.ID)
		} else {
			n.set(sb.ID, countOf(sb))
		}
	}
	for _, id := range ch.Deleted {
		n.remove(id)
	}
	for _, ev := range events {
		n.applyEvent(ev)
	}
	u.tally.SetNode(nodeID, n.byProject)
	return nil
}

// RemoveNode forgets a node (it left the cluster, or its sandboxes are
// lost).
func (u *Usage) RemoveNode(nodeID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.nodes, nodeID)
	u.tally.RemoveNode(nodeID)
}

// SandboxLister is a node as Follow reads it; *node.Agent is one.
type SandboxLister interface {
	ID() string
	List(ctx context.Context, f node.Filter) ([]api.Sandbox, error)
}

// Follow resyncs n every interval (the first time right away) until ctx
// ends: the feed for an in-process node (warren up). Across hosts, the
// fleet view's polls can call Resync instead.
func (u *Usage) Follow(ctx context.Context, n SandboxLister, every time.Duration) {
	resync := func() {
		lctx, cancel := context.WithTimeout(ctx, every+5*time.Second)
		defer cancel()
		u.Resync(n.ID(), func() ([]api.Sandbox, error) { return n.List(lctx, node.Filter{}) })
	}
	resync()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			resync()
		}
	}
}

// countOf is what one sandbox counts against its project's quota.
func countOf(sb api.Sandbox) counted {
	return counted{project: sb.Project, res: iam.Resources{
		Sandboxes: 1, MilliCPU: iam.MilliCPU(sb.Resources.CPU), Memory: int64(sb.Resources.Memory),
		Disk: int64(sb.Resources.Disk),
	}}
}
