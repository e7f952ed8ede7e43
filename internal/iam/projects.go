package iam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// projectsKey holds the whole project tree as one record, so that every
// delegation rule (which always spans a project and its sub-projects) is
// checked and written atomically by one CompareAndPut.
const (
	projectsKey    = "/iam/projects"
	projectsFormat = 1
	// RootUID is the root project's fixed UID: the root always exists.
	RootUID = "root"
	// maxTreeBytes keeps the tree record well under etcd's default request
	// limit (1.5 MiB).
	maxTreeBytes   = 1 << 20
	maxDescription = 256
)

// Project is one node of the project tree.
type Project struct {
	Path string `json:"path"` // "" is the root
	// UID changes when a path is deleted and created again, so tokens of
	// the old project do not carry over to the new one.
	UID         string `json:"uid"`
	Quota       Quota  `json:"quota"`
	Description string `json:"description,omitempty"`
	// MemoryMerge is ProjectSpec.MemoryMerge.
	MemoryMerge bool      `json:"memory_merge,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	CreatedBy   string    `json:"created_by,omitempty"` // token id
	UpdatedAt   time.Time `json:"updated_at"`
	// Usage is what the fleet view reports for the whole subtree, and
	// Reserved the in-flight reservations this apiserver holds for it;
	// both are filled in by GetProject and ListProjects.
	Usage    Resources `json:"usage"`
	Reserved Resources `json:"reserved"`
}

// ProjectSpec is what a caller sets on a project.
type ProjectSpec struct {
	Quota       Quota  `json:"quota"`
	Description string `json:"description,omitempty"`
	// MemoryMerge lets nodes merge equal memory pages (KSM) among the
	// sandboxes of this project and its sub-projects, and only among
	// them: a node runs merging sandboxes of one such project at a time
	// (MergeGroup). A sub-project that sets it too forms a group of its
	// own. Merged pages leak by write timing to everything merged with
	// them, so this is for one tenant's sandboxes, never across tenants:
	// on the root project it merges every project's (a single-tenant
	// installation's choice).
	MemoryMerge bool `json:"memory_merge,omitempty"`
}

func (s ProjectSpec) validate() error {
	if len(s.Description) > maxDescription {
		return errdefs.Invalid("project description longer than %d bytes", maxDescription)
	}
	return s.Quota.validate()
}

type projectRecord struct {
	UID         string    `json:"uid"`
	Quota       Quota     `json:"quota"`
	Description string    `json:"description,omitempty"`
	MemoryMerge bool      `json:"memory_merge,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	CreatedBy   string    `json:"created_by,omitempty"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// projectsDoc is the stored tree; V versions the format.
type projectsDoc struct {
	V        int                      `json:"v"`
	Projects map[string]projectRecord `json:"projects"` // by path, "" the root
}

// tree is an immutable, indexed copy of a projectsDoc.
type tree struct {
	rev    int64 // store version of the doc (0: none stored yet)
	loaded time.Time
	nodes  map[string]*tnode
}

type tnode struct {
	path     string
	rec      projectRecord
	lim      [nLimits]int64
	parent   *tnode
	children []*tnode
	// below[d] are the nearest descendants with a limit on d: those whose
	// path up to this node crosses no other project limited on d. Their
	// limits are what this node has delegated.
	below [nLimits][]*tnode
}

func buildTree(doc projectsDoc, rev int64, now time.Time) *tree {
	t := &tree{rev: rev, loaded: now, nodes: make(map[string]*tnode, len(doc.Projects))}
	for p, rec := range doc.Projects {
		t.nodes[p] = &tnode{path: p, rec: rec, lim: rec.Quota.limits()}
	}
	paths := make([]string, 0, len(t.nodes))
	for p := range t.nodes {
		paths = append(paths, p)
	}
	sort.Strings(paths) // parents before children, children sorted
	for _, p := range paths {
		n := t.nodes[p]
		if p == "" {
			continue
		}
		par := t.nodes[Parent(p)]
		if par == nil { // an orphan cannot be stored through this package
			delete(t.nodes, p)
			continue
		}
		n.parent = par
		par.children = append(par.children, n)
	}
	for _, p := range paths {
		n := t.nodes[p]
		if n == nil {
			continue
		}
		for d := range nLimits {
			if n.lim[d] == 0 {
				continue
			}
			if a := n.limitedAncestor(d); a != nil {
				a.below[d] = append(a.below[d], n)
			}
		}
	}
	return t
}

// limitedAncestor returns the nearest proper ancestor limited on d.
func (n *tnode) limitedAncestor(d int) *tnode {
	for a := n.parent; a != nil; a = a.parent {
		if a.lim[d] > 0 {
			return a
		}
	}
	return nil
}

// delegated returns the sum of the limits n has handed down on d.
func (n *tnode) delegated(d int) int64 {
	var s int64
	for _, c := range n.below[d] {
		s += c.lim[d]
	}
	return s
}

func (n *tnode) project() Project {
	return Project{
		Path: n.path, UID: n.rec.UID, Quota: n.rec.Quota, Description: n.rec.Description, MemoryMerge: n.rec.MemoryMerge,
		CreatedAt: n.rec.CreatedAt, CreatedBy: n.rec.CreatedBy, UpdatedAt: n.rec.UpdatedAt,
	}
}

// loadDoc reads the stored tree; an empty store has the root alone.
func (i *IAM) loadDoc(ctx context.Context) (projectsDoc, int64, error) {
	kv, err := i.st.Get(ctx, projectsKey)
	if errors.Is(err, errdefs.ErrNotFound) {
		return projectsDoc{V: projectsFormat, Projects: map[string]projectRecord{"": {UID: RootUID}}}, 0, nil
	}
	if err != nil {
		return projectsDoc{}, 0, fmt.Errorf("iam: load projects: %w", err)
	}
	var doc projectsDoc
	if err := json.Unmarshal(kv.Value, &doc); err != nil {
		return projectsDoc{}, 0, fmt.Errorf("iam: decode projects: %w", err)
	}
	if doc.V > projectsFormat {
		return projectsDoc{}, 0, fmt.Errorf("iam: projects stored in format %d, newer than this binary's %d", doc.V, projectsFormat)
	}
	if doc.Projects == nil {
		doc.Projects = map[string]projectRecord{}
	}
	if _, ok := doc.Projects[""]; !ok {
		doc.Projects[""] = projectRecord{UID: RootUID}
	}
	return doc, kv.Version, nil
}

// mutate applies fn to a fresh copy of the tree and writes it back with
// CompareAndPut, retrying on concurrent writers. fn returns the path whose
// delegation rules must be re-checked ("-" for none).
func (i *IAM) mutate(ctx context.Context, fn func(doc projectsDoc) (changed string, err error)) (*tree, error) {
	for attempt := 0; ; attempt++ {
		doc, rev, err := i.loadDoc(ctx)
		if err != nil {
			return nil, err
		}
		changed, err := fn(doc)
		if err != nil {
			return nil, err
		}
		t := buildTree(doc, rev, i.now())
		if changed != "-" {
			if err := checkDelegation(t, changed); err != nil {
				return nil, err
			}
		}
		doc.V = projectsFormat
		val, err := json.Marshal(doc)
		if err != nil {
			return nil, fmt.Errorf("iam: encode projects: %w", err)
		}
		if len(val) > maxTreeBytes && changed != "-" {
			return nil, errdefs.New(errdefs.ErrConflict, CodeTooManyProjects,
				"the project tree would take %d bytes, above the %d one store value may hold", len(val), maxTreeBytes)
		}
		err = i.st.CompareAndPut(ctx, projectsKey, val, rev)
		if err == nil {
			if nt, err := i.loadTree(ctx); err == nil {
				return nt, nil
			}
			return t, nil
		}
		if !errors.Is(err, errdefs.ErrConflict) || attempt >= 20 {
			return nil, fmt.Errorf("iam: write projects: %w", err)
		}
		if err := sleepCtx(ctx, time.Duration(rand.Int64N(int64(time.Millisecond)<<min(attempt, 6)))); err != nil {
			return nil, err
		}
	}
}

// checkDelegation enforces, around the project at path, the delegation
// rule: for every dimension, what a project has delegated (the limits of
// its nearest limited descendants) adds up to no more than its own limit.
// Only path and its nearest limited ancestors can have changed.
func checkDelegation(t *tree, path string) error {
	n := t.nodes[path]
	if n == nil {
		return nil // deleted: sums only shrink
	}
	for d := range nLimits {
		if a := n.limitedAncestor(d); a != nil {
			if s := a.delegated(d); s > a.lim[d] {
				return errdefs.New(errdefs.ErrConflict, CodeQuotaExceedsParent,
					"%s quotas delegated under %s would add up to %s, above its own %s",
					dimNames[d], displayPath(a.path), fmtDim(d, s), fmtDim(d, a.lim[d]))
			}
		}
		if n.lim[d] > 0 {
			if s := n.delegated(d); s > n.lim[d] {
				return errdefs.New(errdefs.ErrConflict, CodeQuotaBelowChildren,
					"%s quota of %s would be %s, below the %s delegated to its sub-projects",
					dimNames[d], displayPath(n.path), fmtDim(d, n.lim[d]), fmtDim(d, s))
			}
		}
	}
	return nil
}

func projectNotFound(path string) error {
	return errdefs.New(errdefs.ErrNotFound, CodeProjectNotFound, "project %s not found", displayPath(path))
}

// CreateProject creates the sub-project path with spec, on behalf of by
// (an admin whose scope is a proper ancestor of path). Errors: ErrInvalid
// (path, quota), ErrForbidden, ErrNotFound (parent missing), ErrConflict
// (exists; CodeQuotaExceedsParent when the parent has not that much left to
// delegate; CodeTooManyProjects).
func (i *IAM) CreateProject(ctx context.Context, by Principal, path string, spec ProjectSpec) (Project, error) {
	path, err := CleanPath(path)
	if err != nil {
		return Project{}, err
	}
	if err := spec.validate(); err != nil {
		return Project{}, err
	}
	if path == "" {
		return Project{}, errdefs.New(errdefs.ErrConflict, CodeProjectExists, "the root project always exists")
	}
	if err := Authorize(by, ActionProjectWrite, path); err != nil {
		return Project{}, err
	}
	now := i.now().UTC()
	t, err := i.mutate(ctx, func(doc projectsDoc) (string, error) {
		if _, ok := doc.Projects[path]; ok {
			return "", errdefs.New(errdefs.ErrConflict, CodeProjectExists, "project %s already exists", path)
		}
		if _, ok := doc.Projects[Parent(path)]; !ok {
			return "", errdefs.New(errdefs.ErrNotFound, CodeProjectNotFound,
				"parent project %s of %s not found", displayPath(Parent(path)), path)
		}
		if len(doc.Projects) >= i.opts.MaxProjects {
			return "", errdefs.New(errdefs.ErrConflict, CodeTooManyProjects,
				"the project tree is full (%d projects)", i.opts.MaxProjects)
		}
		doc.Projects[path] = projectRecord{
			UID: newID(8), Quota: spec.Quota, Description: spec.Description, MemoryMerge: spec.MemoryMerge,
			CreatedAt: now, CreatedBy: by.TokenID, UpdatedAt: now,
		}
		return path, nil
	})
	if err != nil {
		return Project{}, err
	}
	return i.withUsage(t.nodes[path]), nil
}

// UpdateProject replaces the quota, description and memory merging of
// path (merging changed applies to sandboxes created after). A quota may
// shrink below current usage (admission then refuses until usage drains)
// but never below what the project has delegated (CodeQuotaBelowChildren),
// and may grow only within what its parent has left (CodeQuotaExceedsParent).
// Errors as CreateProject, plus ErrNotFound.
func (i *IAM) UpdateProject(ctx context.Context, by Principal, path string, spec ProjectSpec) (Project, error) {
	path, err := CleanPath(path)
	if err != nil {
		return Project{}, err
	}
	if err := spec.validate(); err != nil {
		return Project{}, err
	}
	if err := Authorize(by, ActionProjectWrite, path); err != nil {
		return Project{}, err
	}
	now := i.now().UTC()
	t, err := i.mutate(ctx, func(doc projectsDoc) (string, error) {
		rec, ok := doc.Projects[path]
		if !ok {
			return "", projectNotFound(path)
		}
		rec.Quota, rec.Description, rec.MemoryMerge, rec.UpdatedAt = spec.Quota, spec.Description, spec.MemoryMerge, now
		doc.Projects[path] = rec
		return path, nil
	})
	if err != nil {
		return Project{}, err
	}
	return i.withUsage(t.nodes[path]), nil
}

// MergeGroup returns the memory merge group of project's sandboxes: the
// UID of the nearest project, itself or an ancestor, with MemoryMerge
// on; "" when none has it (its sandboxes merge with nothing).
// ErrNotFound for an unknown project.
func (i *IAM) MergeGroup(ctx context.Context, project string) (string, error) {
	project, err := CleanPath(project)
	if err != nil {
		return "", err
	}
	t, err := i.treeWith(ctx, project)
	if err != nil {
		return "", err
	}
	n := t.nodes[project]
	if n == nil {
		return "", projectNotFound(project)
	}
	for ; n != nil; n = n.parent {
		if n.rec.MemoryMerge {
			return n.rec.UID, nil
		}
	}
	return "", nil
}

// DeleteProject deletes path. ErrConflict with CodeProjectHasChildren or
// CodeProjectInUse (the fleet view or a reservation still counts usage
// there); ErrInvalid for the root. Its tokens stop working (their project
// UID no longer exists) and are removed.
func (i *IAM) DeleteProject(ctx context.Context, by Principal, path string) error {
	path, err := CleanPath(path)
	if err != nil {
		return err
	}
	if path == "" {
		return errdefs.Invalid("the root project cannot be deleted")
	}
	if err := Authorize(by, ActionProjectWrite, path); err != nil {
		return err
	}
	var uid string
	_, err = i.mutate(ctx, func(doc projectsDoc) (string, error) {
		rec, ok := doc.Projects[path]
		if !ok {
			return "", projectNotFound(path)
		}
		for p := range doc.Projects {
			if strings.HasPrefix(p, path+"/") {
				return "", errdefs.New(errdefs.ErrConflict, CodeProjectHasChildren,
					"project %s has sub-projects (%s): delete them first", path, p)
			}
		}
		if u, r := i.usage(path), i.adm.reserved(path); !u.IsZero() || !r.IsZero() {
			return "", errdefs.New(errdefs.ErrConflict, CodeProjectInUse,
				"project %s still has sandboxes (%d in use, %d being created)", path, u.Sandboxes, r.Sandboxes)
		}
		uid = rec.UID
		delete(doc.Projects, path)
		return "-", nil
	})
	if err != nil {
		return err
	}
	i.deleteProjectTokens(ctx, path, uid)
	return nil
}

// GetProject returns path with its usage, read from the store (not the
// cache). Needs ActionRead on path.
func (i *IAM) GetProject(ctx context.Context, by Principal, path string) (Project, error) {
	path, err := CleanPath(path)
	if err != nil {
		return Project{}, err
	}
	if err := Authorize(by, ActionRead, path); err != nil {
		return Project{}, err
	}
	t, err := i.loadTree(ctx)
	if err != nil {
		return Project{}, err
	}
	n := t.nodes[path]
	if n == nil {
		return Project{}, projectNotFound(path)
	}
	return i.withUsage(n), nil
}

// ListProjects returns path and every project under it, sorted by path,
// read from the store. Needs ActionRead on path.
func (i *IAM) ListProjects(ctx context.Context, by Principal, path string) ([]Project, error) {
	path, err := CleanPath(path)
	if err != nil {
		return nil, err
	}
	if err := Authorize(by, ActionRead, path); err != nil {
		return nil, err
	}
	t, err := i.loadTree(ctx)
	if err != nil {
		return nil, err
	}
	if t.nodes[path] == nil {
		return nil, projectNotFound(path)
	}
	var out []Project
	for p, n := range t.nodes {
		if InScope(path, p) {
			out = append(out, i.withUsage(n))
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Path < out[b].Path })
	return out, nil
}

func (i *IAM) withUsage(n *tnode) Project {
	p := n.project()
	p.Usage = i.usage(n.path)
	p.Reserved = i.adm.reserved(n.path)
	return p
}

func (i *IAM) usage(path string) Resources {
	if i.opts.Usage == nil {
		return Resources{}
	}
	return i.opts.Usage.Usage(path)
}
