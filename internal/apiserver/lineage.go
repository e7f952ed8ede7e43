package apiserver

import (
	"errors"
	"net/http"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
)

// lineage answers GET /v1/snapshots/{ref}/lineage: ref is a snapshot (id
// or name@version) or a sandbox id, and the answer the snapshots it
// descends from and the tree of what was made from it (api.Lineage), as
// far as the caller's scope reaches.
func (s *Server) lineage(w http.ResponseWriter, r *http.Request, sn Snapshotter, ref string) error {
	ctx := r.Context()
	scope := principal(ctx).Project
	all, err := sn.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	list, err := s.cluster.List(ctx, node.Filter{})
	if err != nil {
		return err
	}
	var sbs []api.Sandbox
	for _, sb := range list {
		if iam.InScope(scope, sb.Project) && (!sb.Build || builder(ctx)) {
			sbs = append(sbs, sb)
		}
	}
	t := newLineageTree(all, sbs, scope, builder(ctx))

	var out api.Lineage
	var from string // the snapshot the ancestors start at
	if snap, err := s.visibleSnapshot(ctx, sn, ref); err == nil {
		out.Root = t.snapshotNode(snap)
		from = snap.Parent
		out.Base = snap.SourceImage
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return err
	} else {
		sb, ok := t.sandboxes[ref]
		if !ok {
			return errdefs.New(errdefs.ErrNotFound, api.CodeSnapshotNotFound, "no snapshot or sandbox %s", ref)
		}
		out.Root = t.sandboxNode(sb)
		from, out.Base = t.byRef[sb.Image].ID, sb.Image
	}
	for id := from; id != ""; {
		p, ok := t.byID[id]
		if !ok {
			break // deleted, or outside the scope
		}
		out.Ancestors = append([]api.Snapshot{p}, out.Ancestors...)
		out.Base = p.SourceImage
		id = p.Parent
	}
	if out.Ancestors == nil {
		out.Ancestors = []api.Snapshot{}
	}
	return writeJSON(w, http.StatusOK, out)
}

// lineageTree indexes snapshots and live sandboxes for lineage.
type lineageTree struct {
	byID, byRef map[string]api.Snapshot
	sandboxes   map[string]api.Sandbox
	ofSandbox   map[string][]api.Snapshot // snapshots by source
	children    map[string][]api.Snapshot // snapshots by parent, whose source is gone
	madeFrom    map[string][]api.Sandbox  // live sandboxes by image
}

func newLineageTree(all []api.Snapshot, sbs []api.Sandbox, scope string, unpublished bool) *lineageTree {
	t := &lineageTree{byID: map[string]api.Snapshot{}, byRef: map[string]api.Snapshot{}, sandboxes: map[string]api.Sandbox{},
		ofSandbox: map[string][]api.Snapshot{}, children: map[string][]api.Snapshot{}, madeFrom: map[string][]api.Sandbox{}}
	for _, sb := range sbs {
		t.sandboxes[sb.ID] = sb
		t.madeFrom[sb.Image] = append(t.madeFrom[sb.Image], sb)
	}
	for _, snap := range all {
		if !iam.InScope(scope, snap.Project) || snap.Unpublished && !unpublished {
			continue
		}
		t.byID[snap.ID], t.byRef[snap.Ref] = snap, snap
		if _, live := t.sandboxes[snap.Source]; live {
			t.ofSandbox[snap.Source] = append(t.ofSandbox[snap.Source], snap)
		} else if snap.Parent != "" {
			t.children[snap.Parent] = append(t.children[snap.Parent], snap)
		}
	}
	return t
}

func (t *lineageTree) snapshotNode(snap api.Snapshot) api.LineageNode {
	n := api.LineageNode{Snapshot: &snap}
	for _, sb := range t.madeFrom[snap.Ref] {
		n.Children = append(n.Children, t.sandboxNode(sb))
	}
	for _, c := range t.children[snap.ID] {
		n.Children = append(n.Children, t.snapshotNode(c))
	}
	return n
}

func (t *lineageTree) sandboxNode(sb api.Sandbox) api.LineageNode {
	n := api.LineageNode{Sandbox: &sb}
	for _, c := range t.ofSandbox[sb.ID] {
		n.Children = append(n.Children, t.snapshotNode(c))
	}
	return n
}
