package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/internal/daemon"
)

func newUpCmd() *cobra.Command {
	cfg := daemon.UpConfig{}
	var verbose bool
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a single-node warren: apiserver, node agent, embedded etcd and blob store in one process",
		Long: `Run a single-node warren: apiserver, node agent, an embedded etcd member and a
blob store in one process, with all state under --data-dir. The admin token is
written to <data-dir>/admin-token. Sandboxes outlive this process: a later
"warren up" on the same data dir re-adopts them, ends those whose TTL ran out
meanwhile and removes what no sandbox record accounts for (cgroups, mounts, runc
state), logging each. With --stop-sandboxes, stopping warren ends every sandbox
instead; "warren sandbox rm --all" ends them while it runs.

The blob store is <data-dir>/blobs unless --blobs names another directory, or an
S3 bucket: s3://bucket/prefix?endpoint=host:port (https; http://host:port for
plain HTTP; no endpoint: AWS S3), with &region=R if needed and the credentials in
AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.

It serves plain HTTP (on loopback by default) unless given --tls-cert and
--tls-key (see "warren cert").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return daemon.Up(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", dataDirDefault(), "directory for all state (env "+envDataDir+")")
	f.StringVar(&cfg.Listen, "listen", daemon.DefaultListen, "API listen address")
	tlsFlags(f, &cfg.TLS)
	f.StringVar(&cfg.Blobs, "blobs", "", "blob store: a directory or s3://bucket/prefix?endpoint=host:port (default <data-dir>/blobs)")
	limitFlags(f, &cfg.Limits)
	reclaimFlag(f, &cfg.ReclaimIdle)
	mergeFlag(f, &cfg.NoMemoryMerge)
	quantityVar(f, &cfg.DefaultDisk, "default-disk", "writable layer limit of a sandbox that asks for none, e.g. 10Gi (0: none; needs a data dir on btrfs, or xfs or ext4 with project quotas)")
	f.BoolVar(&cfg.StopSandboxes, "stop-sandboxes", false, "end every sandbox when warren stops (default: they keep running and the next \"warren up\" on --data-dir re-adopts them)")
	f.StringVar(&cfg.ImageCache, "image-cache", "", "built runtime images to publish at startup (default $WARREN_IMAGE_CACHE or "+daemon.DefaultImageCache+")")
	fnFlags(f, &cfg.Fn)
	networkConfigFlags(f, &cfg.Network)
	machineFlags(f, &cfg.Machines)
	layersFlags(f, &cfg.Layers)
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}

// dataDirDefault is $WARREN_DATA_DIR, or /var/lib/warren.
func dataDirDefault() string {
	if d := os.Getenv(envDataDir); d != "" {
		return d
	}
	return daemon.DefaultDataDir
}
