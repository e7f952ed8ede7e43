package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/node"
)

// Snapshotter is what the snapshot routes need of the layer store;
// *image.Registry does.
type Snapshotter interface {
	RegisterSnapshot(ctx context.Context, spec image.SnapshotSpec) (api.Snapshot, error)
	GetSnapshot(ctx context.Context, ref string) (api.Snapshot, error)
	ListSnapshots(ctx context.Context) ([]api.Snapshot, error)
	DeleteSnapshot(ctx context.Context, ref string, users []string, force bool, live map[string][]string) error
}

// snapshotRoutes registers the snapshot of a sandbox (served here, not
// forwarded: its records are the control plane's) and /v1/snapshots.
func (s *Server) snapshotRoutes(auth func(handler) http.Handler) {
	s.mux.Handle("POST /v1/sandboxes/{id}/snapshot", auth(s.changesImages(s.snapshotSandbox)))
	s.mux.Handle("POST /v1/sandboxes/{id}/fork", auth(s.changesImages(s.forkSandbox)))
	s.mux.Handle("GET /v1/snapshots", auth(s.listSnapshots))
	// {ref...}: names may hold "/"; a trailing "/lineage" asks for the
	// lineage (lineage.go).
	s.mux.Handle("GET /v1/snapshots/{ref...}", auth(s.getSnapshot))
	s.mux.Handle("DELETE /v1/snapshots/{ref...}", auth(s.changesImages(s.deleteSnapshot)))
}

func (s *Server) snapshotter() (Snapshotter, error) {
	sn, ok := s.cfg.Layers.(Snapshotter)
	if !ok {
		return nil, errdefs.Unavailable("this server keeps no snapshots")
	}
	return sn, nil
}

// snapshotSandbox takes a snapshot: the sandbox's node packs what it
// wrote into a diff layer in the blob store (the node API's pack), then
// the layer, its environment and the snapshot record are registered. The
// sandbox runs on throughout; a failure anywhere leaves it untouched and
// registers nothing (the packed blobs, unreferenced, go at the next GC).
func (s *Server) snapshotSandbox(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.snapshotter()
	if err != nil {
		return err
	}
	var req api.SnapshotRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := api.CheckSnapshot(&req); err != nil {
		return errdefs.Request(err)
	}
	if req.Name != "" {
		if err := image.ValidateName(req.Name); err != nil {
			return err
		}
	}
	if req.Version != "" {
		if err := image.ValidateVersion(req.Version); err != nil {
			return err
		}
	}
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	if req.Name != "" && req.Version != "" {
		// Taken already: say so before the node packs anything.
		ref := req.Name + "@" + req.Version
		if _, err := s.cfg.Layers.GetEnv(r.Context(), ref); err == nil {
			return errdefs.New(errdefs.ErrConflict, api.CodeEnvExists, "environment %s already exists", ref)
		}
		if _, err := s.cfg.Layers.DescribeLayer(r.Context(), ref); err == nil {
			return errdefs.New(errdefs.ErrConflict, api.CodeLayerExists, "layer %s already exists", ref)
		}
	}
	snap, _, err := s.takeSnapshot(r.Context(), sn, n, id, req, false)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, snap)
}

// takeSnapshot has sandbox id's node n pack it and registers the result;
// it returns the snapshot and the source as its node described it.
func (s *Server) takeSnapshot(ctx context.Context, sn Snapshotter, n Node, id string, req api.SnapshotRequest, ephemeral bool) (api.Snapshot, api.Sandbox, error) {
	src, err := n.Get(ctx, id)
	if err != nil {
		return api.Snapshot{}, api.Sandbox{}, err
	}
	var pack api.PackResult
	if err := callNode(ctx, n, id, "pack", api.PackRequest{Strip: req.Strip, KeepResidue: req.KeepResidue, WithProcesses: req.WithProcesses}, &pack); err != nil {
		return api.Snapshot{}, api.Sandbox{}, err
	}
	snap, err := sn.RegisterSnapshot(ctx, image.SnapshotSpec{Name: req.Name, Version: req.Version, Labels: req.Labels,
		Source: src, Pack: pack, CreatedBy: principal(ctx).TokenID, Ephemeral: ephemeral})
	if err == nil {
		s.squashAfter(ctx, snap) // squash.go
	}
	return snap, src, err
}

// forkSandbox makes count sandboxes from a sandbox's state now: a
// snapshot of it (unnamed: its environment is named by its id), then a
// gang created from it, preferably on the parent's node, where the
// snapshot's layers already are. The parent runs on.
func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.snapshotter()
	if err != nil {
		return err
	}
	var req api.ForkRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Count == 0 {
		req.Count = 1
	}
	if err := api.CheckFork(&req); err != nil {
		return errdefs.Request(err)
	}
	ctx := r.Context()
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	snap, src, err := s.takeSnapshot(ctx, sn, n, id, api.SnapshotRequest{Labels: req.Labels, KeepResidue: true, WithProcesses: req.WithProcesses}, true)
	if err != nil {
		return err
	}
	tmpl := api.CreateSandboxRequest{Backend: src.Backend, Runtime: src.Runtime, Image: snap.Ref, Resources: src.Resources,
		Labels: maps.Clone(src.Labels), TTL: src.TTL, IdleTimeout: src.IdleTimeout, Project: src.Project, Build: &src.Build,
		AutoPause: src.AutoPause, TTLWhilePaused: src.TTLWhilePaused}
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	delete(tmpl.Labels, api.LabelGang) // the branches are a gang of their own
	delete(tmpl.Labels, api.LabelGangIndex)
	// A worker's branches are no workers; a driven sandbox's are driven
	// by the same worker.
	tmpl.WorkerOf = tmpl.Labels[api.LabelWorkerOf]
	delete(tmpl.Labels, api.LabelWorker)
	delete(tmpl.Labels, api.LabelWorkerOf)
	maps.Copy(tmpl.Labels, req.Labels)
	tmpl.Labels[api.LabelForkOf], tmpl.Labels[api.LabelSnapshot] = src.ID, snap.ID
	if src.Network != nil {
		p := src.Network.NetworkPolicy
		tmpl.Network = &p
	}
	batch := api.BatchCreateRequest{Count: req.Count, Template: tmpl, AllOrNone: req.AllOrNone}
	if err := api.CheckBatch(&batch); err != nil {
		return errdefs.Request(err)
	}
	out, status, err := s.createGang(withPreferredNode(ctx, src.Node), batch)
	if err != nil {
		return err
	}
	return writeJSON(w, status, api.ForkResponse{Snapshot: snap, BatchCreateResponse: out})
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.snapshotter()
	if err != nil {
		return err
	}
	scope, err := listScope(r)
	if err != nil {
		return err
	}
	all, err := sn.ListSnapshots(r.Context())
	if err != nil {
		return err
	}
	source := r.URL.Query().Get("source")
	out := api.SnapshotList{Snapshots: []api.Snapshot{}}
	for _, snap := range all {
		if iam.InScope(scope, snap.Project) && (source == "" || snap.Source == source) && (!snap.Unpublished || builder(r.Context())) {
			out.Snapshots = append(out.Snapshots, snap)
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.snapshotter()
	if err != nil {
		return err
	}
	ref := r.PathValue("ref")
	if of, ok := strings.CutSuffix(ref, "/lineage"); ok {
		return s.lineage(w, r, sn, of) // lineage.go
	}
	snap, err := s.visibleSnapshot(r.Context(), sn, ref)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, snap)
}

// visibleSnapshot returns snapshot ref if it is in the caller's scope; one
// outside it answers as a missing one.
func (s *Server) visibleSnapshot(ctx context.Context, sn Snapshotter, ref string) (api.Snapshot, error) {
	snap, err := sn.GetSnapshot(ctx, ref)
	if err != nil {
		return api.Snapshot{}, err
	}
	if p := principal(ctx); !iam.InScope(p.Project, snap.Project) || snap.Unpublished && !builder(ctx) {
		return api.Snapshot{}, errdefs.New(errdefs.ErrNotFound, api.CodeSnapshotNotFound, "snapshot %s not found", ref)
	}
	return snap, nil
}

// deleteSnapshot deletes a snapshot, refusing (409 snapshot_in_use) one
// that live sandboxes or other snapshots build on unless ?force=true.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.snapshotter()
	if err != nil {
		return err
	}
	ctx := r.Context()
	snap, err := s.visibleSnapshot(ctx, sn, r.PathValue("ref"))
	if err != nil {
		return err
	}
	force := r.URL.Query().Get("force") == "true"
	list, err := s.cluster.List(ctx, node.Filter{})
	if err != nil {
		return err
	}
	var users []string
	for _, sb := range list {
		if sb.Image == snap.Ref {
			users = append(users, sb.ID)
		}
	}
	live, err := s.liveLayers(ctx)
	if err != nil {
		return err
	}
	if err := sn.DeleteSnapshot(ctx, snap.ID, users, force, live); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// callNode makes one JSON call on sandbox id at its node, POST
// /v1/sandboxes/{id}/{verb}, by the path every call on a sandbox takes
// (Node.Forward), and decodes the answer into out: for the verbs the
// apiserver serves itself on top of a node's (a snapshot over a pack).
func callNode(ctx context.Context, n Node, id, verb string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/"+verb, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	rec := &recorder{header: http.Header{}}
	if err := n.Forward(rec, req, id); err != nil {
		return err
	}
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if rec.status/100 != 2 {
		return httperr.Read(&http.Response{StatusCode: rec.status, Header: rec.header, Body: io.NopCloser(&rec.body)})
	}
	if err := json.Unmarshal(rec.body.Bytes(), out); err != nil {
		return errors.Join(errdefs.Unavailable("node answered %s of %s with what is not JSON", verb, id), err)
	}
	return nil
}

// recorder is an http.ResponseWriter that keeps the answer (small JSON).
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
