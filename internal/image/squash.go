package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/rootfs"
)

// Squashing. Every snapshot of a sandbox made from a snapshot stacks one
// more diff layer, so a trajectory forked step by step grows a chain of
// them: each costs a lookup level in every overlay made from it, a mount
// on every node, and a record. Past api.MaxDiffDepth the chain of diffs
// on top of an environment is squashed into one diff layer with the same
// effect (rootfs.MergeDiff), built and stored like a snapshot's, and the
// environment's record then names it instead of the chain. Sandboxes
// made from the environment before keep the chain (its layers stay while
// they use them); the diffs' own records stay too, for the snapshots
// that are them.

// LayerMounter mounts a layer read-only by its manifest digest, for as
// long as the caller holds it; oci.NodeLayers does.
type LayerMounter interface {
	MountLayer(ctx context.Context, digest string) (dir string, release func(), err error)
}

// Squasher squashes environments' diff chains (SquashEnv), one
// environment at a time each.
type Squasher struct {
	Registry *Registry
	Cache    *Cache       // builds and stores the squashed layer
	Layers   LayerMounter // mounts the chain's layers

	mu      sync.Mutex
	running map[string]bool
}

// SquashEnv squashes the diff layers on top of environment ref into one,
// if it has at least minDepth of them (and two at least), and says
// whether it did. The squashed layer is "<name>-squashed@<version>".
// ErrNotFound for an unknown environment;
// ErrConflict (code squash_running) while one runs for it already;
// ErrInvalid when a diff cannot be merged (rootfs.MergeDiff).
func (s *Squasher) SquashEnv(ctx context.Context, ref string, minDepth int) (api.Environment, bool, error) {
	env, err := s.Registry.GetEnv(ctx, ref)
	if err != nil {
		return api.Environment{}, false, err
	}
	depth := api.DiffDepth(env.Layers)
	if depth < max(minDepth, 2) {
		return env, false, nil
	}
	s.mu.Lock()
	if s.running == nil {
		s.running = map[string]bool{}
	}
	if s.running[env.Ref] {
		s.mu.Unlock()
		return env, false, errdefs.New(errdefs.ErrConflict, api.CodeSquashRunning, "environment %s is being squashed already", env.Ref)
	}
	s.running[env.Ref] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.running, env.Ref)
		s.mu.Unlock()
	}()

	start := time.Now()
	k := len(env.Layers) - depth
	if k == 0 {
		return env, false, errdefs.Invalid("environment %s: diff layers with no layer under them", env.Ref)
	}
	chain := env.Layers[k:]
	res, err := s.build(ctx, chain, env.Layers[k-1].Digest)
	if err != nil {
		return env, false, fmt.Errorf("squash %s: %w", env.Ref, err)
	}
	out, err := s.Registry.replaceDiffs(ctx, env, k, res)
	if err != nil {
		return env, false, fmt.Errorf("squash %s: %w", env.Ref, err)
	}
	s.Registry.log.Info("environment squashed", "env", env.Ref, "diffs", depth, "layer", out.Layers[len(out.Layers)-1].Ref,
		"files", res.Stats.Files, "uploaded", res.Stats.UploadedBytes, "took", time.Since(start).Round(time.Millisecond))
	return out, true, nil
}

// build merges the diffs chain (bottom first) into one tree and packs it
// as a diff on parent.
func (s *Squasher) build(ctx context.Context, chain []api.EnvLayer, parent string) (api.PackResult, error) {
	dirs := make([]string, len(chain))
	for i, l := range chain {
		dir, release, err := s.Layers.MountLayer(ctx, l.Digest)
		if err != nil {
			return api.PackResult{}, fmt.Errorf("layer %s: %w", l.Ref, err)
		}
		defer release()
		dirs[i] = dir
	}
	if err := os.MkdirAll(s.Cache.tmpDir(), 0o755); err != nil {
		return api.PackResult{}, err
	}
	tmp, err := os.MkdirTemp(s.Cache.tmpDir(), "squash-*")
	if err != nil {
		return api.PackResult{}, err
	}
	defer os.RemoveAll(tmp)
	merged := filepath.Join(tmp, "diff")
	if _, err := rootfs.CopyTree(dirs[0], merged); err != nil {
		return api.PackResult{}, fmt.Errorf("layer %s: %w", chain[0].Ref, err)
	}
	for i := 1; i < len(dirs); i++ {
		if err := ctx.Err(); err != nil {
			return api.PackResult{}, err
		}
		if err := rootfs.MergeDiff(merged, dirs[i]); err != nil {
			return api.PackResult{}, fmt.Errorf("layer %s: %w", chain[i].Ref, err)
		}
	}
	return s.Cache.Pack(ctx, merged, parent)
}

// replaceDiffs registers res, the squash of env.Layers[k:], as a layer
// and makes env's record name it instead, unless the record changed
// meanwhile (ErrConflict).
func (r *Registry) replaceDiffs(ctx context.Context, env api.Environment, k int, res api.PackResult) (api.Environment, error) {
	under := make([]string, k)
	for i, l := range env.Layers[:k] {
		under[i] = l.Digest
	}
	unpin, err := r.pin(ctx, append([]string{res.Digest}, under...), nil)
	if err != nil {
		return env, err
	}
	defer unpin()
	m, err := ReadManifest(ctx, r.bs, res.Digest)
	if err != nil {
		return env, err
	}
	if err := r.checkChunks(ctx, m); err != nil {
		return env, err
	}
	ref := Ref{env.Name + "-squashed", env.Version}
	if ValidateName(ref.Name) != nil {
		ref = Ref{"squash-" + randomID(), "1"}
	}
	now := time.Now().UTC()
	layer := api.Layer{Ref: ref.String(), Name: ref.Name, Version: ref.Version, Kind: api.LayerDiff, Digest: res.Digest,
		ImageDigest: m.Image, Size: m.Size, Chunks: len(m.Chunks), Parent: res.Parent, CreatedAt: now}
	val, err := json.Marshal(layerRecord{V: recordVersion, Layer: layer})
	if err != nil {
		return env, err
	}
	created := true
	if err := r.st.Create(ctx, layerKey(ref), val); errors.Is(err, errdefs.ErrConflict) {
		// An earlier squash of the same chain got this far: the same
		// layer, or someone else's.
		old, gerr := r.GetLayer(ctx, ref.String())
		if gerr != nil || old.Digest != res.Digest {
			return env, layerExists(ref.String())
		}
		created = false
	} else if err != nil {
		return env, err
	}
	undo := func() {
		if created {
			r.st.Delete(context.WithoutCancel(ctx), layerKey(ref))
		}
	}

	replaced := make([]string, 0, len(env.Layers)-k)
	for _, l := range env.Layers[k:] {
		replaced = append(replaced, l.Ref)
	}
	kv, err := r.st.Get(ctx, envKey(Ref{env.Name, env.Version}))
	if err != nil {
		undo()
		return env, err
	}
	var rec envRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		undo()
		return env, err
	}
	if !slices.EqualFunc(rec.Env.Layers, env.Layers, func(a, b api.EnvLayer) bool { return a.Digest == b.Digest }) {
		undo()
		return env, errdefs.New(errdefs.ErrConflict, api.CodeConflict, "environment %s changed while it was squashed", env.Ref)
	}
	out := rec.Env
	out.Layers = append(slices.Clone(out.Layers[:k]), api.EnvLayer{Ref: layer.Ref, Kind: layer.Kind, Digest: layer.Digest, Size: layer.Size})
	out.Size = 0
	for _, l := range out.Layers {
		out.Size += l.Size
	}
	out.Squashed = &api.EnvSquash{From: replaced, At: now}
	val, err = json.Marshal(envRecord{V: recordVersion, Env: out})
	if err != nil {
		undo()
		return env, err
	}
	if err := r.st.CompareAndPut(ctx, kv.Key, val, kv.Version); err != nil {
		undo()
		if errors.Is(err, errdefs.ErrConflict) {
			return env, errdefs.New(errdefs.ErrConflict, api.CodeConflict, "environment %s changed while it was squashed", env.Ref)
		}
		return env, err
	}
	return out, nil
}
