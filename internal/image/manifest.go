package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

// ChunkSize is the size of the chunk grid layers are cut into (see the
// package documentation for why 1 MiB).
const ChunkSize = 1 << 20

// BlockSize is the grain below the chunk: a manifest lists the digest of
// every 32 KiB block of each chunk, so that a node loading the layer on
// demand fetches (by ranged reads) and verifies only the blocks a read
// needs, not the whole 1 MiB chunk around them. A task that reads a few
// small files of its image would otherwise fetch ~1 MiB per file. Blocks
// of 32 KiB rather than 64 fetch 3% fewer bytes in bench/lazy (a block's
// worth at each end of a file read whole is the waste) at no cost to its
// burst's time; ranged reads still fetch adjacent blocks together.
const BlockSize = 32 << 10

// ManifestSchema identifies the manifest format; readers refuse others.
const ManifestSchema = "warren.layer.v1"

const (
	// maxManifest bounds a manifest read from the blob store: ~100 bytes
	// per chunk, so 64 MiB describes layers far beyond any real one.
	maxManifest  = 64 << 20
	minChunkSize = 4 << 10
	maxChunkSize = 64 << 20
)

// Manifest is the small blob that makes a layer: the EROFS image's digest
// and size, and the chunks it is cut into, in order. A node needs nothing
// but the manifest's digest and the blob store to assemble the image. Its
// JSON encoding is canonical (fixed field order, no extra space), so equal
// layers have equal manifest digests.
type Manifest struct {
	Schema string `json:"schema"` // ManifestSchema
	Kind   string `json:"kind"`
	// Parent is, for a diff layer, the manifest digest of the layer it
	// applies on; the parent is kept as long as the diff is.
	Parent string `json:"parent,omitempty"`
	Image  string `json:"image"` // sha256 of the whole EROFS image
	Size   int64  `json:"size"`  // of the EROFS image
	// ChunkSize is the grid: chunks are at most this long.
	ChunkSize int64 `json:"chunk_size"`
	// BlockSize, if set, is the size of the blocks whose digests each
	// chunk lists (Chunk.Blocks). Manifests written before blocks existed
	// have none (the encoding leaves both out, so their digests stand):
	// nodes load such layers a whole chunk at a time.
	BlockSize int64 `json:"block_size,omitempty"`
	// Extents are where the data of the image's larger files lies
	// ([offset, length], sorted, from ExtentMin up): a node loading the
	// layer on demand reads ahead within a file, never past its end into
	// the next file's bytes.
	Extents [][2]int64 `json:"extents,omitempty"`
	Chunks  []Chunk    `json:"chunks"`
}

// ExtentMin is the smallest file a manifest lists the extent of: smaller
// ones are read whole in one or two blocks, with no readahead to bound.
const ExtentMin = 128 << 10

// Chunk is one piece of a layer's image, stored as its own blob. Its
// offset in the image is the sum of the sizes before it.
type Chunk struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	// Blocks are the digests of the chunk's Manifest.BlockSize pieces, in
	// order (the last may be shorter).
	Blocks []string `json:"blocks,omitempty"`
}

// blockDigests returns the digests of b's pieces of size bs.
func blockDigests(b []byte, bs int64) []string {
	out := make([]string, 0, (int64(len(b))+bs-1)/bs)
	for off := int64(0); off < int64(len(b)); off += bs {
		out = append(out, blob.FromBytes(b[off:min(off+bs, int64(len(b)))]))
	}
	return out
}

// Encode returns the manifest's canonical JSON and its digest.
func (m *Manifest) Encode() ([]byte, string, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, "", err
	}
	return b, blob.FromBytes(b), nil
}

// Validate checks that the manifest is well formed: a known schema and
// kind, well-formed digests, chunks within the grid that add up to Size.
// ErrInvalid (code "invalid_manifest") otherwise.
func (m *Manifest) Validate() error {
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.ErrInvalid, "invalid_manifest", "layer manifest: "+format, args...)
	}
	if m.Schema != ManifestSchema {
		return bad("schema %q, want %q", m.Schema, ManifestSchema)
	}
	if err := validKind(m.Kind); err != nil {
		return bad("%v", err)
	}
	if m.Parent != "" {
		if _, err := blob.ParseDigest(m.Parent); err != nil {
			return bad("parent: %v", err)
		}
	}
	if _, err := blob.ParseDigest(m.Image); err != nil {
		return bad("image: %v", err)
	}
	if m.ChunkSize < minChunkSize || m.ChunkSize > maxChunkSize {
		return bad("chunk size %d out of range", m.ChunkSize)
	}
	if m.BlockSize != 0 && (m.BlockSize < minChunkSize || m.BlockSize > m.ChunkSize) {
		return bad("block size %d out of range", m.BlockSize)
	}
	var end int64
	for i, e := range m.Extents {
		if e[0] < end || e[1] <= 0 || e[0]+e[1] > m.Size {
			return bad("extent %d %v: out of order or past the image", i, e)
		}
		end = e[0] + e[1]
	}
	var total int64
	for i, c := range m.Chunks {
		if _, err := blob.ParseDigest(c.Digest); err != nil {
			return bad("chunk %d: %v", i, err)
		}
		if c.Size <= 0 || c.Size > m.ChunkSize {
			return bad("chunk %d: size %d out of range", i, c.Size)
		}
		switch {
		case m.BlockSize == 0 && len(c.Blocks) > 0:
			return bad("chunk %d: blocks without a block size", i)
		case m.BlockSize > 0 && int64(len(c.Blocks)) != (c.Size+m.BlockSize-1)/m.BlockSize:
			return bad("chunk %d: %d block digests for %d bytes in blocks of %d", i, len(c.Blocks), c.Size, m.BlockSize)
		}
		for j, b := range c.Blocks {
			if _, err := blob.ParseDigest(b); err != nil {
				return bad("chunk %d, block %d: %v", i, j, err)
			}
		}
		total += c.Size
	}
	if total != m.Size || m.Size <= 0 {
		return bad("chunks add up to %d bytes, image has %d", total, m.Size)
	}
	return nil
}

func validKind(k string) error {
	switch k {
	case api.LayerBase, api.LayerWorkspace, api.LayerToolkit, api.LayerDiff, api.LayerDisk:
		return nil
	}
	return errdefs.Invalid("layer kind %q: want base, workspace, toolkit, diff or disk", k)
}

// ReadManifest fetches, verifies and validates the manifest with digest.
// ErrNotFound (code "layer_not_found") if the blob store lacks it,
// ErrInvalid if it is not a well-formed manifest.
func ReadManifest(ctx context.Context, bs blob.Store, digest string) (Manifest, error) {
	var m Manifest
	if _, err := blob.ParseDigest(digest); err != nil {
		return m, err
	}
	rc, err := bs.Open(ctx, digest)
	if errors.Is(err, errdefs.ErrNotFound) {
		return m, errdefs.New(errdefs.ErrNotFound, api.CodeLayerNotFound, "layer manifest %s is not in the blob store", digest)
	}
	if err != nil {
		return m, fmt.Errorf("layer manifest %s: %w", digest, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(blob.Verify(blob.ContextReader(ctx, rc), digest), maxManifest+1))
	if err != nil {
		return m, fmt.Errorf("layer manifest %s: %w", digest, err)
	}
	return DecodeManifest(b, digest)
}

// DecodeManifest decodes and validates the manifest b, whose digest
// (already checked) names it in errors. ErrInvalid if it is not a
// well-formed manifest.
func DecodeManifest(b []byte, digest string) (Manifest, error) {
	var m Manifest
	if len(b) > maxManifest {
		return m, errdefs.New(errdefs.ErrInvalid, "invalid_manifest", "layer manifest %s: larger than %d bytes", digest, maxManifest)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, errdefs.New(errdefs.ErrInvalid, "invalid_manifest", "layer manifest %s: %v", digest, err)
	}
	if err := m.Validate(); err != nil {
		return m, fmt.Errorf("%s: %w", digest, err)
	}
	return m, nil
}

// chunkSizes cuts an image of size bytes on a grid of chunkSize, the grid
// restarting at every anchor: the start and end of the data of each large
// file. EROFS places a file's data at any block boundary, so the same file
// sits at a different offset modulo chunkSize in two images; anchoring
// makes it cut into the same chunks in both, which the blob store then
// holds once.
func chunkSizes(size, chunkSize int64, files []extent) []int64 {
	anchors := map[int64]bool{0: true, size: true}
	for _, e := range files {
		if e.off > 0 && e.off < size {
			anchors[e.off] = true
		}
		if end := e.off + e.len; end > 0 && end < size {
			anchors[end] = true
		}
	}
	points := make([]int64, 0, len(anchors))
	for a := range anchors {
		points = append(points, a)
	}
	slices.Sort(points)
	var out []int64
	for i := 0; i+1 < len(points); i++ {
		for off := points[i]; off < points[i+1]; off += chunkSize {
			out = append(out, min(chunkSize, points[i+1]-off))
		}
	}
	return out
}

// planManifest reads the EROFS image at path once and returns its
// manifest: the chunk grid (anchored on large files when the image can be
// parsed, plain otherwise) with every chunk's digest.
func planManifest(ctx context.Context, path, kind, parent string) (Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return Manifest{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Manifest{}, err
	}
	size := fi.Size()
	if size == 0 {
		return Manifest{}, errdefs.Invalid("layer image %s is empty", path)
	}
	m := Manifest{Schema: ManifestSchema, Kind: kind, Parent: parent, Size: size, ChunkSize: ChunkSize, BlockSize: BlockSize}
	var files []extent // the large files the grid is anchored on
	if ext, err := fileExtents(f, size, ExtentMin); err == nil {
		var end int64
		for _, e := range ext {
			if e.off < end || e.off+e.len > size {
				continue // shared or odd blocks: not bounded, not anchored on
			}
			end = e.off + e.len
			m.Extents = append(m.Extents, [2]int64{e.off, e.len})
			if e.len >= ChunkSize {
				files = append(files, e)
			}
		}
	} // else a plain grid is still a correct cut, just dedups less
	whole := blob.NewDigester()
	buf := make([]byte, ChunkSize)
	r := io.TeeReader(blob.ContextReader(ctx, f), whole)
	for _, n := range chunkSizes(size, ChunkSize, files) {
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return Manifest{}, fmt.Errorf("read layer image: %w", err)
		}
		m.Chunks = append(m.Chunks, Chunk{Digest: blob.FromBytes(buf[:n]), Size: n, Blocks: blockDigests(buf[:n], BlockSize)})
	}
	m.Image = whole.Digest()
	return m, m.Validate()
}

// OpenImage streams the EROFS image of the layer whose manifest has
// digest, chunk after chunk, each verified; the end of the stream is
// reported only after the whole image matched its digest (a mismatch is
// an ErrInvalid read error instead of io.EOF). For export and copies;
// nodes use Cache.Fetch.
func OpenImage(ctx context.Context, bs blob.Store, digest string) (io.ReadCloser, Manifest, error) {
	m, err := ReadManifest(ctx, bs, digest)
	if err != nil {
		return nil, m, err
	}
	r := &imageReader{ctx: ctx, bs: bs, chunks: m.Chunks, whole: blob.NewDigester(), want: m.Image}
	return r, m, nil
}

type imageReader struct {
	ctx    context.Context
	bs     blob.Store
	chunks []Chunk
	cur    io.ReadCloser
	src    io.Reader
	left   int64 // bytes the current chunk still owes
	whole  *blob.Digester
	want   string
}

func (r *imageReader) Read(p []byte) (int, error) {
	for {
		if r.src == nil {
			if len(r.chunks) == 0 {
				if got := r.whole.Digest(); got != r.want {
					return 0, errdefs.New(errdefs.ErrInvalid, "digest_mismatch", "layer image has digest %s, manifest says %s", got, r.want)
				}
				return 0, io.EOF
			}
			c := r.chunks[0]
			r.chunks = r.chunks[1:]
			rc, err := r.bs.Open(r.ctx, c.Digest)
			if errors.Is(err, errdefs.ErrNotFound) {
				return 0, errdefs.New(errdefs.ErrNotFound, api.CodeLayerNotFound, "chunk %s is not in the blob store", c.Digest)
			}
			if err != nil {
				return 0, err
			}
			r.cur, r.src, r.left = rc, blob.Verify(blob.ContextReader(r.ctx, rc), c.Digest), c.Size
		}
		n, err := r.src.Read(p)
		r.whole.Write(p[:n])
		r.left -= int64(n)
		if r.left < 0 {
			return 0, errdefs.New(errdefs.ErrInvalid, "digest_mismatch", "a chunk is longer than its manifest says")
		}
		if err == io.EOF {
			r.cur.Close()
			r.cur, r.src = nil, nil
			if r.left != 0 {
				return n, errdefs.New(errdefs.ErrInvalid, "digest_mismatch", "a chunk is shorter than its manifest says")
			}
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (r *imageReader) Close() error {
	if r.cur != nil {
		return r.cur.Close()
	}
	return nil
}
