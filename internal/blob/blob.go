// Package blob is the content-addressed store that layers live in: a
// directory (local disk, or a distributed filesystem mount such as CephFS,
// JuiceFS or 3FS, so one directory serves a whole fleet) or an
// S3-compatible object store. Open picks one from a spec, as the server
// roles' --blobs flag gives it. Every store passes the suite in blobtest.
package blob

import (
	"context"
	"io"
)

// Store holds immutable blobs named by the sha256 of their content,
// "sha256:<64 hex>". Errors: errdefs.ErrNotFound, errdefs.ErrInvalid (a
// malformed digest, or content that does not match the expected digest).
type Store interface {
	// Put stores r and returns its digest and size. Storing content that is
	// already there is cheap and not an error. A partially written blob is
	// never visible.
	Put(ctx context.Context, r io.Reader) (digest string, size int64, err error)
	// Open returns the blob's content; ErrNotFound if absent.
	Open(ctx context.Context, digest string) (io.ReadCloser, error)
	// Stat returns the blob's size; ErrNotFound if absent.
	Stat(ctx context.Context, digest string) (int64, error)
	// Delete removes the blob; deleting an absent blob is not an error.
	Delete(ctx context.Context, digest string) error
	// List returns every digest in the store.
	List(ctx context.Context) ([]string, error)
}
