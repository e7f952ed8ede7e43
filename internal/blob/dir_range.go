package blob

import (
	"context"
	"io"
	"os"
)

var _ RangeReader = (*Dir)(nil)

// OpenRange reads n bytes at off straight from the blob's file.
func (d *Dir) OpenRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	if err := checkRange(digest, off, n); err != nil {
		return nil, err
	}
	p, _ := d.Path(digest)
	f, err := os.Open(p)
	if err != nil {
		return nil, d.fsErr("open", digest, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, d.fsErr("stat", digest, err)
	}
	if off > fi.Size() {
		f.Close()
		return nil, rangePastEnd(digest, off, fi.Size())
	}
	return readCloser{io.NewSectionReader(f, off, n), f}, nil
}
