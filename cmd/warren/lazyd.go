package main

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/internal/daemon"
)

// newLazydCmd is the lazy layer server a node agent started with
// --lazy-layers runs in a process of its own (internal/lazy), so that
// sandboxes keep reading their layers while the agent restarts.
func newLazydCmd() *cobra.Command {
	var cfg daemon.LayerServerConfig
	cmd := &cobra.Command{
		Use:    "lazyd",
		Short:  "Serve a node's lazily loaded layers (started by the agent)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return serve(false, func(ctx context.Context, log *slog.Logger) error {
				cfg.Log = log
				return daemon.ServeLayers(ctx, cfg)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Dir, "dir", "", "the server's directory (socket, mount, chunk cache)")
	f.StringVar(&cfg.Blobs, "blobs", "", "the blob store")
	f.Int64Var(&cfg.CacheBytes, "chunk-cache", daemon.DefaultChunkCache, "the chunk cache's limit in bytes")
	f.DurationVar(&cfg.TraceWindow, "trace-window", 0, "how long a layer's first reads are recorded into its prefetch trace (default 30s; negative: none)")
	cmd.MarkFlagRequired("dir")
	cmd.MarkFlagRequired("blobs")
	return cmd
}
