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
	old, had := n.sandboxes[ev.id]
	switch {
	case ev.deleted && !had, !ev.deleted && had && old == ev.c:
		return
	case had:
		n.byProject[old.project] = n.byProject[old.project].Sub(old.res)
		if n.byProject[old.project].IsZero() {
			delete(n.byProject, old.project)
		}
	}
	if ev.deleted {
		delete(n.sandboxes, ev.id)
	} else {
		n.sandboxes[ev.id] = ev.c
		n.byProject[ev.c.project] = n.byProject[ev.c.project].Add(ev.c.res)
	}
	// O(the node's projects): cheap next to a create.
	u.tally.SetNode(nodeID, n.byProject)
}

// Resync replaces nodeID's figures with what list (the node's own list of
// its sandboxes) says, keeping the creates and deletes this apiserver saw
// while list ran. On error the previous figures stay: forgetting them
// would let a burst in.
func (u *Usage) Resync(nodeID string, list func() ([]api.Sandbox, error)) error {
	u.mu.Lock()
	n := u.nodeLocked(nodeID)
	u.mu.Unlock()
	n.resync.Lock()
	defer n.resync.Unlock()

	u.mu.Lock()
	n.listing, n.events = true, nil
	u.mu.Unlock()
	sbs, err := list()
	u.mu.Lock()
	defer u.mu.Unlock()
	events := n.events
	n.listing, n.events = false, nil
	if err != nil {
		return err
	}
	m := make(map[string]counted, len(sbs))
	for _, sb := range sbs {
		if sb.State != api.StateLost {
			m[sb.ID] = countOf(sb)
		}
	}
	for _, ev := range events {
		if ev.deleted {
			delete(m, ev.id)
		} else {
			m[ev.id] = ev.c
		}
	}
	by := map[string]iam.Resources{}
	for _, c := range m {
		by[c.project] = by[c.project].Add(c.res)
	}
	n.sandboxes, n.byProject = m, by
	u.tally.SetNode(nodeID, by)
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
	}}
}
