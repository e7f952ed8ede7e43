package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/warrenhq/warren/bench/internal/benchup"
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
	return benchup.Run(ctx, cfg)
}
