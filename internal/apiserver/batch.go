package apiserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
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
	if req.Count < 1 || req.Count > api.MaxBatchCount {
		return errdefs.Invalid("count %d: want 1..%d", req.Count, api.MaxBatchCount)
	}
	tmpl := req.Template
	if tmpl.IdempotencyKey != "" || r.Header.Get(idempotencyHeader) != "" {
		return errdefs.Invalid("a batch create takes no idempotency key")
	}
	ctx := r.Context()
	p := principal(ctx)
	project := p.Project
	if tmpl.Project != "" {
		var err error
		if project, err = iam.CleanPath(tmpl.Project); err != nil {
			return err
		}
	}
	if err := iam.Authorize(p, iam.ActionSandboxCreate, project); err != nil {
		return err
	}
	tmpl.Project = project
	gang, err := newGangID()
	if err != nil {
		return err
	}

	// Admission for the whole gang, before any create.
	n := req.Count
	res := make([]*iam.Reservation, n)
	if m := s.cfg.IAM; m != nil {
		if err := m.AllowCreates(ctx, project, n); err != nil {
			return err
		}
		one := s.quotaOf(tmpl.Resources)
		for i := range res {
			if res[i], err = m.Reserve(ctx, project, one); err != nil {
				for _, rv := range res[:i] {
					rv.Release()
				}
				return err
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
			s.projects.put(sb.ID, sb.Project)
			s.metrics.created.Inc()
		}()
	}
	wg.Wait()

	out := api.BatchCreateResponse{Gang: gang, Sandboxes: []api.Sandbox{}}
	var first error
	for i, err := range errs {
		if err == nil {
			out.Sandboxes = append(out.Sandboxes, sbs[i])
			continue
		}
		if first == nil || first == errGangAborted {
			first = err
		}
		_, e := apiError(err)
		out.Errors = append(out.Errors, api.BatchItemError{Index: i, Error: e})
	}
	switch {
	case first == nil:
		return writeJSON(w, http.StatusCreated, out)
	case req.AllOrNone || len(out.Sandboxes) == 0:
		// None or nothing: undo what was created, answer the failure.
		bg := context.WithoutCancel(ctx)
		var undo sync.WaitGroup
		for _, sb := range out.Sandboxes {
			undo.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; undo.Done() }()
				s.undoCreate(bg, sb.ID)
				s.deleted(sb.ID)
			}()
		}
		undo.Wait()
		return first
	default:
		return writeJSON(w, http.StatusOK, out)
	}
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
