// Package nodetest starts node agents over the fake backend, for fast tests
// of the layers above the node (apiserver, client, CLI) without root.
package nodetest

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/node"
)

// Images is a fixed set of images.
type Images map[string]api.Image

// Get implements node.Images.
func (m Images) Get(_ context.Context, name string) (api.Image, error) {
	img, ok := m[name]
	if !ok {
		return api.Image{}, errdefs.New(errdefs.ErrNotFound, api.CodeImageNotFound, "image %q not found", name)
	}
	return img, nil
}

// List returns the images.
func (m Images) List(context.Context) ([]api.Image, error) {
	out := []api.Image{}
	for _, img := range m {
		out = append(out, img)
	}
	return out, nil
}

// Layers pretends every layer is on local disk.
type Layers struct{}

// Fetch implements node.Layers.
func (Layers) Fetch(_ context.Context, d string) (backend.Layer, error) {
	return backend.Layer{Digest: d}, nil
}

// DefaultImages has a "busybox" image with one made-up layer.
var DefaultImages = Images{"busybox": {Name: "busybox", Layers: []string{"sha256:0000000000000000000000000000000000000000000000000000000000000000"}}}

// New starts an agent with id "n1" over a fake backend that stands in for
// "container", keeping its state under a test temp dir. mod may change the
// config before the agent starts. The agent is closed when the test ends.
func New(t testing.TB, mod func(*node.Config)) *node.Agent {
	t.Helper()
	dir := t.TempDir()
	b, err := fake.New(filepath.Join(dir, "fake"), fake.Options{Name: api.BackendContainer})
	if err != nil {
		t.Fatal(err)
	}
	cfg := node.Config{
		ID:           "n1",
		StateDir:     filepath.Join(dir, "state"),
		Backends:     []backend.Backend{b},
		Images:       DefaultImages,
		Layers:       Layers{},
		ReapInterval: 50 * time.Millisecond,
		Log:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := node.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}
