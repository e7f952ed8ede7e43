package blob_test

import (
	"testing"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/blob/blobtest"
)

// plainStore hides a store's OpenRange, so the suite checks blob.OpenRange's
// fallback for stores without one.
type plainStore struct{ blob.Store }

func TestOpenRangeFallback(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		d, err := blob.NewDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return plainStore{d}
	})
}
