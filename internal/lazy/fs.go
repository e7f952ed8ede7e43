// Package lazy serves a node's layers without downloading them first.
//
// Each layer appears as one read-only file on a FUSE filesystem (FS,
// go-fuse), <mount>/<manifest hex digest>.erofs, as big as the layer's
// EROFS image; the kernel mounts EROFS directly on that file (file-backed
// EROFS), and sandboxes read their layers through it. The filesystem is
// served by a process of its own beside the node agent (Serve, `warren
// lazyd`: see server.go), so sandboxes read on while the agent restarts.
// A read of the file is served from the node's cache (Cache), which
// fetches each piece the first time anyone reads it from the blob store,
// verified against its digest: a 32 KiB block of a chunk, by a ranged
// read (adjacent blocks missed together by one), when the layer's
// manifest lists block digests; else the whole chunk. Only the manifest
// must be local before the mount; a task that reads 5% of its image
// fetches not much more.
//
// Reads that cannot be served (the store unreachable after retries, a
// chunk whose bytes do not match its digest) fail with EIO: EROFS passes
// the error up, and the reading process sees EIO, never zeros. The next
// read tries again, so everything recovers when the store does.
//
// Every piece read and fetch is counted, for the node and for the layer
// whose read it was (a Meter per layer file): hits, misses, bytes fetched
// and written, and a fetch latency histogram. FS.Stats returns them as a
// plain snapshot, which the agent exports (Prometheus) and reports.
//
// A layer's first starts are recorded as a prefetch trace, the order
// its pieces were first read in, which later starts replay in the
// background on any node (trace.go).
//
// Chosen over the kernel's other paths on these hosts: EROFS's own
// on-demand mode (fscache, EROFS_FS_ONDEMAND) and ublk are not built into
// the kernel here; a FUSE file under file-backed EROFS needs nothing but
// fuse and erofs. The file is opened for direct I/O: EROFS keeps the
// pages it reads in its own page cache (a node mounts each layer once),
// so a second copy in the FUSE file's would only take memory, and the
// kernel's readahead on it would read past the end of the EROFS file
// being read, into bytes no one asked for (bench/lazy: 8% of what a
// burst fetched). EROFS's own readahead stops at its files' ends.
package lazy

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Chunk is one piece of a layer's image, a blob of its own.
type Chunk struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	// Blocks, if any, are the digests of the chunk's Layer.BlockSize
	// pieces: reads then fetch (ranged) and verify only the blocks they
	// need. Without them a chunk is fetched whole.
	Blocks []string `json:"blocks,omitempty"`
}

// Layer is one layer's image as a lazy filesystem serves it: the manifest
// (image.Manifest) with what the reads need.
type Layer struct {
	Digest    string  `json:"digest"` // the manifest's
	Size      int64   `json:"size"`   // of the image
	BlockSize int64   `json:"block_size,omitempty"`
	Chunks    []Chunk `json:"chunks"`
	// Extents are where the image's larger files lie ([offset, length],
	// sorted): readahead stays within the file being read.
	Extents [][2]int64 `json:"extents,omitempty"`
	// Trace, if set, is the digest of a prefetch trace blob of the layer
	// (Trace) to replay in the background; a layer added without one
	// has its first reads recorded into one (trace.go).
	Trace string `json:"trace,omitempty"`
}

// FS is the lazy layer filesystem of a node.
type FS struct {
	dir    string
	cache  *Cache
	server *fuse.Server
	root   *fs.Inode

	window time.Duration // of a trace's recording; 0: none recorded
	log    *slog.Logger
	closed chan struct{} // closed by Close: replays stop

	mu     sync.Mutex
	layers map[string]*layerFile // by file name
	ino    uint64
	ready  []Trace // recorded, not acknowledged yet (trace.go)
}

// MountOption configures Mount.
type MountOption func(*FS)

// WithTraceWindow sets how long a layer's reads are recorded into its
// prefetch trace from the first (default DefaultTraceWindow); 0 or less
// records none.
func WithTraceWindow(d time.Duration) MountOption {
	return func(f *FS) { f.window = max(d, 0) }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) MountOption { return func(f *FS) { f.log = l } }

// readAhead bounds how many bytes past a read are fetched with it when
// the reads of a file go forward piece after piece (a sequential read):
// the window starts at 64 KiB and doubles with each read in a row that
// goes on from the last, as the kernel's own readahead does, up to
// 512 KiB. It stops at the end of the file being read, by the manifest's
// extents: past it, the image's next bytes belong to other files (with
// an unbounded 2 MiB window, bench/lazy's tasks fetched 1.5x the bytes of
// the files they read). Where the manifest lists extents, a read outside
// them (a small file, EROFS's metadata) reads nothing ahead: small files
// next to each other in the image are rarely read together. Random reads
// fetch only what they read: a task reads 5-10% of its image.
const readAhead = 512 << 10

// Mount mounts an empty lazy filesystem on dir (made if missing), its
// reads served through cache.
func Mount(dir string, cache *Cache, options ...MountOption) (*FS, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f := &FS{dir: dir, cache: cache, layers: map[string]*layerFile{}, ino: 1, window: DefaultTraceWindow, log: slog.Default(), closed: make(chan struct{})}
	for _, o := range options {
		o(f)
	}
	rootNode := &fs.Inode{}
	second := time.Second
	// Names and sizes never change once added: the kernel may cache them.
	opts := &fs.Options{
		EntryTimeout:    &second,
		AttrTimeout:     &second,
		NegativeTimeout: new(time.Duration),
		MountOptions: fuse.MountOptions{
			FsName:        "warren-lazy",
			Name:          "warren",
			DirectMount:   true,
			MaxReadAhead:  128 << 10, // only EROFS's metadata reads go through the page cache (Open: direct I/O)
			MaxWrite:      1 << 20,   // also the largest read the kernel asks for
			MaxBackground: 64,
			DisableXAttrs: true,
			// Passthrough would mark the filesystem stacked, and EROFS
			// refuses to mount files of stacked filesystems.
			DisabledCapabilities: fuse.CAP_PASSTHROUGH,
		},
	}
	server, err := fs.Mount(dir, rootNode, opts)
	if err != nil {
		return nil, fmt.Errorf("mount the lazy layer filesystem on %s: %w", dir, err)
	}
	f.server, f.root = server, rootNode
	return f, nil
}

// Dir is where the filesystem is mounted.
func (f *FS) Dir() string { return f.dir }

// Cache is the chunk cache the filesystem reads through.
func (f *FS) Cache() *Cache { return f.cache }

// Add makes the layer whose manifest has digest appear, as a file of
// size bytes cut into chunks, and returns the file's path. Adding a
// layer already there returns its path. With a Trace, the trace is
// replayed in the background (once per layer file; a bad trace is
// ignored); without, the file's first reads are recorded into one.
func (f *FS) Add(l Layer) (string, error) {
	digest, size := l.Digest, l.Size
	h, err := blob.ParseDigest(digest)
	if err != nil {
		return "", err
	}
	pieces, offs, err := cut(l)
	if err != nil {
		return "", err
	}
	name := h + ".erofs"
	f.mu.Lock()
	defer f.mu.Unlock()
	lf := f.layers[name]
	if lf == nil {
		f.ino++
		lf = &layerFile{fs: f, digest: digest, name: name, size: size, blockSize: l.BlockSize, pieces: pieces, offs: offs, extents: validExtents(l.Extents, size)}
		lf.last.Store(-2)
		if l.Trace == "" && f.window > 0 {
			lf.rec.Store(&recording{})
		}
		ch := f.root.NewPersistentInode(context.Background(), lf, fs.StableAttr{Mode: fuse.S_IFREG, Ino: f.ino})
		f.root.AddChild(name, ch, false)
		f.layers[name] = lf
	}
	if l.Trace != "" && lf.replayed.CompareAndSwap(false, true) {
		// A trace came after all: no need for another, unless its
		// file is being read already.
		if r := lf.rec.Load(); r != nil && !r.started() {
			lf.rec.CompareAndSwap(r, nil)
		}
		go f.replay(lf, l.Trace)
	}
	return f.Path(digest)
}

// cut checks a layer's chunk list and returns the pieces its reads fetch
// (its blocks, or its chunks if it lists no blocks) with their offsets.
func cut(l Layer) ([]Piece, []int64, error) {
	bad := func(format string, args ...any) error {
		return errdefs.Invalid("layer %s: "+format, append([]any{l.Digest}, args...)...)
	}
	if l.BlockSize < 0 || l.BlockSize > maxChunk {
		return nil, nil, bad("block size %d", l.BlockSize)
	}
	var pieces []Piece
	var offs []int64
	var total int64
	for i, c := range l.Chunks {
		if c.Size <= 0 || c.Size > maxChunk {
			return nil, nil, bad("chunk %d of %d bytes", i, c.Size)
		}
		if _, err := blob.ParseDigest(c.Digest); err != nil {
			return nil, nil, bad("chunk %d: %v", i, err)
		}
		switch {
		case l.BlockSize == 0 || len(c.Blocks) == 0:
			pieces = append(pieces, Piece{Digest: c.Digest, Size: c.Size})
			offs = append(offs, total)
		case int64(len(c.Blocks)) != (c.Size+l.BlockSize-1)/l.BlockSize:
			return nil, nil, bad("chunk %d: %d blocks for %d bytes", i, len(c.Blocks), c.Size)
		default:
			for j, d := range c.Blocks {
				if _, err := blob.ParseDigest(d); err != nil {
					return nil, nil, bad("chunk %d, block %d: %v", i, j, err)
				}
				off := int64(j) * l.BlockSize
				pieces = append(pieces, Piece{Digest: d, Size: min(l.BlockSize, c.Size-off), Chunk: c.Digest, Off: off})
				offs = append(offs, total+off)
			}
		}
		total += c.Size
	}
	if total != l.Size {
		return nil, nil, bad("chunks add up to %d bytes, not %d", total, l.Size)
	}
	return pieces, offs, nil
}

// validExtents returns the extents that are sorted, disjoint and within
// the image, dropping others (they only bound readahead).
func validExtents(ext [][2]int64, size int64) [][2]int64 {
	var out [][2]int64
	var end int64
	for _, e := range ext {
		if e[0] >= end && e[1] > 0 && e[0]+e[1] <= size {
			out = append(out, e)
			end = e[0] + e[1]
		}
	}
	return out
}

// extentAt returns the extent holding offset off, if one does.
func (l *layerFile) extentAt(off int64) ([2]int64, bool) {
	i := sort.Search(len(l.extents), func(i int) bool { return l.extents[i][0] > off }) - 1
	if i >= 0 && off < l.extents[i][0]+l.extents[i][1] {
		return l.extents[i], true
	}
	return [2]int64{}, false
}

// Path is where the layer of manifest digest appears (added or not).
func (f *FS) Path(digest string) (string, error) {
	h, err := blob.ParseDigest(digest)
	if err != nil {
		return "", err
	}
	return f.dir + "/" + h + ".erofs", nil
}

// Remove makes a layer's file disappear (mounts of it read on), and its
// share of the cache's totals with it (Stats).
func (f *FS) Remove(digest string) {
	h, err := blob.ParseDigest(digest)
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.layers, h+".erofs")
	f.root.RmChild(h + ".erofs")
}

// maxLayerStats bounds the layers FS.Stats reports: one scrape's series
// stay bounded however many layers a long-lived node has served.
const maxLayerStats = 256

// Stats returns the cache's totals and the layers' shares of them: for
// each layer on the filesystem, the reads of its file and the fetches
// they caused. At most maxLayerStats layers are reported, the most
// recently read first; layers never read come last, with zeros (so a
// counter exists before its first increment). A layer's share goes with
// its file (Remove). It costs a lock of the filesystem and one sort.
func (f *FS) Stats() Stats {
	st := f.cache.Stats()
	type read struct {
		l  *layerFile
		at int64 // loaded once: reads go on meanwhile
	}
	f.mu.Lock()
	ls := make([]read, 0, len(f.layers))
	for _, l := range f.layers {
		ls = append(ls, read{l, l.lastRead.Load()})
	}
	f.mu.Unlock()
	sort.Slice(ls, func(i, j int) bool {
		if ls[i].at != ls[j].at {
			return ls[i].at > ls[j].at
		}
		return ls[i].l.digest < ls[j].l.digest
	})
	st.Layers = make([]LayerStats, 0, min(len(ls), maxLayerStats))
	for _, r := range ls[:min(len(ls), maxLayerStats)] {
		st.Layers = append(st.Layers, LayerStats{Digest: r.l.digest, Counts: r.l.meter.Counts()})
	}
	return st
}

// Close unmounts the filesystem: lazy layers mounted on it fail their
// reads from then on.
func (f *FS) Close() error {
	select {
	case <-f.closed:
	default:
		close(f.closed)
	}
	err := f.server.Unmount()
	if err != nil && strings.Contains(err.Error(), "busy") {
		// Layers are still mounted on it: detach it (they fail reads).
		err = syscall.Unmount(f.dir, syscall.MNT_DETACH)
	}
	return err
}

// layerFile is one layer's image.
type layerFile struct {
	fs.Inode
	fs        *FS
	digest    string // the layer's manifest digest
	name      string
	size      int64
	blockSize int64        // the layer's (Layer.BlockSize)
	pieces    []Piece      // what reads fetch: blocks, or whole chunks
	offs      []int64      // each piece's offset in the image
	extents   [][2]int64   // the larger files' data, sorted (Layer.Extents)
	last      atomic.Int64 // the last piece read, for readahead
	streak    atomic.Int64 // reads in a row that went on from the last
	lastFile  atomic.Int64 // the extent of the last read (its offset; -1: none)
	meter     Meter        // the layer's share of the cache's totals
	lastRead  atomic.Int64 // unix nanoseconds, for Stats' order
	traceState
}

var (
	_ fs.NodeGetattrer = (*layerFile)(nil)
	_ fs.NodeOpener    = (*layerFile)(nil)
	_ fs.NodeReader    = (*layerFile)(nil)
)

func (l *layerFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = fuse.S_IFREG | 0o444
	out.Size = uint64(l.size)
	out.Blocks = (uint64(l.size) + 511) / 512
	out.Blksize = 4096
	return 0
}

func (l *layerFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	// Direct I/O: every read reaches Read as EROFS asked for it, not
	// widened by the kernel's readahead on this file (see the package
	// documentation).
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (l *layerFile) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= l.size || len(dest) == 0 {
		return fuse.ReadResultData(nil), 0
	}
	l.lastRead.Store(time.Now().UnixNano())
	n := min(int64(len(dest)), l.size-off)
	dest = dest[:n]
	first := sort.Search(len(l.offs), func(i int) bool { return l.offs[i] > off }) - 1
	end := first
	for end < len(l.pieces) && l.offs[end] < off+n {
		end++
	}
	if r := l.rec.Load(); r != nil && r.record(l, first, end) {
		l.fs.endTrace(l, r)
	}
	// The pieces of one read are fetched at once (adjacent blocks by one
	// ranged read); when reads go forward piece after piece, the next
	// readAhead bytes with them.
	// A read in another file than the last (by the extents) starts over:
	// the kernel's readahead past a file's end is no reason to read on.
	ext, inExt := l.extentAt(off)
	file := int64(-1)
	if inExt {
		file = ext[0]
	}
	prev := l.last.Swap(int64(end - 1))
	if prevFile := l.lastFile.Swap(file); (prev+1 != int64(first) && prev != int64(first)) || prevFile != file {
		l.streak.Store(0)
	} else if streak := l.streak.Add(1); (inExt || len(l.extents) == 0) && !l.fs.cache.Has(l.pieces[first].Digest) {
		window := int64(readAhead) >> max(0, 4-streak) // 64 KiB, 128 KiB, 256 KiB, 512 KiB
		limit := off + n + window
		if inExt {
			limit = min(limit, ext[0]+ext[1]) // not into the next file
		}
		ahead := end
		for ahead < len(l.pieces) && l.offs[ahead] < limit {
			ahead++
		}
		l.fs.cache.Prefetch(&l.meter, l.pieces[first:ahead]...)
	}
	if err := l.fs.cache.Ensure(ctx, &l.meter, l.pieces[first:end]...); err != nil {
		return nil, syscall.EIO
	}
	for i := first; i < end; i++ {
		p := l.pieces[i]
		lo := max(off, l.offs[i])
		hi := min(off+n, l.offs[i]+p.Size)
		if err := l.fs.cache.read(ctx, &l.meter, p, dest[lo-off:hi-off], lo-l.offs[i]); err != nil {
			return nil, syscall.EIO
		}
	}
	return fuse.ReadResultData(dest), 0
}
