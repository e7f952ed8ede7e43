package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/qemu"
)

// Store is what import needs of the layer and environment registry
// (*image.Registry).
type Store interface {
	// BuildLayer builds the tree in srcDir into a layer and publishes
	// it. ErrConflict if it exists.
	BuildLayer(ctx context.Context, spec image.LayerSpec, srcDir string, opts ...image.BuildOption) (api.Layer, error)
	// CreateEnv publishes an environment. ErrConflict if it exists.
	CreateEnv(ctx context.Context, req api.CreateEnvironmentRequest) (api.Environment, error)
	// GetEnv returns the environment ref names; ErrNotFound if none.
	GetEnv(ctx context.Context, ref string) (api.Environment, error)
	// PublishLayer publishes the file as a layer. ErrConflict if it
	// exists.
	PublishLayer(ctx context.Context, spec image.LayerSpec, file string) (api.Layer, error)
}

var _ Store = (*image.Registry)(nil)

// ImportRequest says what to import and under which name.
type ImportRequest struct {
	Format string // FormatDockerArchive or FormatOCILayout
	// Name is the environment (and base layer) to create: "name" or
	// "name@version". Without a version, the image's tag is used, or
	// else the first 12 hex digits of its ID.
	Name string
	// Ref picks one image of an archive that holds several: a tag
	// ("app:1.0") in a docker-archive, a ref.name annotation in a layout.
	Ref string
}

// Importer turns OCI images into a base layer and an environment.
type Importer struct {
	Store Store
	// WorkDir holds uploads and flattened trees while an import runs; it
	// needs room for the archive plus the unpacked image plus its EROFS
	// build. Created if missing.
	WorkDir string
	Limits  Limits
	// MaxUpload bounds the archive body, bytes; 0 means no bound beyond
	// Limits.
	MaxUpload int64
}

// Import reads an archive (a docker-archive tarball, or a tar of an OCI
// layout) from body and makes it environment req.Name: its layers are
// flattened into one tree (see Flatten), built into one base layer of the
// same name and version, and the image config's Env, WorkingDir, User and
// Entrypoint+Cmd become the environment's defaults.
//
// Errors: ErrInvalid for a bad request or a bad archive (codes
// "invalid_image", "image_too_large"), ErrNotFound if Ref matches no
// image, ErrConflict if the environment or layer exists. Nothing is
// published unless everything succeeds, except a base layer whose
// environment then fails to be created.
func (im *Importer) Import(ctx context.Context, req ImportRequest, body io.Reader) (api.Environment, error) {
	name, version, err := parseName(req.Name)
	if err != nil {
		return api.Environment{}, err
	}
	work, err := im.workDir()
	if err != nil {
		return api.Environment{}, err
	}
	defer removeTree(work)

	var img *Image
	switch req.Format {
	case FormatQCOW2:
		return im.importDisk(ctx, name, version, work, body)
	case FormatDockerArchive:
		file := filepath.Join(work, "archive.tar")
		if err := im.save(body, file); err != nil {
			return api.Environment{}, err
		}
		img, err = OpenDockerArchive(file, req.Ref, im.Limits)
	case FormatOCILayout:
		dir := filepath.Join(work, "layout")
		if err := os.Mkdir(dir, 0o700); err != nil {
			return api.Environment{}, err
		}
		if err := UnpackLayout(body, dir, im.MaxUpload); err != nil {
			return api.Environment{}, err
		}
		img, err = OpenLayout(dir, req.Ref, im.Limits)
	default:
		return api.Environment{}, errdefs.Invalid("import format %q: want %s, %s or %s", req.Format, FormatDockerArchive, FormatOCILayout, FormatQCOW2)
	}
	if err != nil {
		return api.Environment{}, err
	}
	return im.publish(ctx, img, name, version, work)
}

// ImportDir makes environment req.Name from the OCI layout in the local
// directory dir (req.Format is ignored). For tools and tests on the
// server's own host.
func (im *Importer) ImportDir(ctx context.Context, req ImportRequest, dir string) (api.Environment, error) {
	name, version, err := parseName(req.Name)
	if err != nil {
		return api.Environment{}, err
	}
	img, err := OpenLayout(dir, req.Ref, im.Limits)
	if err != nil {
		return api.Environment{}, err
	}
	work, err := im.workDir()
	if err != nil {
		return api.Environment{}, err
	}
	defer removeTree(work)
	return im.publish(ctx, img, name, version, work)
}

func (im *Importer) workDir() (string, error) {
	if err := im.mkWorkDir(); err != nil {
		return "", err
	}
	return os.MkdirTemp(im.WorkDir, "import-*")
}

func (im *Importer) mkWorkDir() error {
	if im.WorkDir == "" {
		return errdefs.Unavailable("oci: no work directory configured")
	}
	if err := os.MkdirAll(im.WorkDir, 0o700); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	return nil
}

// save copies the upload to file, bounded by MaxUpload.
func (im *Importer) save(body io.Reader, file string) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	r := body
	if im.MaxUpload > 0 {
		r = io.LimitReader(body, im.MaxUpload+1)
	}
	n, err := io.Copy(f, r)
	if err != nil {
		return fmt.Errorf("import: read upload: %w", err)
	}
	if im.MaxUpload > 0 && n > im.MaxUpload {
		return tooLarge("upload larger than %d bytes", im.MaxUpload)
	}
	return f.Close()
}

func (im *Importer) publish(ctx context.Context, img *Image, name, version, work string) (api.Environment, error) {
	if version == "" {
		version = versionFor(img)
	}
	ref := name + "@" + version
	// Flattening and building cost minutes for a large image: refuse a
	// name that is taken before, not after.
	if _, err := im.Store.GetEnv(ctx, ref); err == nil {
		return api.Environment{}, errdefs.New(errdefs.ErrConflict, api.CodeEnvExists, "environment %s already exists", ref)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return api.Environment{}, err
	}
	root := filepath.Join(work, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		return api.Environment{}, err
	}
	if err := Flatten(ctx, root, img.Layers, im.Limits); err != nil {
		return api.Environment{}, fmt.Errorf("import %s: %w", ref, err)
	}
	layer, err := im.Store.BuildLayer(ctx, image.LayerSpec{Name: name, Version: version, Kind: api.LayerBase}, root)
	if err != nil {
		return api.Environment{}, fmt.Errorf("import %s: %w", ref, err)
	}
	c := img.Config
	env, err := im.Store.CreateEnv(ctx, api.CreateEnvironmentRequest{
		Name:       name,
		Version:    version,
		Base:       layer.Ref,
		Env:        envMap(c.Env),
		Workdir:    c.WorkingDir,
		User:       c.User,
		Entrypoint: append(append([]string(nil), c.Entrypoint...), c.Cmd...),
	})
	if err != nil {
		return api.Environment{}, fmt.Errorf("import %s: %w", ref, err)
	}
	return env, nil
}

// importDisk makes environment name@version (version default "1") from
// a qcow2 disk image: one layer of kind disk, which boots with --backend
// vm. The image must stand alone (qemu.CheckDiskImage: no backing or
// external data file, which would name files of the node).
func (im *Importer) importDisk(ctx context.Context, name, version, work string, body io.Reader) (api.Environment, error) {
	if version == "" {
		version = "1"
	}
	ref := name + "@" + version
	file := filepath.Join(work, "disk.qcow2")
	if err := im.save(body, file); err != nil {
		return api.Environment{}, err
	}
	if err := qemu.CheckDiskImage(ctx, file); err != nil {
		if errors.Is(err, qemu.ErrBadDisk) {
			return api.Environment{}, errdefs.New(errdefs.ErrInvalid, "invalid_image", "import %s: %v", ref, err)
		}
		return api.Environment{}, fmt.Errorf("import %s: %w", ref, err)
	}
	if _, err := im.Store.GetEnv(ctx, ref); err == nil {
		return api.Environment{}, errdefs.New(errdefs.ErrConflict, api.CodeEnvExists, "environment %s already exists", ref)
	}
	layer, err := im.Store.PublishLayer(ctx, image.LayerSpec{Name: name, Version: version, Kind: api.LayerDisk}, file)
	if err != nil {
		return api.Environment{}, fmt.Errorf("import %s: %w", ref, err)
	}
	env, err := im.Store.CreateEnv(ctx, api.CreateEnvironmentRequest{Name: name, Version: version, Base: layer.Ref})
	if err != nil {
		return api.Environment{}, fmt.Errorf("import %s: %w", ref, err)
	}
	return env, nil
}

// parseName splits "name[@version]" and validates both.
func parseName(s string) (name, version string, err error) {
	r, err := image.ParseRef(s, true)
	if err != nil {
		return "", "", err
	}
	return r.Name, r.Version, nil
}

// versionFor is the image's tag if it makes a valid version, else a
// prefix of its ID, so re-importing the same image finds the same name.
func versionFor(img *Image) string {
	if img.Tag != "" && image.ValidateVersion(img.Tag) == nil {
		return img.Tag
	}
	_, hex, _ := strings.Cut(img.ID, ":")
	return hex[:min(12, len(hex))]
}

// envMap turns OCI's "K=V" list into a map; later entries win, entries
// without "=" are dropped.
func envMap(list []string) map[string]string {
	if len(list) == 0 {
		return nil
	}
	m := make(map[string]string, len(list))
	for _, kv := range list {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			m[k] = v
		}
	}
	return m
}

// removeTree removes dir even where an image made directories read-only
// (which stops a non-root owner from emptying them).
func removeTree(dir string) {
	if os.RemoveAll(dir) == nil {
		return
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	os.RemoveAll(dir)
}
