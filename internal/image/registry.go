package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

// BusyboxImage is the name of the environment every warren has: one base
// layer holding a static busybox.
const BusyboxImage = "busybox"

// busyboxVersion is the version of the busybox layer and environment.
const busyboxVersion = "1"

const (
	layersPrefix = "/layers/"
	envsPrefix   = "/envs/"
	maxLayers    = 128 // far below overlayfs' limit on lower layers
	// recordVersion versions the layer and environment records.
	recordVersion = 1
)

// Registry keeps layers and environments: their records in the store
// (etcd), their content in the blob store. It builds and publishes layers,
// composes environments, resolves what a sandbox starts from, and collects
// unreferenced blobs. Safe for concurrent use, including by several
// processes sharing one store and blob store.
type Registry struct {
	st      store.Store
	bs      blob.Store
	workDir string
	grace   time.Duration
	log     *slog.Logger

	ensureMu sync.Mutex // one busybox build per process at a time
}

// Option configures a Registry.
type Option func(*Registry)

// WithWorkDir sets where layer builds unpack and build (default: the
// system temp dir). It should be on a disk with room for a layer's files
// and its image.
func WithWorkDir(dir string) Option { return func(r *Registry) { r.workDir = dir } }

// WithGCGrace sets how old an unreferenced blob must be before GC deletes
// it, when the blob store can tell a blob's age (default DefaultGCGrace).
func WithGCGrace(d time.Duration) Option { return func(r *Registry) { r.grace = d } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(r *Registry) { r.log = l } }

// NewRegistry returns a Registry over st and bs.
func NewRegistry(st store.Store, bs blob.Store, opts ...Option) *Registry {
	r := &Registry{st: st, bs: bs, workDir: os.TempDir(), grace: DefaultGCGrace, log: slog.Default()}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Blobs returns the registry's blob store.
func (r *Registry) Blobs() blob.Store { return r.bs }

// Get resolves an environment ref ("name@version", or "name" for its
// latest version) to the image a sandbox starts from: the layers' digests,
// their prefetch traces (traces.go) and the environment's defaults. ErrNotFound (code "image_not_found") if
// there is no such environment, ErrInvalid for a malformed ref.
func (r *Registry) Get(ctx context.Context, name string) (api.Image, error) {
	ref, err := ParseRef(name, true)
	if err != nil {
		return api.Image{}, err
	}
	env, err := r.getEnv(ctx, ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		return api.Image{}, errdefs.New(errdefs.ErrNotFound, api.CodeImageNotFound, "image %q not found", name)
	}
	if err != nil {
		return api.Image{}, err
	}
	img := envImage(env)
	r.withTraces(ctx, &img)
	return img, nil
}

// List returns every environment version as an image, sorted by name and
// then version.
func (r *Registry) List(ctx context.Context) ([]api.Image, error) {
	envs, err := r.ListEnvs(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Image, len(envs))
	for i, e := range envs {
		out[i] = envImage(e)
	}
	return out, nil
}

func envImage(e api.Environment) api.Image {
	img := api.Image{
		Name:        e.Ref,
		Size:        e.Size,
		CreatedAt:   e.CreatedAt,
		Env:         e.Env,
		Workdir:     e.Workdir,
		User:        e.User,
		Entrypoint:  e.Entrypoint,
		Unpublished: e.Unpublished,
	}
	for _, l := range e.Layers {
		img.Layers = append(img.Layers, l.Digest)
	}
	return img
}

// ResolveLayers resolves an explicit stack of layer refs, bottom first, to
// the image a sandbox starts from; its name joins the refs with "+".
// ErrNotFound (code "layer_not_found") for a missing layer, ErrInvalid for
// a malformed ref, an empty or too long stack, or a layer given twice.
func (r *Registry) ResolveLayers(ctx context.Context, refs []string) (api.Image, error) {
	if len(refs) == 0 || len(refs) > maxLayers {
		return api.Image{}, errdefs.Invalid("layers: want 1 to %d layer refs, got %d", maxLayers, len(refs))
	}
	img := api.Image{}
	names := make([]string, 0, len(refs))
	seen := map[string]bool{}
	for _, s := range refs {
		l, err := r.GetLayer(ctx, s)
		if err != nil {
			return api.Image{}, err
		}
		if seen[l.Digest] {
			return api.Image{}, errdefs.Invalid("layers: %s is given twice", l.Ref)
		}
		seen[l.Digest] = true
		names = append(names, l.Ref)
		img.Layers = append(img.Layers, l.Digest)
		img.Size += l.Size
		if l.CreatedAt.After(img.CreatedAt) {
			img.CreatedAt = l.CreatedAt
		}
	}
	img.Name = strings.Join(names, "+")
	r.withTraces(ctx, &img)
	return img, nil
}

// EnsureBusybox registers the busybox base layer and environment
// (busybox@1) if they are not registered yet, and returns the image.
// Building takes a second or two: a rootfs from the host's static busybox
// under workDir, an EROFS image of it, chunks in the blob store. The image
// is reproducible, so processes that race here build the same layer and
// the losers of the store's Create adopt the winner's records.
// ErrUnavailable if busybox or mkfs.erofs is missing.
func (r *Registry) EnsureBusybox(ctx context.Context, workDir string) (api.Image, error) {
	img, err := r.Get(ctx, BusyboxImage)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return img, err
	}
	r.ensureMu.Lock()
	defer r.ensureMu.Unlock()
	if img, err := r.Get(ctx, BusyboxImage); !errors.Is(err, errdefs.ErrNotFound) {
		return img, err // another goroutine made it meanwhile
	}
	ref := BusyboxImage + "@" + busyboxVersion
	if _, err := r.GetLayer(ctx, ref); errors.Is(err, errdefs.ErrNotFound) {
		if err := r.buildBusybox(ctx, workDir); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			return api.Image{}, fmt.Errorf("build busybox layer: %w", err)
		}
	} else if err != nil {
		return api.Image{}, err
	}
	_, err = r.CreateEnv(ctx, api.CreateEnvironmentRequest{Name: BusyboxImage, Version: busyboxVersion, Base: ref})
	if err != nil && !errors.Is(err, errdefs.ErrConflict) {
		return api.Image{}, err
	}
	return r.Get(ctx, BusyboxImage)
}

// buildBusybox builds and publishes the busybox layer.
func (r *Registry) buildBusybox(ctx context.Context, workDir string) error {
	ts, err := BusyboxTimestamp()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(workDir, "busybox-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "rootfs")
	if err := BuildBusyboxRootfs(root); err != nil {
		return err
	}
	file := filepath.Join(tmp, "busybox.erofs")
	// Fixed mtimes and owners: the same busybox gives the same layer on
	// every node and in every process.
	if err := BuildEROFS(ctx, root, file, WithTimestamp(ts), WithAllRoot()); err != nil {
		return err
	}
	_, err = r.PublishLayer(ctx, LayerSpec{Name: BusyboxImage, Version: busyboxVersion, Kind: api.LayerBase}, file)
	return err
}

// copyN copies exactly n bytes or fails.
func copyN(w io.Writer, r io.Reader, n int64, buf []byte) error {
	got, err := io.CopyBuffer(w, io.LimitReader(r, n), buf)
	if err == nil && got != n {
		err = io.ErrUnexpectedEOF
	}
	return err
}
