package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
)

// LayerSpec names a layer to build or publish.
type LayerSpec struct {
	Name    string
	Version string
	Kind    string // api.LayerBase, LayerWorkspace, LayerToolkit or LayerDiff
	// Parent is the ref of the layer a diff applies on; diff layers only.
	Parent string
}

func (s LayerSpec) ref() string { return s.Name + "@" + s.Version }

// uploadParallel is how many chunks a publish writes at once: enough to
// hide an object store's latency, few enough for a directory store.
const uploadParallel = 4

// layerRecord is a layer as stored under /layers/<name>@<version>.
type layerRecord struct {
	V     int       `json:"v"`
	Layer api.Layer `json:"layer"`
}

func layerKey(ref Ref) string { return layersPrefix + ref.String() }

// validate checks the spec, resolves a diff's parent to its manifest
// digest, and refuses early a name@version that exists: a build can take
// minutes.
func (r *Registry) validateSpec(ctx context.Context, s LayerSpec) (parent string, err error) {
	if err := ValidateName(s.Name); err != nil {
		return "", err
	}
	if err := ValidateVersion(s.Version); err != nil {
		return "", err
	}
	if err := validKind(s.Kind); err != nil {
		return "", err
	}
	switch {
	case s.Kind == api.LayerDiff && s.Parent == "":
		return "", errdefs.Invalid("layer %s: a diff layer needs a parent", s.ref())
	case s.Kind != api.LayerDiff && s.Parent != "":
		return "", errdefs.Invalid("layer %s: only diff layers have a parent", s.ref())
	case s.Parent != "":
		p, err := r.GetLayer(ctx, s.Parent)
		if err != nil {
			return "", fmt.Errorf("parent of %s: %w", s.ref(), err)
		}
		parent = p.Digest
	}
	if _, err := r.st.Get(ctx, layerKey(Ref{s.Name, s.Version})); err == nil {
		return "", layerExists(s.ref())
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return "", err
	}
	return parent, nil
}

func layerExists(ref string) error {
	return errdefs.New(errdefs.ErrConflict, api.CodeLayerExists, "layer %s already exists", ref)
}

func layerNotFound(ref string) error {
	return errdefs.New(errdefs.ErrNotFound, api.CodeLayerNotFound, "layer %s not found", ref)
}

// BuildLayer builds an EROFS image of the directory srcDir (owners, modes,
// mtimes and xattrs kept; opts as for BuildEROFS) and publishes it as
// spec. Errors: ErrInvalid for a bad spec or source (code
// "build_source_not_found" for a missing srcDir), ErrConflict (code
// "layer_exists") if name@version exists, ErrUnavailable without
// mkfs.erofs.
func (r *Registry) BuildLayer(ctx context.Context, spec LayerSpec, srcDir string, opts ...BuildOption) (api.Layer, error) {
	if _, err := r.validateSpec(ctx, spec); err != nil {
		return api.Layer{}, err
	}
	fi, err := os.Stat(srcDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return api.Layer{}, errdefs.New(errdefs.ErrInvalid, "build_source_not_found", "layer %s: source directory %s does not exist", spec.ref(), srcDir)
	case err != nil:
		return api.Layer{}, fmt.Errorf("layer %s: %w", spec.ref(), err)
	case !fi.IsDir():
		return api.Layer{}, errdefs.Invalid("layer %s: source %s is not a directory", spec.ref(), srcDir)
	}
	tmp, err := r.tempDir("build-*")
	if err != nil {
		return api.Layer{}, err
	}
	defer os.RemoveAll(tmp)
	file := filepath.Join(tmp, "layer.erofs")
	if err := BuildEROFS(ctx, srcDir, file, opts...); err != nil {
		return api.Layer{}, fmt.Errorf("layer %s: %w", spec.ref(), err)
	}
	return r.PublishLayer(ctx, spec, file)
}

// BuildLayerFromTar builds a layer from a tar or gzip-compressed tar
// stream of its files, extracted safely (rootfs.WriteTar: entries stay
// inside the layer, device nodes are refused; owners are kept only when
// running as root). ErrInvalid for a corrupt or empty archive; otherwise
// as BuildLayer.
func (r *Registry) BuildLayerFromTar(ctx context.Context, spec LayerSpec, tarball io.Reader) (api.Layer, error) {
	if _, err := r.validateSpec(ctx, spec); err != nil {
		return api.Layer{}, err
	}
	tmp, err := r.tempDir("unpack-*")
	if err != nil {
		return api.Layer{}, err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return api.Layer{}, err
	}
	if err := extractTarball(tarball, root); err != nil {
		return api.Layer{}, fmt.Errorf("layer %s: %w", spec.ref(), err)
	}
	return r.BuildLayer(ctx, spec, root)
}

func (r *Registry) tempDir(pattern string) (string, error) {
	if err := os.MkdirAll(r.workDir, 0o755); err != nil {
		return "", fmt.Errorf("layer work dir: %w", err)
	}
	return os.MkdirTemp(r.workDir, pattern)
}

// PublishLayer stores the EROFS image at file as the layer spec: its
// chunks (only those the blob store lacks), then its manifest, then the
// record that makes it visible, so a half-written layer is never seen.
// Chunks and manifest are pinned against GC until the record exists.
// It reads the image twice (plan, then upload of missing chunks).
// Errors as BuildLayer.
func (r *Registry) PublishLayer(ctx context.Context, spec LayerSpec, file string) (api.Layer, error) {
	parent, err := r.validateSpec(ctx, spec)
	if err != nil {
		return api.Layer{}, err
	}
	m, err := planManifest(ctx, file, spec.Kind, parent)
	if err != nil {
		return api.Layer{}, fmt.Errorf("layer %s: %w", spec.ref(), err)
	}
	mb, digest, err := m.Encode()
	if err != nil {
		return api.Layer{}, err
	}
	blobs := []string{digest}
	seen := map[string]bool{}
	for _, c := range m.Chunks {
		if !seen[c.Digest] {
			seen[c.Digest] = true
			blobs = append(blobs, c.Digest)
		}
	}
	var manifests []string
	if parent != "" {
		manifests = append(manifests, parent)
	}
	unpin, err := r.pin(ctx, manifests, blobs)
	if err != nil {
		return api.Layer{}, fmt.Errorf("layer %s: %w", spec.ref(), err)
	}
	defer unpin()
	if parent != "" {
		// The parent may have gone while no pin held it.
		if p, err := r.GetLayer(ctx, spec.Parent); err != nil || p.Digest != parent {
			return api.Layer{}, errdefs.New(errdefs.ErrConflict, "parent_changed",
				"layer %s: parent %s was deleted or replaced during the build", spec.ref(), spec.Parent)
		}
	}
	if _, err := uploadChunks(ctx, r.bs, file, m); err != nil {
		return api.Layer{}, fmt.Errorf("layer %s: %w", spec.ref(), err)
	}
	if _, err := blob.PutExpected(ctx, r.bs, digest, bytes.NewReader(mb)); err != nil {
		return api.Layer{}, fmt.Errorf("layer %s: manifest: %w", spec.ref(), err)
	}
	l := api.Layer{
		Ref:         spec.ref(),
		Name:        spec.Name,
		Version:     spec.Version,
		Kind:        spec.Kind,
		Digest:      digest,
		ImageDigest: m.Image,
		Size:        m.Size,
		Chunks:      len(m.Chunks),
		Parent:      parent,
		CreatedAt:   time.Now().UTC(),
	}
	val, err := json.Marshal(layerRecord{V: recordVersion, Layer: l})
	if err != nil {
		return api.Layer{}, err
	}
	err = r.st.Create(ctx, layerKey(Ref{spec.Name, spec.Version}), val)
	if errors.Is(err, errdefs.ErrConflict) {
		return api.Layer{}, layerExists(spec.ref())
	}
	if err != nil {
		return api.Layer{}, fmt.Errorf("layer %s: %w", spec.ref(), err)
	}
	r.log.Info("layer published", "layer", l.Ref, "kind", l.Kind, "digest", digest, "size", l.Size, "chunks", l.Chunks)
	return l, nil
}

// uploadChunks writes the chunks of m that the blob store lacks, a few at
// a time, each verified against its digest on the way, and says how many
// it wrote and their bytes.
func uploadChunks(ctx context.Context, bs blob.Store, file string, m Manifest) (PackStats, error) {
	f, err := os.Open(file)
	if err != nil {
		return PackStats{}, err
	}
	defer f.Close()
	type job struct {
		off int64
		c   Chunk
	}
	jobs := make(chan job)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		st       = PackStats{Chunks: len(m.Chunks)}
	)
	for range uploadParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				sr := io.NewSectionReader(f, j.off, j.c.Size)
				wrote, err := putMissing(ctx, bs, j.c.Digest, sr)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("chunk at %d: %w", j.off, err)
					cancel()
				}
				if wrote {
					st.Uploaded++
					st.UploadedBytes += j.c.Size
				}
				mu.Unlock()
			}
		}()
	}
	seen := map[string]bool{}
	var off int64
feed:
	for _, c := range m.Chunks {
		if !seen[c.Digest] {
			seen[c.Digest] = true
			select {
			case jobs <- job{off, c}:
			case <-ctx.Done():
				break feed
			}
		}
		off += c.Size
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return st, firstErr
	}
	return st, ctx.Err()
}

// putMissing is blob.PutExpected that says whether it wrote the blob.
func putMissing(ctx context.Context, bs blob.Store, digest string, r io.Reader) (bool, error) {
	if _, err := bs.Stat(ctx, digest); err == nil {
		return false, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return false, err
	}
	_, err := blob.PutExpected(ctx, bs, digest, r)
	return err == nil, err
}

// PackStats says what Pack (and a publish) stored.
type PackStats struct {
	Chunks        int   // in the layer's manifest
	Uploaded      int   // written: the blob store lacked them
	UploadedBytes int64 // their bytes
}

// Pack stores the EROFS image at file in the blob store as a layer of kind
// on top of parent (a manifest digest; "" for none): the chunks the store
// lacks, then the manifest, whose digest it returns. It makes nothing
// visible and pins nothing: a node packs what it built (a snapshot of a
// sandbox) and the control plane then registers it (RegisterLayer), which
// checks that every blob is still there. Until then the blobs are as young
// as the GC grace period protects.
func Pack(ctx context.Context, bs blob.Store, file, kind, parent string) (Manifest, string, PackStats, error) {
	m, err := planManifest(ctx, file, kind, parent)
	if err != nil {
		return Manifest{}, "", PackStats{}, err
	}
	mb, digest, err := m.Encode()
	if err != nil {
		return Manifest{}, "", PackStats{}, err
	}
	st, err := uploadChunks(ctx, bs, file, m)
	if err != nil {
		return Manifest{}, "", st, err
	}
	wrote, err := putMissing(ctx, bs, digest, bytes.NewReader(mb))
	if err != nil {
		return Manifest{}, "", st, fmt.Errorf("manifest: %w", err)
	}
	if wrote {
		st.UploadedBytes += int64(len(mb))
	}
	return m, digest, st, nil
}

// GetLayer returns a layer by ref ("name@version", or "name" for its
// latest version). ErrNotFound (code "layer_not_found"), ErrInvalid for a
// malformed ref.
func (r *Registry) GetLayer(ctx context.Context, s string) (api.Layer, error) {
	ref, err := ParseRef(s, true)
	if err != nil {
		return api.Layer{}, err
	}
	if ref.Version == "" {
		all, err := r.layerVersions(ctx, ref.Name)
		if err != nil {
			return api.Layer{}, err
		}
		if len(all) == 0 {
			return api.Layer{}, layerNotFound(ref.Name)
		}
		return all[len(all)-1], nil
	}
	kv, err := r.st.Get(ctx, layerKey(ref))
	if errors.Is(err, errdefs.ErrNotFound) {
		return api.Layer{}, layerNotFound(ref.String())
	}
	if err != nil {
		return api.Layer{}, fmt.Errorf("get layer %s: %w", ref, err)
	}
	return decodeLayer(kv)
}

// layerVersions returns every version of the layer called name, oldest
// version first.
func (r *Registry) layerVersions(ctx context.Context, name string) ([]api.Layer, error) {
	kvs, err := r.st.List(ctx, layersPrefix+name+"@")
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	out := make([]api.Layer, 0, len(kvs))
	for _, kv := range kvs {
		l, err := decodeLayer(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return CompareVersions(out[i].Version, out[j].Version) < 0 })
	return out, nil
}

func decodeLayer(kv store.KV) (api.Layer, error) {
	var rec layerRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return api.Layer{}, fmt.Errorf("layer record %s: %w", kv.Key, err)
	}
	if rec.V != recordVersion {
		return api.Layer{}, fmt.Errorf("layer record %s: unknown format version %d", kv.Key, rec.V)
	}
	return rec.Layer, nil
}

// ListLayers returns every layer, sorted by name and then version, each
// with the environments that use it and its prefetch trace. It reads
// every layer, environment and trace record.
func (r *Registry) ListLayers(ctx context.Context) ([]api.Layer, error) {
	kvs, err := r.st.List(ctx, layersPrefix)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	users, err := r.layerUsers(ctx)
	if err != nil {
		return nil, err
	}
	traces, err := r.traces(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Layer, 0, len(kvs))
	for _, kv := range kvs {
		l, err := decodeLayer(kv)
		if err != nil {
			return nil, err
		}
		l.UsedBy = users[l.Ref]
		l.PrefetchTrace = traces[l.Digest]
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return CompareVersions(out[i].Version, out[j].Version) < 0
	})
	return out, nil
}

// DescribeLayer is GetLayer plus the environments that use the layer and
// its prefetch trace.
func (r *Registry) DescribeLayer(ctx context.Context, ref string) (api.Layer, error) {
	l, err := r.GetLayer(ctx, ref)
	if err != nil {
		return l, err
	}
	users, err := r.layerUsers(ctx)
	if err != nil {
		return l, err
	}
	l.UsedBy = users[l.Ref]
	if l.PrefetchTrace, err = r.Trace(ctx, l.Digest); err != nil {
		return l, err
	}
	return l, nil
}

// layerUsers maps layer refs to the environments that use them.
func (r *Registry) layerUsers(ctx context.Context) (map[string][]string, error) {
	envs, err := r.ListEnvs(ctx)
	if err != nil {
		return nil, err
	}
	users := map[string][]string{}
	for _, e := range envs {
		for _, l := range e.Layers {
			users[l.Ref] = append(users[l.Ref], e.Ref)
		}
	}
	return users, nil
}

// DeleteLayer removes the layer name@version (an exact version: never
// "the latest"). live maps layer digests to the live sandboxes that use
// them. Refused with ErrConflict (code "layer_in_use") while an
// environment, a live sandbox or a diff layer on top uses the layer;
// ErrNotFound (code "layer_not_found"). The layer's blobs stay until GC
// finds them unreferenced: other layers may share chunks.
//
// An environment created concurrently may still name the deleted layer;
// it keeps working, since environments hold their layers' digests and GC
// keeps what any environment references.
func (r *Registry) DeleteLayer(ctx context.Context, s string, live map[string][]string) error {
	ref, err := ParseRef(s, false)
	if err != nil {
		return err
	}
	l, err := r.GetLayer(ctx, ref.String())
	if err != nil {
		return err
	}
	users, err := r.layerUsers(ctx)
	if err != nil {
		return err
	}
	if u := users[l.Ref]; len(u) > 0 {
		return errdefs.New(errdefs.ErrConflict, api.CodeLayerInUse, "layer %s is used by environment%s %s",
			l.Ref, plural(len(u)), strings.Join(u, ", "))
	}
	if sb := live[l.Digest]; len(sb) > 0 {
		return errdefs.New(errdefs.ErrConflict, api.CodeLayerInUse, "layer %s is used by live sandbox%s %s",
			l.Ref, pluralES(len(sb)), strings.Join(sb, ", "))
	}
	all, err := r.st.List(ctx, layersPrefix)
	if err != nil {
		return fmt.Errorf("list layers: %w", err)
	}
	for _, kv := range all {
		if c, err := decodeLayer(kv); err == nil && c.Parent == l.Digest && c.Ref != l.Ref {
			return errdefs.New(errdefs.ErrConflict, api.CodeLayerInUse, "layer %s is the parent of diff layer %s", l.Ref, c.Ref)
		}
	}
	if err := r.st.Delete(ctx, layerKey(ref)); err != nil {
		return fmt.Errorf("delete layer %s: %w", l.Ref, err)
	}
	r.log.Info("layer deleted", "layer", l.Ref, "digest", l.Digest)
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func pluralES(n int) string {
	if n == 1 {
		return ""
	}
	return "es"
}
