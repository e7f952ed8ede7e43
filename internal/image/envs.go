package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

// envRecord is an environment as stored under /envs/<name>@<version>.
type envRecord struct {
	V   int             `json:"v"`
	Env api.Environment `json:"env"`
}

func envKey(ref Ref) string { return envsPrefix + ref.String() }

var (
	envVarPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	userPattern   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$`)
)

func envNotFound(ref string) error {
	return errdefs.New(errdefs.ErrNotFound, api.CodeEnvNotFound, "environment %s not found", ref)
}

// CreateEnv creates an environment version from req (see
// api.CreateEnvironmentRequest, including how From derives a new version
// from an existing one). Layer refs are resolved to digests now, so an
// environment never changes once created. It writes one small record and
// no blob: O(1) whatever the layers' sizes. Errors: ErrInvalid for a bad
// request or a layer of the wrong kind, ErrNotFound (codes
// "layer_not_found", "env_not_found") for what it names, ErrConflict (code
// "env_exists") if name@version exists.
func (r *Registry) CreateEnv(ctx context.Context, req api.CreateEnvironmentRequest) (api.Environment, error) {
	env, err := r.planEnv(ctx, req)
	if err != nil {
		return api.Environment{}, err
	}
	// Pin the layers, then check they still exist: a layer deleted and
	// collected between planning and the record would leave the
	// environment pointing at nothing.
	var digests []string
	for _, l := range env.Layers {
		digests = append(digests, l.Digest)
	}
	unpin, err := r.pin(ctx, digests, nil)
	if err != nil {
		return api.Environment{}, err
	}
	defer unpin()
	for _, l := range env.Layers {
		got, err := r.GetLayer(ctx, l.Ref)
		if err == nil && got.Digest != l.Digest {
			err = errdefs.New(errdefs.ErrConflict, "layer_changed", "layer %s was replaced while creating environment %s", l.Ref, env.Ref)
		}
		if err != nil {
			return api.Environment{}, err
		}
	}
	env.CreatedAt = time.Now().UTC()
	val, err := json.Marshal(envRecord{V: recordVersion, Env: env})
	if err != nil {
		return api.Environment{}, err
	}
	err = r.st.Create(ctx, envKey(Ref{env.Name, env.Version}), val)
	if errors.Is(err, errdefs.ErrConflict) {
		return api.Environment{}, errdefs.New(errdefs.ErrConflict, api.CodeEnvExists, "environment %s already exists", env.Ref)
	}
	if err != nil {
		return api.Environment{}, fmt.Errorf("create environment %s: %w", env.Ref, err)
	}
	r.log.Info("environment created", "env", env.Ref, "layers", len(env.Layers))
	return env, nil
}

// planEnv validates req and resolves it to an environment.
func (r *Registry) planEnv(ctx context.Context, req api.CreateEnvironmentRequest) (api.Environment, error) {
	var env api.Environment
	var toolkits, diffs []api.EnvLayer
	var base, workspace *api.EnvLayer
	if req.From != "" {
		from, err := r.GetEnv(ctx, req.From)
		if err != nil {
			return env, fmt.Errorf("from: %w", err)
		}
		for _, l := range from.Layers {
			switch l.Kind {
			case api.LayerBase:
				base = &l
			case api.LayerWorkspace:
				workspace = &l
			case api.LayerDiff:
				// A snapshot's: stays on top of what it was taken on.
				diffs = append(diffs, l)
			default:
				toolkits = append(toolkits, l)
			}
		}
		env.Env = maps.Clone(from.Env)
		env.Workdir, env.User, env.Entrypoint = from.Workdir, from.User, from.Entrypoint
		if req.Name == "" {
			req.Name = from.Name
		}
	}
	if err := ValidateName(req.Name); err != nil {
		return env, err
	}
	if req.Version == "" {
		if req.From == "" {
			return env, errdefs.Invalid("environment %s: a version is required", req.Name)
		}
		versions, err := r.envVersions(ctx, req.Name)
		if err != nil {
			return env, err
		}
		var vs []string
		for _, e := range versions {
			vs = append(vs, e.Version)
		}
		req.Version = nextVersion(vs)
	}
	if err := ValidateVersion(req.Version); err != nil {
		return env, err
	}
	env.Name, env.Version, env.Ref = req.Name, req.Version, req.Name+"@"+req.Version

	resolve := func(s, kind string) (api.EnvLayer, error) {
		l, err := r.GetLayer(ctx, s)
		if err != nil {
			return api.EnvLayer{}, err
		}
		if l.Kind != kind {
			return api.EnvLayer{}, errdefs.Invalid("environment %s: layer %s is a %s layer, not a %s layer", env.Ref, l.Ref, l.Kind, kind)
		}
		return api.EnvLayer{Ref: l.Ref, Kind: l.Kind, Digest: l.Digest, Size: l.Size}, nil
	}
	if req.Base != "" {
		l, err := resolve(req.Base, api.LayerBase)
		if d, derr := resolve(req.Base, api.LayerDisk); err != nil && derr == nil {
			// A disk image boots alone: nothing stacks on it.
			if req.Workspace != "" || len(req.Toolkits) > 0 || req.From != "" {
				return env, errdefs.Invalid("environment %s: disk image %s takes no workspace, toolkits or from", env.Ref, d.Ref)
			}
			l, err = d, nil
		}
		if err != nil {
			return env, err
		}
		base = &l
	}
	if req.Workspace != "" {
		l, err := resolve(req.Workspace, api.LayerWorkspace)
		if err != nil {
			return env, err
		}
		workspace = &l
	}
	for _, s := range req.Toolkits {
		l, err := resolve(s, api.LayerToolkit)
		if err != nil {
			return env, err
		}
		name := refName(l.Ref)
		replaced := false
		for i, t := range toolkits {
			if refName(t.Ref) == name && req.From != "" {
				toolkits[i], replaced = l, true
			} else if refName(t.Ref) == name {
				return env, errdefs.Invalid("environment %s: toolkit %s is given twice", env.Ref, name)
			}
		}
		if !replaced {
			toolkits = append(toolkits, l)
		}
	}
	if base == nil {
		return env, errdefs.Invalid("environment %s: a base layer is required", env.Ref)
	}
	env.Layers = append(env.Layers, *base)
	if workspace != nil {
		env.Layers = append(env.Layers, *workspace)
	}
	env.Layers = append(env.Layers, toolkits...)
	env.Layers = append(env.Layers, diffs...)
	if len(env.Layers) > maxLayers {
		return env, errdefs.Invalid("environment %s: %d layers, at most %d", env.Ref, len(env.Layers), maxLayers)
	}
	for _, l := range env.Layers {
		env.Size += l.Size
	}

	for k, v := range req.Env {
		if !envVarPattern.MatchString(k) || strings.ContainsRune(v, 0) {
			return env, errdefs.Invalid("environment %s: env %q: not a valid variable", env.Ref, k)
		}
		if env.Env == nil {
			env.Env = map[string]string{}
		}
		env.Env[k] = v
	}
	if req.Workdir != "" {
		if !path.IsAbs(req.Workdir) || strings.ContainsRune(req.Workdir, 0) {
			return env, errdefs.Invalid("environment %s: workdir %q must be an absolute path", env.Ref, req.Workdir)
		}
		env.Workdir = path.Clean(req.Workdir)
	}
	if req.User != "" {
		if !userPattern.MatchString(req.User) {
			return env, errdefs.Invalid("environment %s: user %q: want a name, uid or uid:gid", env.Ref, req.User)
		}
		env.User = req.User
	}
	if req.Entrypoint != nil {
		if len(req.Entrypoint) > 256 {
			return env, errdefs.Invalid("environment %s: entrypoint has more than 256 arguments", env.Ref)
		}
		env.Entrypoint = append([]string(nil), req.Entrypoint...)
	}
	return env, nil
}

// refName returns the name part of "name@version".
func refName(ref string) string {
	name, _, _ := strings.Cut(ref, "@")
	return name
}

// GetEnv returns an environment by ref ("name@version", or "name" for its
// latest version). ErrNotFound (code "env_not_found"), ErrInvalid for a
// malformed ref.
func (r *Registry) GetEnv(ctx context.Context, s string) (api.Environment, error) {
	ref, err := ParseRef(s, true)
	if err != nil {
		return api.Environment{}, err
	}
	return r.getEnv(ctx, ref)
}

func (r *Registry) getEnv(ctx context.Context, ref Ref) (api.Environment, error) {
	if ref.Version == "" {
		all, err := r.envVersions(ctx, ref.Name)
		if err != nil {
			return api.Environment{}, err
		}
		if len(all) == 0 {
			return api.Environment{}, envNotFound(ref.Name)
		}
		return all[len(all)-1], nil
	}
	kv, err := r.st.Get(ctx, envKey(ref))
	if errors.Is(err, errdefs.ErrNotFound) {
		return api.Environment{}, envNotFound(ref.String())
	}
	if err != nil {
		return api.Environment{}, fmt.Errorf("get environment %s: %w", ref, err)
	}
	return decodeEnv(kv)
}

// envVersions returns every version of the environment called name,
// oldest version first.
func (r *Registry) envVersions(ctx context.Context, name string) ([]api.Environment, error) {
	kvs, err := r.st.List(ctx, envsPrefix+name+"@")
	if err != nil {
		return nil, fmt.Errorf("list environments: %w", err)
	}
	out := make([]api.Environment, 0, len(kvs))
	for _, kv := range kvs {
		e, err := decodeEnv(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	sortEnvs(out)
	return out, nil
}

func sortEnvs(s []api.Environment) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].Name != s[j].Name {
			return s[i].Name < s[j].Name
		}
		return CompareVersions(s[i].Version, s[j].Version) < 0
	})
}

// ListEnvs returns every environment, sorted by name and then version.
func (r *Registry) ListEnvs(ctx context.Context) ([]api.Environment, error) {
	kvs, err := r.st.List(ctx, envsPrefix)
	if err != nil {
		return nil, fmt.Errorf("list environments: %w", err)
	}
	out := make([]api.Environment, 0, len(kvs))
	for _, kv := range kvs {
		e, err := decodeEnv(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	sortEnvs(out)
	return out, nil
}

func decodeEnv(kv store.KV) (api.Environment, error) {
	var rec envRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return api.Environment{}, fmt.Errorf("environment record %s: %w", kv.Key, err)
	}
	if rec.V != recordVersion {
		return api.Environment{}, fmt.Errorf("environment record %s: unknown format version %d", kv.Key, rec.V)
	}
	return rec.Env, nil
}

// DeleteEnv removes the environment name@version (an exact version).
// Sandboxes started from it keep running: they hold their layers.
// ErrNotFound (code "env_not_found").
func (r *Registry) DeleteEnv(ctx context.Context, s string) error {
	ref, err := ParseRef(s, false)
	if err != nil {
		return err
	}
	if _, err := r.getEnv(ctx, ref); err != nil {
		return err
	}
	if err := r.st.Delete(ctx, envKey(ref)); err != nil {
		return fmt.Errorf("delete environment %s: %w", ref, err)
	}
	r.log.Info("environment deleted", "env", ref.String())
	return nil
}
