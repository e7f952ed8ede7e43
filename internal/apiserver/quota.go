package apiserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/netpolicy"
	"github.com/warrenhq/warren/internal/node"
)

// createFunc creates one sandbox: on the in-process node, or wherever
// placement puts it.
type createFunc func(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)

// idempotencyHeader carries a create's idempotency key; it wins over the
// body's idempotency_key.
const idempotencyHeader = "Idempotency-Key"

// admitCreate wraps create with what the edge owes every create: the
// project (default: the caller's; within the caller's scope), the
// idempotency key (a replay answers the first create's sandbox, with
// Idempotent-Replayed: true), the project's rate limit and quota (429
// rate_limited or quota_exceeded with Retry-After). What create does
// (placement, retries on other nodes) is its own business.
func (s *Server) admitCreate(w http.ResponseWriter, r *http.Request, req api.CreateSandboxRequest, create createFunc) (api.Sandbox, error) {
	if err := api.CheckCreate(&req); err != nil {
		return api.Sandbox{}, errdefs.Request(err)
	}
	if req.Network != nil {
		if _, err := netpolicy.Parse(*req.Network); err != nil {
			return api.Sandbox{}, err
		}
	}
	if len(r.Header.Get(idempotencyHeader)) > api.MaxIdempotencyKey {
		return api.Sandbox{}, errdefs.Request(&api.LimitError{Field: idempotencyHeader, Got: int64(len(r.Header.Get(idempotencyHeader))), Max: api.MaxIdempotencyKey, Unit: "bytes"})
	}
	ctx := r.Context()
	p := principal(ctx)
	project, err := projectFor(p, req.Project, iam.ActionSandboxCreate)
	if err != nil {
		return api.Sandbox{}, err
	}
	req.Project = project
	if req.Build, err = settleBuild(ctx, req.Build); err != nil { // auth.go
		return api.Sandbox{}, err
	}
	if err := s.settleWorker(ctx, &req); err != nil { // pause.go
		return api.Sandbox{}, err
	}
	if err := s.settleMergeGroup(ctx, &req); err != nil { // pause.go
		return api.Sandbox{}, err
	}
	if err := s.checkPublished(ctx, req.Image); err != nil { // publish.go
		return api.Sandbox{}, err
	}
	key := req.IdempotencyKey
	if h := r.Header.Get(idempotencyHeader); h != "" {
		key = h
	}
	req.IdempotencyKey = "" // the node has no use for it
	if key == "" {
		return s.createInQuota(ctx, req, create)
	}

	rec, claimed, err := s.idem.Claim(ctx, project, key, fingerprint(req))
	if err != nil {
		return api.Sandbox{}, err
	}
	if !claimed {
		var sb api.Sandbox
		if err := json.Unmarshal(rec.Result, &sb); err != nil {
			return api.Sandbox{}, fmt.Errorf("idempotency key %q: stored answer: %w", key, err)
		}
		sb, err := s.replay(ctx, key, sb.ID)
		if err != nil {
			return api.Sandbox{}, err
		}
		w.Header().Set("Idempotent-Replayed", "true")
		return sb, nil
	}
	// From here the key is ours: whatever happens to the caller, finish it.
	bg := context.WithoutCancel(ctx)
	sb, err := s.createInQuota(ctx, req, create)
	if err != nil {
		if aerr := s.idem.Abandon(bg, rec); aerr != nil {
			s.log.Warn("idempotency: abandon after failed create", "key", key, "err", aerr)
		}
		return api.Sandbox{}, err
	}
	result, err := json.Marshal(sb)
	if err != nil {
		return api.Sandbox{}, err
	}
	for attempt := 0; ; attempt++ {
		_, err = s.idem.Complete(bg, rec, result)
		if err == nil || errdefs.Code(err) == iam.CodeIdempotencyLost || attempt == 2 {
			break
		}
		time.Sleep(time.Duration(50<<attempt) * time.Millisecond)
	}
	switch {
	case err == nil:
	case errdefs.Code(err) == iam.CodeIdempotencyLost:
		// Another request took the key over and creates its own: ours
		// must go, so that the key stands for one sandbox.
		s.undoCreate(bg, sb.ID)
		return api.Sandbox{}, err
	default:
		// The sandbox exists and the caller gets it; a replay after the
		// claim times out may create a second one.
		s.log.Error("idempotency: could not record the create", "key", key, "sandbox", sb.ID, "err", err)
	}
	return sb, nil
}

// replay answers a key's sandbox as it is now, not as it was created: its
// node's view (stopping, failed, lost...), or sandbox_gone when its node
// no longer has it, so that a replay never claims a deleted sandbox
// running. An unreachable node's error is the answer: the caller retries.
func (s *Server) replay(ctx context.Context, key, id string) (api.Sandbox, error) {
	n, err := s.routeNode(id)
	var sb api.Sandbox
	if err == nil {
		sb, err = n.Get(ctx, id)
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		return api.Sandbox{}, errdefs.New(errdefs.ErrConflict, api.CodeSandboxGone,
			"the sandbox idempotency key %q created, %s, is gone (%v): create with a new key for another", key, id, err)
	}
	return sb, err
}

// undoCreate deletes a sandbox this server just created and must not keep.
func (s *Server) undoCreate(ctx context.Context, id string) {
	n, err := s.routeNode(id)
	if err == nil {
		err = n.Delete(ctx, id)
	}
	if err != nil {
		s.log.Error("could not delete a duplicate sandbox", "sandbox", id, "err", err)
	}
}

// fingerprint identifies a create request's body, so that a key reused
// for a different request is refused (idempotency_key_reused) instead of
// answering a sandbox that is not what was asked for.
func fingerprint(req api.CreateSandboxRequest) string {
	b, _ := json.Marshal(req) // map keys come out sorted
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:16])
}

// createInQuota runs create within req.Project's rate limit and quota:
// a reservation holds the sandbox's resources from before the create
// until the usage source counts it (Commit: at once with Usage and a
// negative CommitHold, else after CommitHold) or the create failed
// (Release). Without IAM it only creates.
func (s *Server) createInQuota(ctx context.Context, req api.CreateSandboxRequest, create createFunc) (api.Sandbox, error) {
	m := s.cfg.IAM
	if m == nil {
		sb, err := create(ctx, req)
		if err == nil {
			s.projects.put(sb.ID, scopeOf(sb))
		}
		return sb, err
	}
	if err := m.AllowCreates(ctx, req.Project, 1); err != nil {
		return api.Sandbox{}, err
	}
	res, err := m.Reserve(ctx, req.Project, s.quotaOf(req.Resources))
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := create(ctx, req)
	if err != nil {
		res.Release()
		return api.Sandbox{}, err
	}
	if s.cfg.Usage != nil {
		s.cfg.Usage.Created(sb) // counted from now on: before Commit
	}
	res.Commit()
	s.projects.put(sb.ID, scopeOf(sb))
	return sb, nil
}

// deleted frees a deleted sandbox's share of its project's quota at once
// (a resync would, a moment later).
func (s *Server) deleted(id string) {
	if s.cfg.Usage == nil {
		return
	}
	if nid, err := node.NodeOf(id); err == nil {
		s.cfg.Usage.Deleted(nid, id)
	}
}

// quotaOf is what one sandbox asking for r counts against a quota, with
// the defaults the node will apply filled in.
func (s *Server) quotaOf(r api.Resources) iam.Resources {
	d := s.cfg.DefaultResources
	if r.CPU <= 0 {
		r.CPU = d.CPU
		if r.CPU <= 0 {
			r.CPU = 1
		}
	}
	if r.Memory <= 0 {
		r.Memory = d.Memory
		if r.Memory <= 0 {
			r.Memory = 512 << 20
		}
	}
	if r.Disk <= 0 {
		r.Disk = d.Disk // the node may still apply a default of its own: the resync counts it
	}
	return iam.Resources{Sandboxes: 1, MilliCPU: iam.MilliCPU(r.CPU), Memory: int64(r.Memory), Disk: int64(r.Disk)}
}
