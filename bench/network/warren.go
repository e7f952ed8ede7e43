package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/daemon"
)

// upWarren runs `warren up` in this process on dataDir, without FnCall or
// runtime images (nothing in the background), until ctx ends, and returns
// a client of it. Its sandboxes get no network unless net says how.
func upWarren(ctx context.Context, dataDir string, net *daemon.NetworkConfig) (*client.Client, error) {
	cfg := daemon.UpConfig{
		DataDir:    dataDir,
		Listen:     "127.0.0.1:0",
		ImageCache: filepath.Join(dataDir, "no-images"),
		Log:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	cfg.Fn.Disabled = true
	cfg.Network.Off = true // sandboxes with no network: nothing else to set up
	if net != nil {
		cfg.Network = *net
	}
	ready := make(chan string, 1)
	done := make(chan error, 1)
	cfg.Ready = func(addr string) { ready <- addr }
	go func() { done <- daemon.Up(ctx, cfg) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		return nil, fmt.Errorf("warren up: %w", err)
	}
	tok, err := os.ReadFile(filepath.Join(dataDir, daemon.AdminTokenFile))
	if err != nil {
		return nil, err
	}
	return client.New("http://"+addr, strings.TrimSpace(string(tok))), nil
}
