package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

// snapshotFixture is a registry with a base layer and environment b@1,
// and a node's cache to pack diffs with.
type snapshotFixture struct {
	r     *Registry
	bs    blob.Store
	cache *Cache
	base  api.Layer
}

func newSnapshotFixture(t *testing.T) *snapshotFixture {
	t.Helper()
	testutil.RequireBinary(t, "mkfs.erofs")
	ctx := context.Background()
	bs, err := blob.NewDir(t.TempDir())
	mustT(t, err)
	f := &snapshotFixture{r: NewRegistry(store.Memory(), bs, WithGCGrace(0), WithWorkDir(t.TempDir()), WithLogger(quietLog)),
		bs: bs, cache: NewCache(t.TempDir(), bs)}
	src := t.TempDir()
	mustT(t, os.WriteFile(filepath.Join(src, "base-file"), []byte("base"), 0o644))
	f.base, err = f.r.BuildLayer(ctx, LayerSpec{Name: "b", Version: "1", Kind: api.LayerBase}, src)
	mustT(t, err)
	_, err = f.r.CreateEnv(ctx, api.CreateEnvironmentRequest{Name: "b", Version: "1", Base: "b@1", Workdir: "/work"})
	mustT(t, err)
	return f
}

// pack packs a diff with one file, as a node does, on the base layer.
func (f *snapshotFixture) pack(t *testing.T, content string) api.PackResult {
	t.Helper()
	return f.packOn(t, content, f.base.Digest)
}

// packOn packs a diff on the layers under it, bottom first.
func (f *snapshotFixture) packOn(t *testing.T, content string, layers ...string) api.PackResult {
	t.Helper()
	upper := t.TempDir()
	mustT(t, os.WriteFile(filepath.Join(upper, "written"), []byte(content), 0o644))
	p, err := f.cache.Pack(context.Background(), upper, layers[len(layers)-1])
	mustT(t, err)
	p.Layers = layers
	return p
}

func (f *snapshotFixture) register(t *testing.T, name, version string, p api.PackResult, ephemeral bool) (api.Snapshot, error) {
	t.Helper()
	return f.r.RegisterSnapshot(context.Background(), SnapshotSpec{Name: name, Version: version, Pack: p, Ephemeral: ephemeral,
		Source: api.Sandbox{ID: "n1-src", Image: "b@1", Layers: []string{f.base.Digest}, Env: map[string]string{"STAGE": "built"},
			Workdir: "/work", Project: "team"}})
}

// A registered snapshot is an environment (the source's layers with the
// diff on top, its defaults), found by id and by name@version; a taken
// name@version and a pack whose blobs went missing are refused, leaving
// no record behind.
func TestRegisterSnapshot(t *testing.T) {
	f := newSnapshotFixture(t)
	ctx := context.Background()
	snap, err := f.register(t, "task", "1", f.pack(t, "one"), false)
	mustT(t, err)
	env, err := f.r.GetEnv(ctx, "task@1")
	mustT(t, err)
	if len(env.Layers) != 2 || env.Layers[0].Digest != f.base.Digest || env.Layers[1].Kind != api.LayerDiff ||
		env.Snapshot != snap.ID || env.Env["STAGE"] != "built" || env.Workdir != "/work" || snap.Project != "team" {
		t.Errorf("environment of the snapshot: %+v (snapshot %+v)", env, snap)
	}
	for _, ref := range []string{snap.ID, "task@1"} {
		if got, err := f.r.GetSnapshot(ctx, ref); err != nil || got.ID != snap.ID {
			t.Errorf("GetSnapshot(%s): %+v, %v", ref, got, err)
		}
	}
	if _, err := f.register(t, "task", "1", f.pack(t, "again"), false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a taken name@version: %v", err)
	}
	// A snapshot of a sandbox made from task@1 names it as its parent.
	p := f.packOn(t, "two", f.base.Digest, snap.Layer.Digest)
	child, err := f.r.RegisterSnapshot(ctx, SnapshotSpec{Name: "task", Pack: p,
		Source: api.Sandbox{ID: "n1-child", Image: "task@1"}})
	mustT(t, err)
	if child.Ref != "task@2" || child.Parent != snap.ID {
		t.Errorf("snapshot of a snapshot's sandbox: %+v", child)
	}

	// The pack must be on the source's layers.
	if _, err := f.register(t, "wrong", "1", f.packOn(t, "x", f.base.Digest, snap.Layer.Digest), false); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a pack on other layers than the source's: %v", err)
	}
	// A chunk gone from the blob store between pack and register.
	p = f.pack(t, "lost chunk")
	m, err := ReadManifest(ctx, f.bs, p.Digest)
	mustT(t, err)
	mustT(t, f.bs.Delete(ctx, m.Chunks[0].Digest))
	if _, err := f.register(t, "lost", "1", p, false); err == nil {
		t.Error("a pack with a missing chunk was registered")
	}
	if _, err := f.r.GetEnv(ctx, "lost@1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused snapshot left its environment: %v", err)
	}
}

// GC removes a fork's (ephemeral) snapshot once no live sandbox uses it,
// with its environment, and never a named one or one in use.
func TestGCPrunesForkSnapshots(t *testing.T) {
	f := newSnapshotFixture(t)
	ctx := context.Background()
	fork, err := f.register(t, "", "", f.pack(t, "fork"), true)
	mustT(t, err)
	named, err := f.register(t, "keep", "1", f.pack(t, "named"), false)
	mustT(t, err)

	live := map[string][]string{fork.Layer.Digest: {"n1-branch"}}
	res, err := f.r.GC(ctx, live)
	mustT(t, err)
	if res.Snapshots != 0 {
		t.Errorf("GC removed %d snapshots while a branch uses the fork's", res.Snapshots)
	}
	res, err = f.r.GC(ctx, nil)
	mustT(t, err)
	if res.Snapshots != 1 {
		t.Errorf("GC removed %d snapshots, want the fork's", res.Snapshots)
	}
	if _, err := f.r.GetSnapshot(ctx, fork.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the fork's snapshot after GC: %v", err)
	}
	if _, err := f.r.GetEnv(ctx, fork.Ref); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the fork's environment after GC: %v", err)
	}
	if _, err := f.r.GetSnapshot(ctx, named.ID); err != nil {
		t.Errorf("GC removed a named snapshot: %v", err)
	}
}
