package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/image"
)

// LayerSource makes a layer's files readable, for export.
type LayerSource interface {
	// MountLayer makes the layer with (manifest) digest readable as a
	// directory tree until release is called.
	MountLayer(ctx context.Context, digest string) (dir string, release func(), err error)
}

// ExportLayout writes env as an OCI image layout, packed as a tar stream,
// to w: one gzip layer per warren layer (bottom first, see
// WriteLayerTar), an image config carrying the environment's env, workdir,
// user and entrypoint, a manifest, and an index naming the image by the
// environment's version (annotation org.opencontainers.image.ref.name).
//
// The layers are compressed into temporary files under tmpDir first, so
// an error before anything is written to w leaves w untouched; the tar is
// then streamed. Cost: every layer is read and gzipped once.
func ExportLayout(ctx context.Context, env api.Environment, src LayerSource, tmpDir string, w io.Writer) error {
	if len(env.Layers) == 0 {
		return invalidImage("environment %s has no layers", env.Ref)
	}
	work, err := os.MkdirTemp(tmpDir, "export-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	var blobs []layoutBlob
	var descs []v1.Descriptor
	var diffIDs []v1.Hash
	var history []v1.History
	for i, l := range env.Layers {
		b, diffID, err := exportLayer(ctx, src, l.Digest, work, i)
		if err != nil {
			return fmt.Errorf("export %s: layer %s: %w", env.Ref, l.Ref, err)
		}
		blobs = append(blobs, b)
		descs = append(descs, v1.Descriptor{MediaType: types.OCILayer, Size: b.size, Digest: b.digest})
		diffIDs = append(diffIDs, diffID)
		history = append(history, v1.History{
			Created:   v1.Time{Time: env.CreatedAt},
			CreatedBy: fmt.Sprintf("warren layer %s (%s)", l.Ref, l.Kind),
			Comment:   l.Digest,
		})
	}

	cfg := v1.ConfigFile{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Created:      v1.Time{Time: env.CreatedAt},
		History:      history,
		RootFS:       v1.RootFS{Type: "layers", DiffIDs: diffIDs},
		Config: v1.Config{
			Env:        envList(env.Env),
			WorkingDir: env.Workdir,
			User:       env.User,
			Entrypoint: env.Entrypoint,
			Labels:     map[string]string{"dev.warren.environment": env.Ref},
		},
	}
	cfgBlob, err := jsonBlob(cfg)
	if err != nil {
		return err
	}
	mf := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        v1.Descriptor{MediaType: types.OCIConfigJSON, Size: cfgBlob.size, Digest: cfgBlob.digest},
		Layers:        descs,
	}
	mfBlob, err := jsonBlob(mf)
	if err != nil {
		return err
	}
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIManifestSchema1,
			Size:        mfBlob.size,
			Digest:      mfBlob.digest,
			Annotations: map[string]string{refAnnotation: env.Version},
			Platform:    &v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}

	mtime := env.CreatedAt
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	tw := tar.NewWriter(w)
	dirs := []string{"blobs/", "blobs/sha256/"}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mtime}); err != nil {
			return err
		}
	}
	put := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: mtime}); err != nil {
			return err
		}
		_, err := io.CopyN(tw, r, size)
		return err
	}
	layoutFile := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	if err := put("oci-layout", int64(len(layoutFile)), bytes.NewReader(layoutFile)); err != nil {
		return err
	}
	seen := map[v1.Hash]bool{}
	for _, b := range append(blobs, cfgBlob, mfBlob) {
		if seen[b.digest] {
			continue // two equal layers: one blob
		}
		seen[b.digest] = true
		if err := b.copyTo(put); err != nil {
			return err
		}
	}
	// index.json last: a stream cut short never looks like a whole layout.
	if err := put("index.json", int64(len(indexJSON)), bytes.NewReader(indexJSON)); err != nil {
		return err
	}
	return tw.Close()
}

// layoutBlob is a blob of the layout, in memory or in a temporary file.
type layoutBlob struct {
	digest v1.Hash
	size   int64
	data   []byte
	file   string
}

func (b layoutBlob) copyTo(put func(string, int64, io.Reader) error) error {
	name := "blobs/" + b.digest.Algorithm + "/" + b.digest.Hex
	if b.file == "" {
		return put(name, b.size, bytes.NewReader(b.data))
	}
	f, err := os.Open(b.file)
	if err != nil {
		return err
	}
	defer f.Close()
	return put(name, b.size, f)
}

func jsonBlob(v any) (layoutBlob, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return layoutBlob{}, err
	}
	sum := sha256.Sum256(b)
	return layoutBlob{digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, size: int64(len(b)), data: b}, nil
}

// exportLayer gzips one layer's tar into a file in work and returns it with
// the digest of the uncompressed tar (its diff ID).
func exportLayer(ctx context.Context, src LayerSource, digest, work string, i int) (layoutBlob, v1.Hash, error) {
	dir, release, err := src.MountLayer(ctx, digest)
	if err != nil {
		return layoutBlob{}, v1.Hash{}, err
	}
	defer release()
	f, err := os.CreateTemp(work, fmt.Sprintf("layer%d-*.tar.gz", i))
	if err != nil {
		return layoutBlob{}, v1.Hash{}, err
	}
	defer f.Close()
	zsum, tsum := sha256.New(), sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, zsum)}
	zw, _ := gzip.NewWriterLevel(cw, gzip.BestSpeed)
	if err := WriteLayerTar(ctx, dir, io.MultiWriter(zw, tsum)); err != nil {
		return layoutBlob{}, v1.Hash{}, err
	}
	if err := zw.Close(); err != nil {
		return layoutBlob{}, v1.Hash{}, err
	}
	if err := f.Close(); err != nil {
		return layoutBlob{}, v1.Hash{}, err
	}
	return layoutBlob{digest: hashOf(zsum), size: cw.n, file: f.Name()}, hashOf(tsum), nil
}

func hashOf(h hash.Hash) v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// envList turns an environment's env map into OCI's sorted "K=V" list.
func envList(env map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// Fetcher returns a layer's EROFS image on local disk (*image.Cache).
type Fetcher interface {
	Fetch(ctx context.Context, digest string) (backend.Layer, error)
}

// NodeLayers is the LayerSource of a node: it fetches a layer into the
// node's cache and mounts it read-only, sharing the mount with sandboxes
// that use the layer. Mounting needs root (ErrUnavailable otherwise).
type NodeLayers struct {
	Cache  Fetcher
	Mounts *image.Mounts
}

// MountLayer implements LayerSource.
func (n NodeLayers) MountLayer(ctx context.Context, digest string) (string, func(), error) {
	l, err := n.Cache.Fetch(ctx, digest)
	if err != nil {
		return "", nil, err
	}
	dir, err := n.Mounts.Acquire(ctx, l)
	if err != nil {
		return "", nil, err
	}
	return dir, func() { n.Mounts.Release(digest) }, nil
}

var (
	_ Fetcher     = (*image.Cache)(nil)
	_ LayerSource = NodeLayers{}
)
