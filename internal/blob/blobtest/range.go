package blobtest

import (
	"bytes"
	"context"
	"io"
	"math"
	"testing"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

// testRange checks blob.OpenRange: through the store's own OpenRange when
// it has one, else through the fallback that reads from the start.
func testRange(t *testing.T, s blob.Store) {
	ctx := context.Background()
	content := []byte("0123456789abcdefghij")
	d := mustPut(t, s, content)
	empty := mustPut(t, s, nil)
	size := int64(len(content))

	for _, tc := range []struct {
		name   string
		digest string
		off, n int64
		want   []byte
	}{
		{"whole", d, 0, size, content},
		{"prefix", d, 0, 4, content[:4]},
		{"middle", d, 5, 5, content[5:10]},
		{"suffix", d, 15, 5, content[15:]},
		{"short at end", d, 15, 100, content[15:]},
		{"to end", d, 3, math.MaxInt64, content[3:]},
		{"whole, huge n", d, 0, math.MaxInt64, content},
		{"one byte", d, 19, 1, content[19:]},
		{"zero length", d, 7, 0, nil},
		{"at end", d, size, 10, nil},
		{"empty blob", empty, 0, 10, nil},
		{"empty blob, zero length", empty, 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := blob.OpenRange(ctx, s, tc.digest, tc.off, tc.n)
			if err != nil {
				t.Fatalf("OpenRange(%d, %d): %v", tc.off, tc.n, err)
			}
			defer rc.Close()
			got, err := io.ReadAll(rc)
			if err != nil {
				t.Fatalf("read range: %v", err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("OpenRange(%d, %d): got %q, want %q", tc.off, tc.n, got, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		name   string
		digest string
		off, n int64
		kind   error
	}{
		{"past end", d, size + 1, 1, errdefs.ErrInvalid},
		{"past end, zero length", d, size + 1, 0, errdefs.ErrInvalid},
		{"past end of empty blob", empty, 1, 1, errdefs.ErrInvalid},
		{"negative offset", d, -1, 1, errdefs.ErrInvalid},
		{"negative length", d, 0, -1, errdefs.ErrInvalid},
		{"bad digest", "sha256:nope", 0, 1, errdefs.ErrInvalid},
		{"missing", blob.FromBytes([]byte("never stored")), 0, 1, errdefs.ErrNotFound},
		{"missing, zero length", blob.FromBytes([]byte("never stored")), 0, 0, errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := blob.OpenRange(ctx, s, tc.digest, tc.off, tc.n)
			if err == nil {
				rc.Close()
			}
			wantKind(t, "OpenRange", err, tc.kind)
		})
	}
}
