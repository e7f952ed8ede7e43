package image

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// EnsureRootfs publishes the directory rootfs as the base layer
// name@version and the environment name@version on it alone, unless they
// exist; either that exists is kept. Building costs an EROFS image of the
// tree and its chunks in the blob store.
func (r *Registry) EnsureRootfs(ctx context.Context, name, version, rootfs string) (api.Environment, error) {
	ref := name + "@" + version
	if env, err := r.GetEnv(ctx, ref); err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return env, err
	}
	if _, err := r.GetLayer(ctx, ref); errors.Is(err, errdefs.ErrNotFound) {
		spec := LayerSpec{Name: name, Version: version, Kind: api.LayerBase}
		if _, err := r.BuildLayer(ctx, spec, rootfs); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			return api.Environment{}, err
		}
	} else if err != nil {
		return api.Environment{}, err
	}
	env, err := r.CreateEnv(ctx, api.CreateEnvironmentRequest{Name: name, Version: version, Base: ref})
	if errors.Is(err, errdefs.ErrConflict) {
		env, err = r.GetEnv(ctx, ref)
	}
	return env, err
}

// StampFile is where scripts/build-debian-image records what it built
// (name=, version=, ...) inside the root filesystem.
const StampFile = "etc/warren-image"

// ReadStamp reads a root filesystem's StampFile.
func ReadStamp(rootfs string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(rootfs, StampFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	kv := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return kv, sc.Err()
}

// PublishCached publishes every image built into cacheDir (one root
// filesystem per directory, stamped by scripts/build-debian-image) that is
// not an environment yet, and returns the environments published or found.
// Directories without a stamp are skipped; a missing cacheDir is no error.
func (r *Registry) PublishCached(ctx context.Context, cacheDir string) ([]string, error) {
	entries, err := os.ReadDir(cacheDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	var errs []error
	for _, e := range entries {
		dir := filepath.Join(cacheDir, e.Name())
		stamp, err := ReadStamp(dir)
		if err != nil || stamp["name"] == "" || stamp["version"] == "" {
			continue
		}
		env, err := r.EnsureRootfs(ctx, stamp["name"], stamp["version"], dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, env.Ref)
	}
	return out, errors.Join(errs...)
}
