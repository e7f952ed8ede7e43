package daemon

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/image/oci"
	"github.com/warrenhq/warren/internal/store"
)

// openBlobs opens the blob store every role takes as --blobs (blob.Open:
// a directory or s3://bucket/prefix), by default the directory
// <dir>/blobs, which serves one host only.
func openBlobs(ctx context.Context, spec, dir string) (blob.Store, error) {
	return blob.Open(ctx, blobsOf(spec, dir))
}

// blobsOf is the blob store a role uses, as its startup log shows it.
func blobsOf(spec, dir string) string {
	if spec == "" {
		return filepath.Join(dir, "blobs")
	}
	return spec
}

// imageParts is what a role that serves the API keeps images in: the blob
// store, and the registry of layers and environments over it and st.
type imageParts struct {
	blobs  blob.Store
	images *image.Registry
	dir    string // the role's data dir: scratch space under tmp/
}

// openImages opens the blob store (openBlobs) and the image registry, with
// scratch space under <dir>/tmp, and makes sure the busybox image exists.
func openImages(ctx context.Context, st store.Store, dir, blobSpec string, log *slog.Logger) (*imageParts, error) {
	blobs, err := openBlobs(ctx, blobSpec, dir)
	if err != nil {
		return nil, err
	}
	tmp := filepath.Join(dir, "tmp")
	images := image.NewRegistry(st, blobs, image.WithWorkDir(tmp), image.WithLogger(log))
	if _, err := images.EnsureBusybox(ctx, tmp); err != nil {
		// Not fatal: other images may still work; creates say what is missing.
		log.Error("busybox image unavailable", "err", err)
	}
	return &imageParts{blobs: blobs, images: images, dir: dir}, nil
}

// serverConfig is the apiserver configuration both API roles share: images,
// layers, OCI import and export and squashes (reading layers through
// cache and mounts), identity and admission. The caller sets where
// sandboxes run (Node or Cluster).
func (p *imageParts) serverConfig(cache *image.Cache, mounts *image.Mounts, gc *collector, ids *iamParts, log *slog.Logger) apiserver.Config {
	layers := oci.NodeLayers{Cache: cache, Mounts: mounts}
	return apiserver.Config{
		Squash:         &image.Squasher{Registry: p.images, Cache: cache, Layers: layers},
		Images:         p.images,
		Layers:         p.images,
		CollectGarbage: gc.kick,
		OCI: &oci.Service{
			Importer: oci.Importer{Store: p.images, WorkDir: filepath.Join(p.dir, "tmp", "oci"), Limits: oci.DefaultLimits},
			Layers:   layers,
		},
		Tokens:      ids.IAM,
		IAM:         ids.IAM,
		Idempotency: ids.Idempotency,
		Usage:       ids.Usage,
		Log:         log,
	}
}
