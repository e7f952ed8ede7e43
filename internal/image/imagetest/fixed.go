package imagetest

import (
	"context"
	"sort"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Images is a fixed set of images by name, standing in for the registry in
// tests of the node agent and the apiserver.
type Images map[string]api.Image

// Get returns an image, or image_not_found as the registry does.
func (m Images) Get(_ context.Context, name string) (api.Image, error) {
	img, ok := m[name]
	if !ok {
		return api.Image{}, errdefs.New(errdefs.ErrNotFound, api.CodeImageNotFound, "image %q not found", name)
	}
	return img, nil
}

// List returns the images sorted by name.
func (m Images) List(context.Context) ([]api.Image, error) {
	out := []api.Image{}
	for _, img := range m {
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Busybox is an Images with one "busybox" image whose single layer is made
// up: use it with backends that ignore layers, such as the fake.
var Busybox = Images{"busybox": {
	Name:   "busybox",
	Layers: []string{"sha256:0000000000000000000000000000000000000000000000000000000000000000"},
}}

// NoLayers pretends every layer is already on local disk, with no file.
type NoLayers struct{}

// Fetch returns a layer with no path.
func (NoLayers) Fetch(_ context.Context, digest string) (backend.Layer, error) {
	return backend.Layer{Digest: digest}, nil
}
