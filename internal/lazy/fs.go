// Package lazy serves a node's layers without downloading them first.
//
// Each layer appears as one read-only file on a FUSE filesystem the node
// agent serves (FS, go-fuse), <mount>/<manifest hex digest>.erofs, as big
// as the layer's EROFS image; the kernel mounts EROFS directly on that
// file (file-backed EROFS), and sandboxes read their layers through it. A
// read of the file is served from the node's chunk cache (Cache), which
// fetches each chunk the first time anyone reads it, from the blob store,
// verified against the chunk's digest. Only the manifest (the chunk list)
// must be local before the mount; a task that reads 5% of its image
// fetches about that much.
//
// Reads that cannot be served (the store unreachable after retries, a
// chunk whose bytes do not match its digest) fail with EIO: EROFS passes
// the error up, and the reading process sees EIO, never zeros. The next
// read tries again, so everything recovers when the store does.
//
// Chosen over the kernel's other paths on these hosts: EROFS's own
// on-demand mode (fscache, EROFS_FS_ONDEMAND) and ublk are not built into
// the kernel here; a FUSE file under file-backed EROFS needs nothing but
// fuse and erofs, and the kernel's page cache of the FUSE file absorbs
// repeated reads (the file never changes: its pages are kept across
// opens).
package lazy

import (
	"context"
	"fmt"
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
	Digest string
	Size   int64
}

// FS is the lazy layer filesystem of a node.
type FS struct {
	dir    string
	cache  *Cache
	server *fuse.Server
	root   *fs.Inode

	mu     sync.Mutex
	layers map[string]*layerFile // by file name
	ino    uint64
}

// readAhead is how many chunks past a missed one are fetched in the
// background when the reads of a file go forward chunk after chunk (a
// sequential read, as the kernel's own readahead decides). Random reads
// fetch only what they read: a task reads 5-10% of its image.
const readAhead = 2

// Mount mounts an empty lazy filesystem on dir (made if missing), its
// reads served through cache.
func Mount(dir string, cache *Cache) (*FS, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f := &FS{dir: dir, cache: cache, layers: map[string]*layerFile{}, ino: 1}
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
			MaxReadAhead:  1 << 20,
			MaxWrite:      1 << 20, // also the largest read the kernel asks for
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
// layer already there returns its path.
func (f *FS) Add(digest string, size int64, chunks []Chunk) (string, error) {
	h, err := blob.ParseDigest(digest)
	if err != nil {
		return "", err
	}
	var total int64
	offs := make([]int64, len(chunks))
	for i, c := range chunks {
		if c.Size <= 0 || c.Size > maxChunk {
			return "", errdefs.Invalid("layer %s: chunk %d of %d bytes", digest, i, c.Size)
		}
		if _, err := blob.ParseDigest(c.Digest); err != nil {
			return "", errdefs.Invalid("layer %s: chunk %d: %v", digest, i, err)
		}
		offs[i] = total
		total += c.Size
	}
	if total != size {
		return "", errdefs.Invalid("layer %s: chunks add up to %d bytes, not %d", digest, total, size)
	}
	name := h + ".erofs"
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.layers[name] == nil {
		f.ino++
		lf := &layerFile{fs: f, name: name, size: size, chunks: chunks, offs: offs}
		lf.last.Store(-2)
		ch := f.root.NewPersistentInode(context.Background(), lf, fs.StableAttr{Mode: fuse.S_IFREG, Ino: f.ino})
		f.root.AddChild(name, ch, false)
		f.layers[name] = lf
	}
	return f.Path(digest)
}

// Path is where the layer of manifest digest appears (added or not).
func (f *FS) Path(digest string) (string, error) {
	h, err := blob.ParseDigest(digest)
	if err != nil {
		return "", err
	}
	return f.dir + "/" + h + ".erofs", nil
}

// Remove makes a layer's file disappear (mounts of it read on).
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

// Close unmounts the filesystem: lazy layers mounted on it fail their
// reads from then on.
func (f *FS) Close() error {
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
	fs     *FS
	name   string
	size   int64
	chunks []Chunk
	offs   []int64      // each chunk's offset
	last   atomic.Int64 // the last chunk read, for readahead
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
	// The file never changes: the kernel keeps its pages across opens.
	return nil, fuse.FOPEN_KEEP_CACHE, 0
}

func (l *layerFile) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= l.size || len(dest) == 0 {
		return fuse.ReadResultData(nil), 0
	}
	n := min(int64(len(dest)), l.size-off)
	dest = dest[:n]
	first := sort.Search(len(l.offs), func(i int) bool { return l.offs[i] > off }) - 1
	prev := l.last.Load()
	var wg sync.WaitGroup
	errs := make(chan error, len(l.chunks)-first)
	for i := first; i < len(l.chunks) && l.offs[i] < off+n; i++ {
		c := l.chunks[i]
		lo := max(off, l.offs[i])
		hi := min(off+n, l.offs[i]+c.Size)
		missed := !l.fs.cache.Has(c.Digest)
		wg.Add(1)
		go func() { // the chunks of one read are fetched at once
			defer wg.Done()
			if err := l.fs.cache.ReadAt(ctx, c.Digest, c.Size, dest[lo-off:hi-off], lo-l.offs[i]); err != nil {
				errs <- err
			}
		}()
		if missed && int64(i) == prev+1 {
			for j := i + 1; j <= i+readAhead && j < len(l.chunks); j++ {
				l.fs.cache.Prefetch(l.chunks[j].Digest, l.chunks[j].Size)
			}
		}
		prev = int64(i)
	}
	l.last.Store(prev)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest), 0
}
