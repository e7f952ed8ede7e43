package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Snapshots.
//
// A snapshot is three records: its diff layer (/layers/<name>@<version>,
// kind diff, whose parent is the source sandbox's top layer), the
// environment that stacks it on the source's layers with the source's
// defaults (/envs/<name>@<version>, which names the snapshot), and the
// snapshot itself (/snapshots/<id>: source, lineage, labels, what taking
// it cost). They are written in that order, each create-only, and a
// failure takes back the ones before it, so a snapshot is visible whole or
// not at all to anyone who reads it through its record. The layer's blobs
// were stored by the node that packed it (Cache.Pack); registering pins
// them and checks every one is there before any record names them.

const snapshotsPrefix = "/snapshots/"

type snapshotRecord struct {
	V        int          `json:"v"`
	Snapshot api.Snapshot `json:"snapshot"`
}

// SnapshotSpec is what the control plane registers a packed snapshot
// with: the request, the source sandbox as its node describes it, and
// the node's PackResult.
type SnapshotSpec struct {
	Name, Version string
	Labels        map[string]string
	Source        api.Sandbox
	Pack          api.PackResult
	CreatedBy     string
	Ephemeral     bool // a fork's (api.Snapshot.Ephemeral)
}

// NewSnapshotID returns a fresh snapshot id.
func NewSnapshotID() string { return "snap-" + randomID() }

// IsSnapshotID says whether s has the shape of a snapshot id.
func IsSnapshotID(s string) bool {
	h, ok := strings.CutPrefix(s, "snap-")
	if !ok || len(h) != 16 {
		return false
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// RegisterSnapshot makes a packed snapshot visible as an environment.
// Errors: ErrInvalid for a bad name, version or pack; ErrConflict (codes
// env_exists, layer_exists) when name@version is taken; ErrNotFound when
// the pack's blobs or the source's layers are gone.
func (r *Registry) RegisterSnapshot(ctx context.Context, spec SnapshotSpec) (api.Snapshot, error) {
	id := NewSnapshotID()
	name := spec.Name
	if name == "" {
		name = id
	}
	if err := ValidateName(name); err != nil {
		return api.Snapshot{}, err
	}
	version := spec.Version
	if version == "" {
		versions, err := r.envVersions(ctx, name)
		if err != nil {
			return api.Snapshot{}, err
		}
		vs := make([]string, 0, len(versions))
		for _, e := range versions {
			vs = append(vs, e.Version)
		}
		version = nextVersion(vs)
	}
	if err := ValidateVersion(version); err != nil {
		return api.Snapshot{}, err
	}
	ref := Ref{name, version}
	if _, err := r.getEnv(ctx, ref); err == nil {
		return api.Snapshot{}, errdefs.New(errdefs.ErrConflict, api.CodeEnvExists, "environment %s already exists", ref)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return api.Snapshot{}, err
	}
	p := spec.Pack
	if len(p.Layers) == 0 || p.Parent != p.Layers[len(p.Layers)-1] {
		return api.Snapshot{}, errdefs.Invalid("snapshot %s: the pack's parent %s is not the source's top layer", ref, p.Parent)
	}
	if len(spec.Source.Layers) > 0 && !slices.Equal(spec.Source.Layers, p.Layers) {
		return api.Snapshot{}, errdefs.Invalid("snapshot %s: packed on layers %v, but the source has %v", ref, p.Layers, spec.Source.Layers)
	}

	// Pin the diff and the layers under it, then check they are all
	// there: the diff's chunks may be blobs the node found present and
	// did not write, which nothing else referenced.
	unpin, err := r.pin(ctx, append([]string{p.Digest}, p.Layers...), nil)
	if err != nil {
		return api.Snapshot{}, err
	}
	defer unpin()
	m, err := ReadManifest(ctx, r.bs, p.Digest)
	if err != nil {
		return api.Snapshot{}, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	if m.Kind != api.LayerDiff || m.Parent != p.Parent || m.Image != p.ImageDigest || m.Size != p.Size {
		return api.Snapshot{}, errdefs.Invalid("snapshot %s: manifest %s does not match the pack", ref, p.Digest)
	}
	if err := r.checkChunks(ctx, m); err != nil {
		return api.Snapshot{}, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	under, err := r.layersByDigest(ctx, p.Layers)
	if err != nil {
		return api.Snapshot{}, fmt.Errorf("snapshot %s: %w", ref, err)
	}

	now := time.Now().UTC()
	layer := api.Layer{Ref: ref.String(), Name: name, Version: version, Kind: api.LayerDiff, Digest: p.Digest,
		ImageDigest: m.Image, Size: m.Size, Chunks: len(m.Chunks), Parent: p.Parent, CreatedAt: now}
	diff := api.EnvLayer{Ref: layer.Ref, Kind: layer.Kind, Digest: layer.Digest, Size: layer.Size}
	// A builder's snapshot is theirs until published; a fork's is its
	// branches', which the fork's runner made.
	unpublished := !spec.Ephemeral
	env := api.Environment{Ref: ref.String(), Name: name, Version: version, Layers: append(under, diff),
		Env: maps.Clone(spec.Source.Env), Workdir: spec.Source.Workdir, User: spec.Source.User, Snapshot: id,
		Unpublished: unpublished, CreatedAt: now}
	var parent string
	if src, err := r.GetEnv(ctx, spec.Source.Image); err == nil && spec.Source.Image != "" {
		env.Entrypoint, parent = src.Entrypoint, src.Snapshot
	}
	for _, l := range env.Layers {
		env.Size += l.Size
	}
	if len(env.Layers) > maxLayers {
		return api.Snapshot{}, errdefs.Invalid("snapshot %s: %d layers, at most %d", ref, len(env.Layers), maxLayers)
	}
	snap := api.Snapshot{ID: id, Ref: ref.String(), Name: name, Version: version, Source: spec.Source.ID,
		SourceImage: spec.Source.Image, Parent: parent, Project: spec.Source.Project, Layer: diff,
		Labels: maps.Clone(spec.Labels), Kind: api.SnapshotKindFilesystem, Stats: p.Stats,
		CreatedBy: spec.CreatedBy, CreatedAt: now, Ephemeral: spec.Ephemeral, Unpublished: unpublished}

	// The records, each taken back if a later one fails.
	var undo []func()
	defer func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}()
	put := func(key string, v any, exists error) error {
		val, err := json.Marshal(v)
		if err != nil {
			return err
		}
		err = r.st.Create(ctx, key, val)
		if errors.Is(err, errdefs.ErrConflict) {
			return exists
		}
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", ref, err)
		}
		undo = append(undo, func() { r.st.Delete(context.WithoutCancel(ctx), key) })
		return nil
	}
	if err := put(layerKey(ref), layerRecord{V: recordVersion, Layer: layer}, layerExists(ref.String())); err != nil {
		return api.Snapshot{}, err
	}
	if err := put(envKey(ref), envRecord{V: recordVersion, Env: env},
		errdefs.New(errdefs.ErrConflict, api.CodeEnvExists, "environment %s already exists", ref)); err != nil {
		return api.Snapshot{}, err
	}
	if err := put(snapshotsPrefix+id, snapshotRecord{V: recordVersion, Snapshot: snap},
		errdefs.New(errdefs.ErrConflict, api.CodeConflict, "snapshot %s already exists", id)); err != nil {
		return api.Snapshot{}, err
	}
	undo = nil
	r.log.Info("snapshot registered", "snapshot", id, "env", ref.String(), "source", spec.Source.ID, "layer", p.Digest,
		"freeze_ms", p.Stats.FreezeMS)
	return snap, nil
}

// checkChunks checks that every chunk of m is in the blob store.
func (r *Registry) checkChunks(ctx context.Context, m Manifest) error {
	seen := map[string]bool{}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	sem := make(chan struct{}, uploadParallel)
	for _, c := range m.Chunks {
		if seen[c.Digest] {
			continue
		}
		seen[c.Digest] = true
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := r.bs.Stat(ctx, c.Digest); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("chunk %s: %w", c.Digest, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// layersByDigest returns the layer records' view of each digest, in
// order: the first layer record (by ref) with that digest.
func (r *Registry) layersByDigest(ctx context.Context, digests []string) ([]api.EnvLayer, error) {
	all, err := r.ListLayers(ctx)
	if err != nil {
		return nil, err
	}
	byDigest := map[string]api.Layer{}
	for _, l := range all {
		if _, ok := byDigest[l.Digest]; !ok {
			byDigest[l.Digest] = l
		}
	}
	out := make([]api.EnvLayer, 0, len(digests))
	for _, d := range digests {
		l, ok := byDigest[d]
		if !ok {
			return nil, errdefs.New(errdefs.ErrNotFound, api.CodeLayerNotFound, "no layer has digest %s", d)
		}
		out = append(out, api.EnvLayer{Ref: l.Ref, Kind: l.Kind, Digest: l.Digest, Size: l.Size})
	}
	return out, nil
}

// GetSnapshot returns a snapshot by id, or by its environment's
// name@version. ErrNotFound (code snapshot_not_found).
func (r *Registry) GetSnapshot(ctx context.Context, s string) (api.Snapshot, error) {
	id := s
	if !IsSnapshotID(s) {
		env, err := r.GetEnv(ctx, s)
		if errors.Is(err, errdefs.ErrNotFound) || err == nil && env.Snapshot == "" {
			return api.Snapshot{}, snapshotNotFound(s)
		}
		if err != nil {
			return api.Snapshot{}, err
		}
		id = env.Snapshot
	}
	kv, err := r.st.Get(ctx, snapshotsPrefix+id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return api.Snapshot{}, snapshotNotFound(s)
	}
	if err != nil {
		return api.Snapshot{}, err
	}
	return decodeSnapshot(kv.Value)
}

// ListSnapshots returns every snapshot, oldest first.
func (r *Registry) ListSnapshots(ctx context.Context) ([]api.Snapshot, error) {
	kvs, err := r.st.List(ctx, snapshotsPrefix)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	out := make([]api.Snapshot, 0, len(kvs))
	for _, kv := range kvs {
		s, err := decodeSnapshot(kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	sortSnapshots(out)
	return out, nil
}

func sortSnapshots(s []api.Snapshot) {
	slices.SortFunc(s, func(a, b api.Snapshot) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

func decodeSnapshot(b []byte) (api.Snapshot, error) {
	var rec snapshotRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return api.Snapshot{}, fmt.Errorf("decode snapshot record: %w", err)
	}
	if rec.V != recordVersion {
		return api.Snapshot{}, fmt.Errorf("snapshot record version %d, want %d", rec.V, recordVersion)
	}
	return rec.Snapshot, nil
}

func snapshotNotFound(s string) error {
	return errdefs.New(errdefs.ErrNotFound, api.CodeSnapshotNotFound, "snapshot %s not found", s)
}

// DeleteSnapshot deletes a snapshot (by id or name@version): its record,
// its environment, and its diff layer unless something still builds on
// it (the layer then stays until nothing does; GC keeps its blobs). users
// are the live sandboxes made from its environment. A snapshot that
// others build on (snapshots taken of sandboxes made from it, or users)
// is refused with 409 snapshot_in_use unless force. ErrNotFound (code
// snapshot_not_found).
func (r *Registry) DeleteSnapshot(ctx context.Context, s string, users []string, force bool, live map[string][]string) error {
	snap, err := r.GetSnapshot(ctx, s)
	if err != nil {
		return err
	}
	all, err := r.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	var children []string
	for _, c := range all {
		if c.Parent == snap.ID {
			children = append(children, c.ID+" ("+c.Ref+")")
		}
	}
	if (len(children) > 0 || len(users) > 0) && !force {
		var why []string
		if len(children) > 0 {
			why = append(why, "snapshot"+plural(len(children))+" "+strings.Join(children, ", "))
		}
		if len(users) > 0 {
			why = append(why, "live sandbox"+pluralES(len(users))+" "+strings.Join(users, ", "))
		}
		return errdefs.New(errdefs.ErrConflict, api.CodeSnapshotInUse, "snapshot %s (%s) is built on by %s: delete those first, or force",
			snap.ID, snap.Ref, strings.Join(why, " and "))
	}
	env, _ := r.GetEnv(ctx, snap.Ref)
	if err := r.st.Delete(ctx, snapshotsPrefix+snap.ID); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", snap.ID, err)
	}
	if err := r.DeleteEnv(ctx, snap.Ref); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if env.Squashed != nil && len(env.Layers) > 0 {
		// Its squashed layer was its own, as its diff is.
		top := env.Layers[len(env.Layers)-1].Ref
		if err := r.DeleteLayer(ctx, top, live); err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrConflict) {
			return err
		}
	}
	// The diff layer goes unless something builds on it; then it stays,
	// and its blobs with it.
	if err := r.DeleteLayer(ctx, snap.Layer.Ref, live); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		if !errors.Is(err, errdefs.ErrConflict) {
			return err
		}
		r.log.Info("snapshot deleted; its layer stays", "snapshot", snap.ID, "layer", snap.Layer.Ref, "why", err)
		return nil
	}
	r.log.Info("snapshot deleted", "snapshot", snap.ID, "env", snap.Ref)
	return nil
}

// pruneEphemeral deletes the forks' snapshots nothing uses any more: no
// live sandbox holds their diff layer (live, as GC takes it), no snapshot
// builds on them, and they are older than the grace period (a fork's
// branches are created just after its snapshot). It returns how many.
func (r *Registry) pruneEphemeral(ctx context.Context, live map[string][]string) (int, error) {
	all, err := r.ListSnapshots(ctx)
	if err != nil {
		return 0, err
	}
	parents := map[string]bool{}
	for _, s := range all {
		parents[s.Parent] = true
	}
	n := 0
	for _, s := range all {
		if !s.Ephemeral || parents[s.ID] || len(live[s.Layer.Digest]) > 0 || time.Since(s.CreatedAt) < r.grace {
			continue
		}
		if err := r.DeleteSnapshot(ctx, s.ID, nil, false, live); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrConflict) {
				continue // gone already, or built on since
			}
			return n, err
		}
		n++
	}
	return n, nil
}

// PublishEnv records a publish check's outcome on environment ref (nil:
// none was asked for) and publishes it unless the check failed; a
// snapshot's record follows. ErrNotFound for an unknown environment.
func (r *Registry) PublishEnv(ctx context.Context, s string, check *api.EnvCheck) (api.Environment, error) {
	ref, err := ParseRef(s, true)
	if err != nil {
		return api.Environment{}, err
	}
	for {
		env, err := r.getEnv(ctx, ref)
		if err != nil {
			return api.Environment{}, err
		}
		kv, err := r.st.Get(ctx, envKey(Ref{env.Name, env.Version}))
		if err != nil {
			return api.Environment{}, err
		}
		if check != nil {
			env.Check = check
		}
		env.Unpublished = check != nil && !check.Passed && env.Unpublished
		val, err := json.Marshal(envRecord{V: recordVersion, Env: env})
		if err != nil {
			return api.Environment{}, err
		}
		err = r.st.CompareAndPut(ctx, kv.Key, val, kv.Version)
		if errors.Is(err, errdefs.ErrConflict) {
			continue // changed meanwhile: again
		}
		if err != nil {
			return api.Environment{}, fmt.Errorf("publish %s: %w", env.Ref, err)
		}
		if env.Snapshot != "" {
			if err := r.setSnapshotUnpublished(ctx, env.Snapshot, env.Unpublished); err != nil {
				return api.Environment{}, err
			}
		}
		r.log.Info("environment publish", "env", env.Ref, "published", !env.Unpublished, "checked", check != nil)
		return env, nil
	}
}

func (r *Registry) setSnapshotUnpublished(ctx context.Context, id string, unpublished bool) error {
	for {
		kv, err := r.st.Get(ctx, snapshotsPrefix+id)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		snap, err := decodeSnapshot(kv.Value)
		if err != nil {
			return err
		}
		snap.Unpublished = unpublished
		val, err := json.Marshal(snapshotRecord{V: recordVersion, Snapshot: snap})
		if err != nil {
			return err
		}
		if err := r.st.CompareAndPut(ctx, kv.Key, val, kv.Version); !errors.Is(err, errdefs.ErrConflict) {
			return err
		}
	}
}
