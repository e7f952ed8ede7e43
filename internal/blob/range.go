package blob

import (
	"context"
	"io"

	"github.com/warrenhq/warren/internal/errdefs"
)

// RangeReader is implemented by stores that can read part of a blob without
// fetching the rest, which lazy loading of layer chunks relies on. Dir and
// S3 implement it; OpenRange below falls back to Open for stores that don't.
type RangeReader interface {
	// OpenRange returns up to n bytes of the blob starting at byte off:
	// fewer when the blob ends first, none when off is its size.
	// ErrNotFound if absent; ErrInvalid for a malformed digest, a negative
	// off or n, or off past the end.
	OpenRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error)
}

// OpenRange reads part of a blob from s: through s's own OpenRange when it
// has one, else by opening the whole blob and skipping to off (which costs
// reading off bytes). Its contract is RangeReader's.
func OpenRange(ctx context.Context, s Store, digest string, off, n int64) (io.ReadCloser, error) {
	if rr, ok := s.(RangeReader); ok {
		return rr.OpenRange(ctx, digest, off, n)
	}
	if err := checkRange(digest, off, n); err != nil {
		return nil, err
	}
	size, err := s.Stat(ctx, digest)
	if err != nil {
		return nil, err
	}
	if off > size {
		return nil, rangePastEnd(digest, off, size)
	}
	rc, err := s.Open(ctx, digest)
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, rc, off); err != nil {
		rc.Close()
		return nil, err
	}
	return readCloser{io.LimitReader(rc, n), rc}, nil
}

// checkRange validates OpenRange's arguments before any I/O.
func checkRange(digest string, off, n int64) error {
	if _, err := ParseDigest(digest); err != nil {
		return err
	}
	if off < 0 || n < 0 {
		return errdefs.New(errdefs.ErrInvalid, "invalid_range", "invalid range of blob %s: offset %d, length %d", digest, off, n)
	}
	return nil
}

func rangePastEnd(digest string, off, size int64) error {
	return errdefs.New(errdefs.ErrInvalid, "invalid_range", "offset %d is past the end of blob %s (%d bytes)", off, digest, size)
}

type readCloser struct {
	io.Reader
	io.Closer
}
