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
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node"
)

// New starts an agent with id "n1" over a fake backend that stands in for
// "container", keeping its state under a test temp dir. mod may change the
// config before the agent starts. The agent is closed when the test ends.
func New(t testing.TB, mod func(*node.Config)) *node.Agent {
	t.Helper()
	a, _ := NewFake(t, mod)
	return a
}

// NewFake is New that also returns the agent's fake backend (to put test
// servers on its sandboxes' ports, fake.Backend.Listen), unless mod
// replaced it.
func NewFake(t testing.TB, mod func(*node.Config)) (*node.Agent, *fake.Backend) {
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
		Images:       imagetest.Busybox,
		Layers:       imagetest.NoLayers{},
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
	return a, b
}
