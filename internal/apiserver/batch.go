package apiserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
)

// batchParallel bounds how many members of one gang are created at once.
const batchParallel = 8

// createBatch serves POST /v1/sandboxes:batch: a gang of identical
// sandboxes (api.BatchCreateRequest says what it answers). The project's
// rate limit counts the gang once (AllowCreates with its size), and quota
// is reserved for every member before any is created, so a gang that does
// not fit is refused up front with nothing created.
func (s *Server) createBatch(w http.ResponseWriter, r *http.Request) error {
	var req api.BatchCreateRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := api.CheckBatch(&req); err != nil {
		return errdefs.Request(err)
	}
	if req.Template.IdempotencyKey != "" || r.Header.Get(idempotencyHeader) != "" {
		return errdefs.Invalid("a batch create takes no idempotency key")
	}
	out, status, err := s.createGang(r.Context(), req)
	if err != nil {
		return err
	}
	return writeJSON(w, status, out)
}

// createGang creates req's gang (see createBatch) and answers it with its
// status: 201 when every member was made, 200 when only some were (and
// not all or none), or the failure that undid it.
func (s *Server) createGang(ctx context.Context, req api.BatchCreateRequest) (api.BatchCreateResponse, int, error) {
	tmpl := req.Template
	p := principal(ctx)
	project, err := projectFor(p, tmpl.Project, iam.ActionSandboxCreate)
	if err != nil {
		return api.BatchCreateResponse{}, 0, err
	}
	tmpl.Project = project
	if tmpl.Build, err = settleBuild(ctx, tmpl.Build); err != nil { // auth.go
		return api.BatchCreateResponse{}, 0, err
	}
	if err := s.settleWorker(ctx, &tmpl); err != nil { // pause.go
		return api.BatchCreateResponse{}, 0, err
	}
	if err := s.settleMergeGroup(ctx, &tmpl); err != nil { // pause.go
		return api.BatchCreateResponse{}, 0, err
	}
	if err := s.checkPublished(ctx, tmpl.Image); err != nil { // publish.go
		return api.BatchCreateResponse{}, 0, err
	}
	gang, err := newGangID()
	if err != nil {
		return api.BatchCreateResponse{}, 0, err
	}

	// Admission for the whole gang, before any create.
	n := req.Count
	res := make([]*iam.Reservation, n)
	if m := s.cfg.IAM; m != nil {
		if err := m.AllowCreates(ctx, project, n); err != nil {
			return api.BatchCreateResponse{}, 0, err
		}
		one := s.quotaOf(tmpl.Resources)
		for i := range res {
			if res[i], err = m.Reserve(ctx, project, one); err != nil {
				for _, rv := range res[:i] {
					rv.Release()
				}
				return api.BatchCreateResponse{}, 0, err
			}
		}
	}

	sbs := make([]api.Sandbox, n)
	errs := make([]error, n)
	var failed atomic.Bool
	sem := make(chan struct{}, batchParallel)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		if req.AllOrNone && failed.Load() {
			<-sem
			errs[i] = errGangAborted
			if res[i] != nil {
				res[i].Release()
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			m := tmpl
			m.Labels = maps.Clone(tmpl.Labels)
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			m.Labels[api.LabelGang] = gang
			m.Labels[api.LabelGangIndex] = strconv.Itoa(i)
			sb, err := s.cluster.Create(ctx, m)
			if err != nil {
				errs[i] = err
				failed.Store(true)
				if res[i] != nil {
					res[i].Release()
				}
				return
			}
			sbs[i] = sb
			if s.cfg.Usage != nil {
				s.cfg.Usage.Created(sb)
			}
			if res[i] != nil {
				res[i].Commit()
			}
			s.projects.put(sb.ID, scopeOf(sb))
			s.metrics.created.Inc()
		}()
	}
	wg.Wait()

	out := api.BatchCreateResponse{Gang: gang, Sandboxes: []api.Sandbox{}}
	var first error
	unsure := false // a failed member may exist all the same
	for i, err := range errs {
		if err == nil {
			out.Sandboxes = append(out.Sandboxes, sbs[i])
			continue
		}
		if first == nil || first == errGangAborted {
			first = err
		}
		unsure = unsure || mayHaveCreated(err)
		_, e := apiError(err)
		out.Errors = append(out.Errors, api.BatchItemError{Index: i, Error: e})
	}
	bg := context.WithoutCancel(ctx)
	switch {
	case first == nil && ctx.Err() == nil:
		return out, http.StatusCreated, nil
	case req.AllOrNone || len(out.Sandboxes) == 0 || ctx.Err() != nil:
		// None or nothing, or nobody left to tell what was made: undo
		// what was created, answer the failure.
		s.undoGang(bg, gang, out.Sandboxes, nil, unsure)
		if first == nil {
			first = ctx.Err()
		}
		return api.BatchCreateResponse{}, 0, first
	default:
		if unsure {
			s.undoGang(bg, gang, nil, out.Sandboxes, true)
		}
		return out, http.StatusOK, nil
	}
}

// undoGang deletes the members of gang in undo, on whichever nodes they
// are. With sweep it then also deletes every other sandbox labelled with
// the gang but not in keep: a member whose create failed without a clear
// answer (its node's reply was lost) may exist all the same, and must not
// outlive a gang that says it failed. A node that cannot be reached keeps
// what it has; that is logged.
func (s *Server) undoGang(ctx context.Context, gang string, undo, keep []api.Sandbox, sweep bool) {
	ids := make([]string, 0, len(undo))
	for _, sb := range undo {
		ids = append(ids, sb.ID)
	}
	if sweep {
		kept := make(map[string]bool, len(keep)+len(undo))
		for _, sb := range append(slices.Clone(keep), undo...) {
			kept[sb.ID] = true
		}
		list, err := s.cluster.List(ctx, node.Filter{Labels: map[string]string{api.LabelGang: gang}})
		if err != nil {
			s.log.Error("gang: could not look for members whose create went unanswered", "gang", gang, "err", err)
		}
		for _, sb := range list {
			if !kept[sb.ID] && sb.State != api.StateLost {
				ids = append(ids, sb.ID)
			}
		}
	}
	sem := make(chan struct{}, batchParallel)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.undoCreate(ctx, id)
			s.deleted(id)
		}()
	}
	wg.Wait()
}

// mayHaveCreated reports whether a member whose create failed with err
// may have been made all the same: its node took the request but its
// answer never came (a cut connection, a node that went quiet, a caller
// that gave up). A refusal, a bad request, a create no node could take and
// one that never reached its node made nothing.
func mayHaveCreated(err error) bool {
	switch {
	case err == errGangAborted, nodeapi.NotSent(err),
		errdefs.Code(err) == api.CodeNoMatchingNode, errdefs.Code(err) == api.CodeNoCapacity:
		return false
	case errors.Is(err, errdefs.ErrExhausted), errors.Is(err, errdefs.ErrInvalid), errors.Is(err, errdefs.ErrNotFound),
		errors.Is(err, errdefs.ErrForbidden), errors.Is(err, errdefs.ErrUnauthenticated), errors.Is(err, errdefs.ErrConflict):
		return false
	}
	return true
}

// errGangAborted is the error of a member never tried because another
// member of its all-or-none gang had failed.
var errGangAborted = errdefs.New(errdefs.ErrConflict, api.CodeGangAborted, "not created: another member of the all-or-none gang failed")

func newGangID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "g-" + hex.EncodeToString(b[:]), nil
}
