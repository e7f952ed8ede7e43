package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// BusyboxImage is the name of the base image every warren has.
const BusyboxImage = "busybox"

const (
	imagesPrefix  = "/images/"
	maxNameLen    = 255 // as OCI references
	maxLayers     = 128 // far below overlayfs' limit on lower layers
	recordVersion = 1
)

// Registry maps image names to their layers. Records live in the store
// under /images/<name>; layer contents live in the blob store. Safe for
// concurrent use, including by several processes sharing one store.
type Registry struct {
	st store.Store
	bs blob.Store

	ensureMu sync.Mutex // one busybox build per process at a time
}

// NewRegistry returns a Registry over st and bs.
func NewRegistry(st store.Store, bs blob.Store) *Registry {
	return &Registry{st: st, bs: bs}
}

// record is an image as stored; V versions the format.
type record struct {
	V     int       `json:"v"`
	Image api.Image `json:"image"`
}

// ValidateName checks an image name: 1 to 255 characters from [a-z0-9._-/:@],
// starting with a letter or digit, with no empty, "." or ".." path
// segments. ErrInvalid otherwise.
func ValidateName(name string) error {
	bad := func(why string) error {
		return errdefs.New(errdefs.ErrInvalid, "invalid_image_name", "invalid image name %q: %s", name, why)
	}
	if name == "" || len(name) > maxNameLen {
		return bad(fmt.Sprintf("want 1 to %d characters", maxNameLen))
	}
	if c := name[0]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
		return bad("must start with a lowercase letter or digit")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.ContainsRune("._-/:@", c)) {
			return bad("only lowercase letters, digits and . _ - / : @ are allowed")
		}
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return bad(`empty, "." and ".." path segments are not allowed`)
		}
	}
	return nil
}

func key(name string) string { return imagesPrefix + name }

// Put registers img, replacing any image of the same name. Its layers must
// already be in the blob store; Size is recomputed from them, and a zero
// CreatedAt becomes now. ErrInvalid for a bad name, a bad or missing layer.
func (r *Registry) Put(ctx context.Context, img api.Image) error {
	img, val, err := r.prepare(ctx, img)
	if err != nil {
		return err
	}
	if err := r.st.Put(ctx, key(img.Name), val); err != nil {
		return fmt.Errorf("put image %q: %w", img.Name, err)
	}
	return nil
}

// Create registers img like Put, but only if no image has its name:
// ErrConflict (code "image_exists") otherwise.
func (r *Registry) Create(ctx context.Context, img api.Image) error {
	img, val, err := r.prepare(ctx, img)
	if err != nil {
		return err
	}
	err = r.st.Create(ctx, key(img.Name), val)
	if errors.Is(err, errdefs.ErrConflict) {
		return errdefs.New(errdefs.ErrConflict, "image_exists", "image %q already exists", img.Name)
	}
	if err != nil {
		return fmt.Errorf("create image %q: %w", img.Name, err)
	}
	return nil
}

// prepare validates img, fills in Size and CreatedAt and encodes it.
func (r *Registry) prepare(ctx context.Context, img api.Image) (api.Image, []byte, error) {
	if err := ValidateName(img.Name); err != nil {
		return img, nil, err
	}
	if len(img.Layers) == 0 || len(img.Layers) > maxLayers {
		return img, nil, errdefs.New(errdefs.ErrInvalid, "invalid_image",
			"image %q: want 1 to %d layers, got %d", img.Name, maxLayers, len(img.Layers))
	}
	img.Layers = append([]string(nil), img.Layers...)
	img.Size = 0
	for _, d := range img.Layers {
		size, err := r.bs.Stat(ctx, d)
		if errors.Is(err, errdefs.ErrNotFound) {
			return img, nil, errdefs.New(errdefs.ErrInvalid, "layer_not_found",
				"image %q: layer %s is not in the blob store", img.Name, d)
		}
		if err != nil {
			return img, nil, fmt.Errorf("image %q: layer %s: %w", img.Name, d, err)
		}
		img.Size += size
	}
	if img.CreatedAt.IsZero() {
		img.CreatedAt = time.Now().UTC()
	}
	val, err := json.Marshal(record{V: recordVersion, Image: img})
	if err != nil {
		return img, nil, fmt.Errorf("image %q: %w", img.Name, err)
	}
	return img, val, nil
}

// Get returns the image called name; ErrNotFound (code "image_not_found")
// if there is none, ErrInvalid for a malformed name.
func (r *Registry) Get(ctx context.Context, name string) (api.Image, error) {
	if err := ValidateName(name); err != nil {
		return api.Image{}, err
	}
	kv, err := r.st.Get(ctx, key(name))
	if errors.Is(err, errdefs.ErrNotFound) {
		return api.Image{}, errdefs.New(errdefs.ErrNotFound, "image_not_found", "image %q not found", name)
	}
	if err != nil {
		return api.Image{}, fmt.Errorf("get image %q: %w", name, err)
	}
	return decode(kv)
}

// List returns every image, sorted by name.
func (r *Registry) List(ctx context.Context) ([]api.Image, error) {
	kvs, err := r.st.List(ctx, imagesPrefix)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	out := make([]api.Image, 0, len(kvs))
	for _, kv := range kvs {
		img, err := decode(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	return out, nil
}

// Delete unregisters the image called name; ErrNotFound if there is none.
// Its layers stay in the blob store: other images may share them.
func (r *Registry) Delete(ctx context.Context, name string) error {
	if _, err := r.Get(ctx, name); err != nil {
		return err
	}
	if err := r.st.Delete(ctx, key(name)); err != nil {
		return fmt.Errorf("delete image %q: %w", name, err)
	}
	return nil
}

func decode(kv store.KV) (api.Image, error) {
	var rec record
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return api.Image{}, fmt.Errorf("image record %s: %w", kv.Key, err)
	}
	if rec.V != recordVersion {
		return api.Image{}, fmt.Errorf("image record %s: unknown format version %d", kv.Key, rec.V)
	}
	return rec.Image, nil
}

// EnsureBusybox registers the busybox base image if it is not registered
// yet, and returns it. Building it takes a second or two: a rootfs from
// the host's static busybox under workDir, an EROFS image of it, stored in
// the blob store. The image is reproducible, so processes that race here
// build the same layer and the loser of the store's Create adopts the
// winner's record. ErrUnavailable if busybox or mkfs.erofs is missing.
func (r *Registry) EnsureBusybox(ctx context.Context, workDir string) (api.Image, error) {
	img, err := r.Get(ctx, BusyboxImage)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return img, err
	}
	r.ensureMu.Lock()
	defer r.ensureMu.Unlock()
	if img, err := r.Get(ctx, BusyboxImage); !errors.Is(err, errdefs.ErrNotFound) {
		return img, err // another goroutine built it meanwhile
	}

	digest, err := r.buildBusybox(ctx, workDir)
	if err != nil {
		return api.Image{}, fmt.Errorf("build busybox image: %w", err)
	}
	err = r.Create(ctx, api.Image{Name: BusyboxImage, Layers: []string{digest}})
	if err != nil && !errors.Is(err, errdefs.ErrConflict) {
		return api.Image{}, err
	}
	return r.Get(ctx, BusyboxImage)
}

// buildBusybox builds the busybox layer and stores it, returning its digest.
func (r *Registry) buildBusybox(ctx context.Context, workDir string) (string, error) {
	ts, err := BusyboxTimestamp()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(workDir, "busybox-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "rootfs")
	if err := BuildBusyboxRootfs(root); err != nil {
		return "", err
	}
	layer := filepath.Join(tmp, "busybox.erofs")
	// Fixed mtimes and owners: the same busybox gives the same digest on
	// every node and in every process.
	if err := BuildEROFS(ctx, root, layer, WithTimestamp(ts), WithAllRoot()); err != nil {
		return "", err
	}
	f, err := os.Open(layer)
	if err != nil {
		return "", err
	}
	defer f.Close()
	digest, _, err := r.bs.Put(ctx, f)
	return digest, err
}
