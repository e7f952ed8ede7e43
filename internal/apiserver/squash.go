package apiserver

import (
	"context"
	"net/http"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// EnvSquasher squashes the diff layers on top of an environment into one
// (*image.Squasher does).
type EnvSquasher interface {
	SquashEnv(ctx context.Context, ref string, minDepth int) (api.Environment, bool, error)
}

// squashTimeout bounds a squash in the background.
const squashTimeout = 30 * time.Minute

// squashEnv serves POST /v1/environments/{ref}/squash: the diff layers on
// top of ref, two or more, squashed into one now.
func (s *Server) squashEnv(w http.ResponseWriter, r *http.Request, ref string) error {
	if s.cfg.Squash == nil {
		return errdefs.Unavailable("this server cannot squash layers (no layer mounts)")
	}
	if _, err := s.cfg.Layers.GetEnv(r.Context(), ref); err != nil {
		return err
	}
	env, done, err := s.cfg.Squash.SquashEnv(r.Context(), ref, 2)
	if err != nil {
		return err
	}
	env, _ = forCaller(r.Context(), env) // publish.go
	return writeJSON(w, http.StatusOK, api.SquashResult{Environment: env, Squashed: done})
}

// squashAfter squashes a new snapshot's environment when its diff chain
// is past api.MaxDiffDepth: in the background, or at twice that depth
// before the snapshot is answered (forks of forks create their branches
// from the snapshot at once, so only that bounds their chains).
func (s *Server) squashAfter(ctx context.Context, snap api.Snapshot) {
	if s.cfg.Squash == nil {
		return
	}
	env, err := s.cfg.Layers.GetEnv(ctx, snap.Ref)
	if err != nil {
		return
	}
	depth := api.DiffDepth(env.Layers)
	if depth <= api.MaxDiffDepth {
		return
	}
	run := func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, squashTimeout)
		defer cancel()
		if _, _, err := s.cfg.Squash.SquashEnv(ctx, snap.Ref, api.MaxDiffDepth+1); err != nil {
			s.log.Warn("squash after a snapshot failed; the environment keeps its diff chain", "env", snap.Ref, "diffs", depth, "err", err)
		}
		if c, ok := s.cluster.(imageCacher); ok {
			c.ImagesChanged()
		}
	}
	if depth >= 2*api.MaxDiffDepth {
		run(ctx)
		return
	}
	go run(context.WithoutCancel(ctx))
}
