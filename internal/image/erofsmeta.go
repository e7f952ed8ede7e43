package image

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
)

// What chunking needs of the EROFS on-disk format (erofs_fs.h): where the
// data blocks of each regular file are. Only the uncompressed layouts that
// BuildEROFS produces are read; anything else is an error and chunking
// falls back to the plain grid.
const (
	erofsSuperOffset = 1024
	erofsMagic       = 0xE0F5E1E2

	erofsLayoutFlatPlain  = 0
	erofsLayoutFlatInline = 2

	erofsFTRegFile = 1
	erofsFTDir     = 2

	erofsDirentSize = 12
	// erofsMaxInodes bounds the walk, against a crafted image that loops.
	erofsMaxInodes = 50_000_000
)

// extent is a byte range of an image: [off, off+len).
type extent struct{ off, len int64 }

// erofsInode is what the walk reads of an on-disk inode.
type erofsInode struct {
	nid      uint64
	layout   int
	size     int64
	blkaddr  int64
	inlineAt int64 // where inline tail data starts (FLAT_INLINE)
}

// fileExtents returns the data extents of the regular files in the EROFS
// image r of the given size whose data spans at least minLen bytes of
// whole blocks, sorted by offset. Hard links are reported once.
func fileExtents(r io.ReaderAt, size, minLen int64) ([]extent, error) {
	sb := make([]byte, 128)
	if _, err := r.ReadAt(sb, erofsSuperOffset); err != nil {
		return nil, fmt.Errorf("erofs superblock: %w", err)
	}
	le := binary.LittleEndian
	if le.Uint32(sb[0:]) != erofsMagic {
		return nil, errors.New("erofs superblock: bad magic")
	}
	blkbits := sb[12]
	if blkbits < 9 || blkbits > 16 {
		return nil, fmt.Errorf("erofs superblock: block size 2^%d", blkbits)
	}
	w := &erofsWalker{
		r:       r,
		size:    size,
		blksz:   int64(1) << blkbits,
		metaOff: int64(le.Uint32(sb[40:])) << blkbits,
		seen:    map[uint64]bool{},
	}
	if err := w.dir(uint64(le.Uint16(sb[14:])), minLen, 0); err != nil {
		return nil, err
	}
	sort.Slice(w.out, func(i, j int) bool { return w.out[i].off < w.out[j].off })
	return w.out, nil
}

type erofsWalker struct {
	r        io.ReaderAt
	size     int64
	blksz    int64
	metaOff  int64
	seen     map[uint64]bool
	dirBytes int64 // directory data read so far
	out      []extent
}

func (w *erofsWalker) inode(nid uint64) (erofsInode, error) {
	if w.metaOff < 0 || w.metaOff > w.size || nid >= uint64(w.size-w.metaOff)/32 {
		return erofsInode{}, fmt.Errorf("erofs inode %d: out of the image", nid)
	}
	off := w.metaOff + int64(nid)*32
	var b [64]byte
	if off+32 > w.size {
		return erofsInode{}, fmt.Errorf("erofs inode %d: out of the image", nid)
	}
	n, err := w.r.ReadAt(b[:], off)
	if n < 32 {
		return erofsInode{}, fmt.Errorf("erofs inode %d: %w", nid, err)
	}
	le := binary.LittleEndian
	format := le.Uint16(b[0:])
	ino := erofsInode{nid: nid, layout: int(format>>1) & 7}
	isize := int64(32)
	if format&1 == 1 { // extended
		if n < 64 {
			return erofsInode{}, fmt.Errorf("erofs inode %d: truncated", nid)
		}
		isize = 64
		ino.size = int64(le.Uint64(b[8:]))
	} else {
		ino.size = int64(le.Uint32(b[8:]))
	}
	ino.blkaddr = int64(le.Uint32(b[16:]))
	xattrs := int64(0)
	if c := int64(le.Uint16(b[2:])); c > 0 {
		xattrs = 12 + 4*(c-1)
	}
	ino.inlineAt = off + isize + xattrs
	if ino.size < 0 {
		return erofsInode{}, fmt.Errorf("erofs inode %d: negative size", nid)
	}
	return ino, nil
}

// blocks returns the extent of the inode's whole data blocks.
func (w *erofsWalker) blocks(ino erofsInode) (extent, error) {
	var n int64
	switch ino.layout {
	case erofsLayoutFlatPlain:
		n = (ino.size + w.blksz - 1) / w.blksz
	case erofsLayoutFlatInline:
		n = ino.size / w.blksz
	default:
		return extent{}, fmt.Errorf("erofs inode %d: data layout %d is not supported", ino.nid, ino.layout)
	}
	e := extent{off: ino.blkaddr * w.blksz, len: n * w.blksz}
	if n > 0 && (e.off < 0 || e.off+e.len > w.size) {
		return extent{}, fmt.Errorf("erofs inode %d: data out of the image", ino.nid)
	}
	return e, nil
}

// read returns the inode's whole content (directories only: small).
func (w *erofsWalker) read(ino erofsInode) ([]byte, error) {
	if ino.size > 64<<20 || ino.size > w.size {
		return nil, fmt.Errorf("erofs directory %d: %d bytes", ino.nid, ino.size)
	}
	e, err := w.blocks(ino)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, ino.size)
	full := min(e.len, ino.size)
	if full > 0 {
		if _, err := w.r.ReadAt(buf[:full], e.off); err != nil {
			return nil, err
		}
	}
	if tail := ino.size - full; tail > 0 {
		if ino.inlineAt+tail > w.size {
			return nil, fmt.Errorf("erofs inode %d: inline data out of the image", ino.nid)
		}
		if _, err := w.r.ReadAt(buf[full:], ino.inlineAt); err != nil {
			return nil, err
		}
	}
	return buf, nil
}

func (w *erofsWalker) dir(nid uint64, minLen int64, depth int) error {
	if depth > 4096 {
		return errors.New("erofs: directories nested too deep")
	}
	if w.seen[nid] {
		return nil
	}
	w.seen[nid] = true
	if len(w.seen) > erofsMaxInodes {
		return errors.New("erofs: too many inodes")
	}
	ino, err := w.inode(nid)
	if err != nil {
		return err
	}
	// A well-formed image's directories hold far less than the image; a
	// crafted one could point many directories at the same blocks.
	if w.dirBytes += ino.size; w.dirBytes > w.size {
		return errors.New("erofs: more directory data than the image holds")
	}
	data, err := w.read(ino)
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	for blk := int64(0); blk < int64(len(data)); blk += w.blksz {
		b := data[blk:min(blk+w.blksz, int64(len(data)))]
		if len(b) < erofsDirentSize {
			return fmt.Errorf("erofs directory %d: short block", nid)
		}
		count := int(le.Uint16(b[8:])) / erofsDirentSize
		if count == 0 || count*erofsDirentSize > len(b) {
			return fmt.Errorf("erofs directory %d: bad dirent count", nid)
		}
		for i := range count {
			d := b[i*erofsDirentSize:]
			child, ftype := le.Uint64(d[0:]), d[10]
			nameoff := int(le.Uint16(d[8:]))
			end := len(b)
			if i+1 < count {
				end = int(le.Uint16(d[erofsDirentSize+8:]))
			}
			if nameoff > end || end > len(b) {
				return fmt.Errorf("erofs directory %d: bad name offset", nid)
			}
			name := b[nameoff:end]
			for j, c := range name {
				if c == 0 {
					name = name[:j]
					break
				}
			}
			if string(name) == "." || string(name) == ".." {
				continue
			}
			switch ftype {
			case erofsFTDir:
				if err := w.dir(child, minLen, depth+1); err != nil {
					return err
				}
			case erofsFTRegFile:
				if w.seen[child] {
					continue
				}
				w.seen[child] = true
				f, err := w.inode(child)
				if err != nil {
					return err
				}
				e, err := w.blocks(f)
				if err != nil {
					return err
				}
				if e.len >= minLen {
					w.out = append(w.out, e)
				}
			}
		}
	}
	return nil
}
