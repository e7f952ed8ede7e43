package iam

import "sync"

// Tally is a UsageSource the fleet view can feed: each node's report of
// what its sandboxes use per project replaces that node's previous report,
// and Usage answers for whole subtrees from sums kept up to date on every
// report (O(1) per call). Safe for concurrent use.
type Tally struct {
	mu     sync.RWMutex
	nodes  map[string]map[string]Resources // node -> project -> direct usage
	rollup map[string]vec                  // project -> subtree usage
}

var _ UsageSource = (*Tally)(nil)

// NewTally returns an empty Tally.
func NewTally() *Tally {
	return &Tally{nodes: map[string]map[string]Resources{}, rollup: map[string]vec{}}
}

// SetNode replaces what node reports: byProject maps each project path to
// the resources its sandboxes on that node use (sandboxes in sub-projects
// are reported under the sub-project). A nil or empty map clears the node.
func (t *Tally) SetNode(node string, byProject map[string]Resources) {
	cp := make(map[string]Resources, len(byProject))
	for p, r := range byProject {
		if p, err := CleanPath(p); err == nil && !r.IsZero() {
			cp[p] = cp[p].Add(r)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for p, r := range t.nodes[node] {
		t.addLocked(p, r.vec(), -1)
	}
	for p, r := range cp {
		t.addLocked(p, r.vec(), 1)
	}
	if len(cp) == 0 {
		delete(t.nodes, node)
	} else {
		t.nodes[node] = cp
	}
}

// RemoveNode forgets node (it left, or its sandboxes are lost).
func (t *Tally) RemoveNode(node string) { t.SetNode(node, nil) }

// Usage implements UsageSource.
func (t *Tally) Usage(project string) Resources {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return fromVec(t.rollup[project])
}

// addLocked adds sign*v to project and each of its ancestors.
func (t *Tally) addLocked(project string, v vec, sign int64) {
	for d := range v {
		v[d] *= sign
	}
	for p := project; ; p = Parent(p) {
		s := t.rollup[p].add(v)
		if s == (vec{}) {
			delete(t.rollup, p)
		} else {
			t.rollup[p] = s
		}
		if p == "" {
			return
		}
	}
}
