package apiserver

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
)

// Bulk pause and resume: POST /v1/sandboxes:pause and :resume pause (or
// resume) every sandbox a selector matches, across nodes, each through
// its node's own pause (POST /v1/sandboxes/{id}/pause, forwarded like
// every call on one sandbox). A trainer preempted pauses its project's
// sandboxes in one call; when it comes back, any call on one resumes it,
// or a bulk resume does them all.

// bulkPauseWidth bounds the pauses in flight on one node.
const bulkPauseWidth = 8

func (s *Server) bulkPause(w http.ResponseWriter, r *http.Request) error {
	resume := strings.HasSuffix(r.URL.Path, ":resume")
	var sel api.PauseSelector
	if err := decodeJSON(w, r, &sel); err != nil {
		return err
	}
	if len(sel.Labels) == 0 && sel.Project == "" {
		return errdefs.Invalid("a bulk pause or resume needs labels, a project or both")
	}
	if err := api.CheckLabels("labels", sel.Labels, api.MaxLabels); err != nil {
		return errdefs.Request(err)
	}
	ctx := r.Context()
	p := principal(ctx)
	project, err := projectFor(p, sel.Project, iam.ActionSandboxLifecycle)
	if err != nil {
		return err
	}
	by := "selector"
	if len(sel.Labels) == 0 {
		by = "project"
	}
	stream := r.Header.Get("Accept") == ndjsonType
	var progress func(total int, item *api.BulkPauseItem)
	if stream {
		// Each sandbox as it is done, for a caller's progress.
		w.Header().Set("Content-Type", ndjsonType)
		w.WriteHeader(http.StatusOK)
		enc := json.NewEncoder(w)
		rc := http.NewResponseController(w)
		progress = func(total int, item *api.BulkPauseItem) {
			ev := api.BulkPauseEvent{Sandbox: item}
			if item == nil {
				ev.Total = &total
			}
			enc.Encode(ev)
			rc.Flush()
		}
	}
	res, err := s.pauseAll(ctx, project, sel.Labels, resume, by, progress)
	if stream {
		if err != nil {
			_, e := apiError(err)
			return json.NewEncoder(w).Encode(map[string]any{"error": e})
		}
		return json.NewEncoder(w).Encode(api.BulkPauseEvent{Result: &res})
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

// pauseAll pauses (or resumes) the sandboxes in project's subtree that
// carry labels: the running ones (or the paused ones), nodes in
// parallel, bulkPauseWidth at a time on each. progress, if set, hears the
// total (with a nil item) first, then each sandbox as it is done.
func (s *Server) pauseAll(ctx context.Context, project string, labels map[string]string, resume bool, by string,
	progress func(total int, item *api.BulkPauseItem)) (api.BulkPauseResult, error) {
	list, err := s.cluster.List(ctx, node.Filter{Labels: labels})
	if err != nil {
		return api.BulkPauseResult{}, err
	}
	want, verb := api.StateRunning, "pause?by="+by
	if resume {
		want, verb = api.StatePaused, "resume?by=caller"
	}
	byNode := map[string][]api.Sandbox{}
	for _, sb := range inScope(list, project, builder(ctx)) {
		if sb.State == want {
			byNode[sb.Node] = append(byNode[sb.Node], sb)
		}
	}
	res := api.BulkPauseResult{Sandboxes: []api.BulkPauseItem{}, Nodes: map[string]api.BulkNodeCount{}}
	if progress != nil {
		total := 0
		for _, sbs := range byNode {
			total += len(sbs)
		}
		progress(total, nil)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for nodeID, sbs := range byNode {
		sem := make(chan struct{}, bulkPauseWidth)
		for _, sb := range sbs {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				item := api.BulkPauseItem{ID: sb.ID, Node: nodeID}
				n, err := s.routeNode(sb.ID)
				var out api.Sandbox
				if err == nil {
					err = callNode(ctx, n, sb.ID, verb, struct{}{}, &out)
				}
				mu.Lock()
				defer mu.Unlock()
				c := res.Nodes[nodeID]
				if err != nil {
					_, e := httperr.ToAPI(err)
					item.Error = &e
					c.Failed++
				} else {
					item.State = out.State
					c.Done++
				}
				res.Nodes[nodeID] = c
				res.Sandboxes = append(res.Sandboxes, item)
				if progress != nil {
					progress(0, &item)
				}
			}()
		}
	}
	wg.Wait()
	s.log.Info("bulk "+map[bool]string{false: "pause", true: "resume"}[resume], "project", project, "labels", labels,
		"sandboxes", len(res.Sandboxes), "nodes", len(res.Nodes))
	return res, nil
}

// settleMergeGroup sets a create's memory merge group from its project
// (iam.MergeGroup): never the caller's, whose value would let it merge
// memory with another tenant's sandboxes.
func (s *Server) settleMergeGroup(ctx context.Context, req *api.CreateSandboxRequest) (err error) {
	req.MemoryMergeGroup = ""
	if m := s.cfg.IAM; m != nil {
		req.MemoryMergeGroup, err = m.MergeGroup(ctx, req.Project)
	}
	return err
}

// settleWorker turns a create's Worker and WorkerOf into their labels,
// after checking the worker is one the caller reaches and is a worker.
// The labels themselves are the platform's to set.
func (s *Server) settleWorker(ctx context.Context, req *api.CreateSandboxRequest) error {
	for _, k := range []string{api.LabelWorker, api.LabelWorkerOf} {
		if _, ok := req.Labels[k]; ok {
			return errdefs.Invalid("label %s is the platform's: use worker or worker_of", k)
		}
	}
	if !req.Worker && req.WorkerOf == "" {
		return nil
	}
	if req.Worker && req.WorkerOf != "" {
		return errdefs.Invalid("a sandbox is a worker or driven by one, not both")
	}
	labels := maps.Clone(req.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	if req.Worker {
		labels[api.LabelWorker] = "true"
	} else {
		n, err := s.routeNode(req.WorkerOf)
		if err == nil {
			err = s.checkSandboxScope(ctx, req.WorkerOf, n)
		}
		var w api.Sandbox
		if err == nil {
			w, err = n.Get(ctx, req.WorkerOf)
		}
		if err != nil {
			return errdefs.New(errdefs.ErrInvalid, api.CodeInvalid, "worker_of %s: %v", req.WorkerOf, err)
		}
		if w.Labels[api.LabelWorker] != "true" {
			return errdefs.Invalid("worker_of %s: that sandbox is no worker (create it with worker: true)", req.WorkerOf)
		}
		labels[api.LabelWorkerOf] = req.WorkerOf
	}
	req.Labels, req.Worker, req.WorkerOf = labels, false, ""
	return nil
}

// pauseSandbox serves POST /v1/sandboxes/{id}/pause and /resume: the
// sandbox's node pauses (resumes) it; a worker's group follows, across
// nodes (the sandboxes labelled LabelWorkerOf it).
func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	resume := strings.HasSuffix(r.URL.Path, "/resume")
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	verb := "pause?by=caller"
	if resume {
		verb = "resume?by=caller"
	}
	ctx := r.Context()
	var sb api.Sandbox
	if err := callNode(ctx, n, id, verb, struct{}{}, &sb); err != nil {
		return err
	}
	if sb.Labels[api.LabelWorker] == "true" {
		by := "worker"
		res, err := s.pauseAll(ctx, sb.Project, map[string]string{api.LabelWorkerOf: id}, resume, by, nil)
		if err != nil {
			return err
		}
		for _, it := range res.Sandboxes {
			if it.Error != nil {
				s.log.Warn("a worker's group: pause or resume failed", "worker", id, "sandbox", it.ID, "err", it.Error.Message)
			}
		}
	}
	return writeJSON(w, http.StatusOK, sb)
}
