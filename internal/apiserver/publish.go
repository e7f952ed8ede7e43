package apiserver

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
)

// Publishing. A builder's snapshot is an unpublished environment: only
// builders see it, create sandboxes from it and read its check; runners
// see neither it nor its snapshot until it is published (POST
// /v1/environments/{ref}/publish), and never a check's output. Forks'
// snapshots are published from the start: the runner who forked uses
// them.

// Publisher is what publishing needs of the layer store; *image.Registry
// does.
type Publisher interface {
	PublishEnv(ctx context.Context, ref string, check *api.EnvCheck) (api.Environment, error)
}

// defaultCheckTimeout bounds a publish check that names no timeout.
const defaultCheckTimeout = 10 * time.Minute

// builder says whether the caller may see unpublished environments.
func builder(ctx context.Context) bool {
	p := principal(ctx)
	return iam.Authorize(p, iam.ActionEnvironmentWrite, p.Project) == nil
}

// forCaller returns env as the caller may see it: hidden (false) when it
// is unpublished and the caller no builder, without its check's output
// for anyone but builders.
func forCaller(ctx context.Context, env api.Environment) (api.Environment, bool) {
	if builder(ctx) {
		return env, true
	}
	env.Check = nil
	return env, !env.Unpublished
}

// checkPublished refuses a create from an unpublished environment to a
// caller who is no builder, as if it did not exist.
func (s *Server) checkPublished(ctx context.Context, img string) error {
	if img == "" || builder(ctx) {
		return nil
	}
	get := s.cfg.Images.Get
	if c, ok := s.cluster.(interface {
		Image(ctx context.Context, name string) (api.Image, error)
	}); ok {
		get = c.Image // the Router's cache, which its create reads next
	}
	if i, err := get(ctx, img); err == nil && i.Unpublished {
		return errdefs.New(errdefs.ErrNotFound, api.CodeImageNotFound, "image %q not found", img)
	}
	return nil
}

// publishEnv serves POST /v1/environments/{ref}/publish: the check, if
// any, runs in a fresh sandbox from the environment (counted in the
// caller's quota, deleted after); the environment is published if it
// passed (409 check_failed otherwise), and its outcome kept either way.
func (s *Server) publishEnv(w http.ResponseWriter, r *http.Request, ref string) error {
	pub, ok := s.cfg.Layers.(Publisher)
	if !ok {
		return errdefs.Unavailable("this server keeps no environments")
	}
	var req api.PublishRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := api.CheckPublish(&req); err != nil {
		return errdefs.Request(err)
	}
	ctx := r.Context()
	env, err := s.cfg.Layers.GetEnv(ctx, ref)
	if err != nil {
		return err
	}
	var check *api.EnvCheck
	if req.Check != "" {
		if check, err = s.runCheck(ctx, env.Ref, req); err != nil {
			return err
		}
	}
	env, err = pub.PublishEnv(ctx, env.Ref, check)
	if err != nil {
		return err
	}
	if check != nil && !check.Passed {
		why := "exited " + strconv.Itoa(check.ExitCode)
		if check.TimedOut {
			why = "timed out"
		}
		return errdefs.New(errdefs.ErrConflict, api.CodeCheckFailed,
			"environment %s stays unpublished: its check %s (warren env get %s shows its output)", env.Ref, why, env.Ref)
	}
	return writeJSON(w, http.StatusOK, env)
}

// runCheck runs req's check in a fresh sandbox made from env.
func (s *Server) runCheck(ctx context.Context, env string, req api.PublishRequest) (*api.EnvCheck, error) {
	timeout := time.Duration(req.Timeout)
	if timeout <= 0 {
		timeout = defaultCheckTimeout
	}
	project, err := projectFor(principal(ctx), "", iam.ActionSandboxCreate)
	if err != nil {
		return nil, err
	}
	build := true // runners see the candidate only once it passes
	sb, err := s.createInQuota(ctx, api.CreateSandboxRequest{Image: env, Project: project, Build: &build,
		Labels: map[string]string{"warren.dev/check-of": env}, TTL: api.Duration(timeout + time.Minute)}, s.cluster.Create)
	if err != nil {
		return nil, err
	}
	defer func() {
		s.undoCreate(context.WithoutCancel(ctx), sb.ID)
		s.deleted(sb.ID)
	}()
	n, err := s.cluster.Route(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	var res api.ExecResult
	if err := callNode(ctx, n, sb.ID, "exec", api.ExecRequest{Cmd: req.Check, Timeout: api.Duration(timeout),
		MaxOutput: api.Quantity(api.MaxCheckOutput)}, &res); err != nil {
		return nil, err
	}
	return &api.EnvCheck{Command: req.Check, Passed: res.ExitCode == 0 && !res.TimedOut, ExitCode: res.ExitCode,
		TimedOut: res.TimedOut, Stdout: res.Stdout, Stderr: res.Stderr, DurationMS: float64(time.Since(start).Microseconds()) / 1000,
		Sandbox: sb.ID, CheckedAt: time.Now().UTC()}, nil
}
