package oci

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Source formats.
const (
	FormatDockerArchive = "docker-archive" // `docker save` tarball
	FormatOCILayout     = "oci-layout"     // OCI image layout (a directory, or a tar of one)
	FormatQCOW2         = "qcow2"          // a whole disk image, for the vm backend
)

// refAnnotation names an image in an OCI layout's index.
const refAnnotation = "org.opencontainers.image.ref.name"

// Bounds on the metadata of an archive, which go-containerregistry reads
// whole into memory: a 10 GiB "manifest.json" must not be.
const (
	maxMetaBytes      = 8 << 20 // one manifest, index or config
	maxArchiveEntries = 1 << 16 // entries in a docker-archive or layout tar
	maxLinkHops       = 8       // symlinks followed to a docker-archive file
	maxIndexDepth     = 4       // nested indexes in a layout
	maxDescriptors    = 4096    // manifests listed across a layout's indexes
)

// Image is an image opened for import.
type Image struct {
	Layers []Layer   // bottom first
	Config v1.Config // Env, WorkingDir, User, Entrypoint, Cmd, ...
	// Tag is the tag the archive gives the image ("1.0" for "app:1.0"),
	// "" if none.
	Tag string
	// ID is the digest of the image's config ("sha256:..."), what docker
	// calls the image ID.
	ID string
}

// OpenDockerArchive opens the `docker save` tarball at file. ref picks
// one image ("app:1.0") when the archive holds several. Layers are read
// from file when Flatten asks for them, so it must stay until then.
// ErrInvalid (code "invalid_image") for anything wrong with the archive.
func OpenDockerArchive(file, ref string, lim Limits) (*Image, error) {
	entries, err := scanArchive(file)
	if err != nil {
		return nil, err
	}
	m, ok := entries["manifest.json"]
	if !ok {
		return nil, invalidImage("docker-archive has no manifest.json (is it an OCI layout? use %s)", FormatOCILayout)
	}
	if m.Size > maxMetaBytes {
		return nil, invalidImage("docker-archive manifest.json is larger than %d bytes", maxMetaBytes)
	}
	opener := func() (io.ReadCloser, error) { return os.Open(file) }
	manifest, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, invalidImage("docker-archive manifest.json: %v", err)
	}
	if len(manifest) == 0 {
		return nil, invalidImage("docker-archive holds no image")
	}
	desc, tag, err := pickArchiveImage(manifest, ref)
	if err != nil {
		return nil, err
	}
	if lim.MaxLayers > 0 && len(desc.Layers) > lim.MaxLayers {
		return nil, tooLarge("image has %d layers, more than the limit of %d", len(desc.Layers), lim.MaxLayers)
	}
	// Bound what go-containerregistry will read whole (the config) and
	// how often it rescans the archive to follow links.
	for i, p := range append([]string{desc.Config}, desc.Layers...) {
		h, err := resolveArchivePath(entries, p)
		if err != nil {
			return nil, err
		}
		if i == 0 && h.Size > maxMetaBytes {
			return nil, invalidImage("docker-archive config %s is larger than %d bytes", p, maxMetaBytes)
		}
	}
	var t *name.Tag
	if len(manifest) > 1 {
		nt, err := name.NewTag(tag)
		if err != nil {
			return nil, invalidImage("docker-archive tag %q: %v", tag, err)
		}
		t = &nt
	}
	img, err := tarball.Image(opener, t)
	if err != nil {
		return nil, invalidImage("docker-archive: %v", err)
	}
	out, err := fromV1(img, lim)
	if err != nil {
		return nil, err
	}
	if tag != "" {
		if nt, err := name.NewTag(tag); err == nil {
			out.Tag = nt.TagStr()
		}
	}
	return out, nil
}

// pickArchiveImage chooses the image ref names, or the only one.
func pickArchiveImage(m tarball.Manifest, ref string) (tarball.Descriptor, string, error) {
	if ref == "" {
		if len(m) != 1 {
			var tags []string
			for _, d := range m {
				tags = append(tags, d.RepoTags...)
			}
			return tarball.Descriptor{}, "", invalidImage("docker-archive holds %d images: name one of %q", len(m), tags)
		}
		tag := ""
		if len(m[0].RepoTags) > 0 {
			tag = m[0].RepoTags[0]
		}
		return m[0], tag, nil
	}
	want, err := name.NewTag(ref)
	if err != nil {
		return tarball.Descriptor{}, "", errdefs.Invalid("image reference %q: %v", ref, err)
	}
	for _, d := range m {
		for _, t := range d.RepoTags {
			if got, err := name.NewTag(t); err == nil && got.Name() == want.Name() {
				return d, t, nil
			}
		}
	}
	return tarball.Descriptor{}, "", errdefs.New(errdefs.ErrNotFound, "image_not_found", "docker-archive has no image %q", ref)
}

// scanArchive reads the headers of the tar at file (skipping contents).
func scanArchive(file string) (map[string]*tar.Header, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries := map[string]*tar.Header{}
	tr := tar.NewReader(f)
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return nil, invalidImage("docker-archive is not a readable tar: %v", err)
		}
		if n >= maxArchiveEntries {
			return nil, tooLarge("docker-archive has more than %d entries", maxArchiveEntries)
		}
		entries[path.Clean(h.Name)] = h
	}
	if len(entries) == 0 {
		return nil, invalidImage("docker-archive is empty or not a tar")
	}
	return entries, nil
}

// resolveArchivePath follows links from p the way go-containerregistry
// does, to the regular file it names.
func resolveArchivePath(entries map[string]*tar.Header, p string) (*tar.Header, error) {
	cur := path.Clean(p)
	for hop := 0; hop <= maxLinkHops; hop++ {
		h, ok := entries[cur]
		if !ok {
			return nil, invalidImage("docker-archive has no file %s", p)
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeRegA:
			return h, nil
		case tar.TypeSymlink, tar.TypeLink:
			cur = path.Join(path.Dir(cur), path.Clean(h.Linkname))
		default:
			return nil, invalidImage("docker-archive: %s is not a file", p)
		}
	}
	return nil, invalidImage("docker-archive: %s: more than %d links to follow", p, maxLinkHops)
}

// OpenLayout opens the OCI image layout in dir. ref picks an image by its
// "org.opencontainers.image.ref.name" annotation ("1.0", or a full
// reference ending in ":1.0"); without it the layout must hold one image,
// or one for this platform (linux/GOARCH) in a multi-platform index. The
// layout's blobs are read when Flatten asks for them.
func OpenLayout(dir, ref string, lim Limits) (*Image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, invalidImage("oci-layout: %v", err)
	}
	if err := checkLayoutFile(dir); err != nil {
		return nil, err
	}
	if err := checkSize(filepath.Join(dir, "index.json"), "index.json"); err != nil {
		return nil, err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, invalidImage("oci-layout: %v", err)
	}
	var cands []candidate
	if err := collect(dir, idx, "", 0, &cands); err != nil {
		return nil, err
	}
	c, err := pickLayoutImage(cands, ref)
	if err != nil {
		return nil, err
	}
	if err := checkBlob(dir, c.desc.Digest, "manifest"); err != nil {
		return nil, err
	}
	img, err := c.index.Image(c.desc.Digest)
	if err != nil {
		return nil, invalidImage("oci-layout: %v", err)
	}
	mf, err := img.Manifest()
	if err != nil {
		return nil, invalidImage("oci-layout: manifest: %v", err)
	}
	if lim.MaxLayers > 0 && len(mf.Layers) > lim.MaxLayers {
		return nil, tooLarge("image has %d layers, more than the limit of %d", len(mf.Layers), lim.MaxLayers)
	}
	if err := checkBlob(dir, mf.Config.Digest, "config"); err != nil {
		return nil, err
	}
	out, err := fromV1(img, lim)
	if err != nil {
		return nil, err
	}
	out.Tag = tagOf(c.ref)
	return out, nil
}

type candidate struct {
	index v1.ImageIndex
	desc  v1.Descriptor
	ref   string
}

// collect lists the image manifests under idx, descending into nested
// indexes; ref is the nearest ref.name annotation above.
func collect(dir string, idx v1.ImageIndex, ref string, level int, out *[]candidate) error {
	if level > maxIndexDepth {
		return invalidImage("oci-layout: indexes nested more than %d deep", maxIndexDepth)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return invalidImage("oci-layout: index: %v", err)
	}
	for _, d := range im.Manifests {
		if len(*out) >= maxDescriptors {
			return tooLarge("oci-layout lists more than %d manifests", maxDescriptors)
		}
		r := ref
		if a := d.Annotations[refAnnotation]; a != "" {
			r = a
		}
		switch d.MediaType {
		case types.OCIManifestSchema1, types.DockerManifestSchema2:
			*out = append(*out, candidate{index: idx, desc: d, ref: r})
		case types.OCIImageIndex, types.DockerManifestList:
			if err := checkBlob(dir, d.Digest, "index"); err != nil {
				return err
			}
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return invalidImage("oci-layout: %v", err)
			}
			if err := collect(dir, child, r, level+1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

func pickLayoutImage(cands []candidate, ref string) (candidate, error) {
	if ref != "" {
		var match []candidate
		for _, c := range cands {
			if c.ref == ref || tagOf(c.ref) == ref {
				match = append(match, c)
			}
		}
		if len(match) == 0 {
			return candidate{}, errdefs.New(errdefs.ErrNotFound, "image_not_found", "oci-layout has no image %q", ref)
		}
		cands = match
	}
	if len(cands) > 1 {
		// A multi-platform index, or one with attestations
		// (platform unknown/unknown): keep what runs here.
		var here []candidate
		for _, c := range cands {
			if p := c.desc.Platform; p != nil && p.OS == "linux" && p.Architecture == runtime.GOARCH {
				here = append(here, c)
			}
		}
		if len(here) > 0 {
			cands = here
		}
	}
	switch len(cands) {
	case 0:
		return candidate{}, invalidImage("oci-layout holds no image")
	case 1:
		return cands[0], nil
	}
	var refs []string
	for _, c := range cands {
		refs = append(refs, c.ref)
	}
	slices.Sort(refs)
	return candidate{}, invalidImage("oci-layout holds %d images: name one of %q", len(cands), slices.Compact(refs))
}

// tagOf returns the tag in a ref.name annotation: "1.0" for "1.0" and for
// "docker.io/library/app:1.0".
func tagOf(ref string) string {
	if strings.Contains(ref, "@") {
		return "" // a digest reference
	}
	if i := strings.LastIndexAny(ref, ":/"); i >= 0 {
		if ref[i] != ':' {
			return ""
		}
		return ref[i+1:]
	}
	return ref
}

func checkLayoutFile(dir string) error {
	if err := checkSize(filepath.Join(dir, "oci-layout"), "oci-layout"); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(dir, "oci-layout"))
	if err != nil {
		return invalidImage("oci-layout: %v", err)
	}
	if !strings.Contains(string(b), "imageLayoutVersion") {
		return invalidImage("oci-layout: the oci-layout file has no imageLayoutVersion")
	}
	return nil
}

// checkBlob bounds a metadata blob before go-containerregistry reads it.
func checkBlob(dir string, h v1.Hash, what string) error {
	return checkSize(filepath.Join(dir, "blobs", h.Algorithm, h.Hex), what+" "+h.String())
}

func checkSize(p, what string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return invalidImage("oci-layout: %s is missing", what)
	}
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return invalidImage("oci-layout: %s is not a regular file", what)
	}
	if fi.Size() > maxMetaBytes {
		return invalidImage("oci-layout: %s is larger than %d bytes", what, maxMetaBytes)
	}
	return nil
}

// fromV1 reads what import needs of img.
func fromV1(img v1.Image, lim Limits) (*Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, invalidImage("config: %v", err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return nil, invalidImage("image is for %s, not linux", cf.OS)
	}
	id, err := img.ConfigName()
	if err != nil {
		return nil, invalidImage("config: %v", err)
	}
	ls, err := img.Layers()
	if err != nil {
		return nil, invalidImage("layers: %v", err)
	}
	if lim.MaxLayers > 0 && len(ls) > lim.MaxLayers {
		return nil, tooLarge("image has %d layers, more than the limit of %d", len(ls), lim.MaxLayers)
	}
	out := &Image{Config: cf.Config, ID: id.String()}
	for _, l := range ls {
		out.Layers = append(out.Layers, l)
	}
	return out, nil
}

// UnpackLayout extracts a tar of an OCI image layout from r into the
// existing empty directory dir. A layout is directories and regular files
// only: links, devices and names that climb out of dir are ErrInvalid, so
// nothing go-containerregistry later opens in dir can lead outside it.
// Past maxBytes of content or maxArchiveEntries entries, ErrInvalid (code
// "image_too_large").
func UnpackLayout(r io.Reader, dir string, maxBytes int64) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			if n == 0 {
				return invalidImage("oci-layout archive is empty")
			}
			return nil
		}
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return invalidImage("oci-layout archive: %v", err)
		}
		if n >= maxArchiveEntries {
			return tooLarge("oci-layout archive has more than %d entries", maxArchiveEntries)
		}
		rel, err := cleanName(h.Name)
		if err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeXGlobalHeader:
		case tar.TypeDir:
			if rel != "." {
				if err := root.MkdirAll(rel, 0o755); err != nil {
					return invalidImage("oci-layout archive: %v", err)
				}
			}
		case tar.TypeReg, tar.TypeRegA:
			if maxBytes > 0 && total+h.Size > maxBytes {
				return tooLarge("oci-layout archive holds more than %d bytes", maxBytes)
			}
			total += h.Size
			if err := unpackFile(root, rel, tr); err != nil {
				return err
			}
		default:
			return badEntry(h.Name, "an OCI layout holds only directories and regular files")
		}
	}
}

func unpackFile(root *os.Root, rel string, r io.Reader) error {
	if d := path.Dir(rel); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return invalidImage("oci-layout archive: %v", err)
		}
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return invalidImage("oci-layout archive: %v", err)
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return invalidImage("oci-layout archive: %s is cut short", rel)
	}
	if err != nil {
		return fmt.Errorf("oci-layout archive: %w", err)
	}
	return nil
}
