package blob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"strings"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Algorithm is the only digest algorithm warren uses.
const Algorithm = "sha256"

const digestPrefix = Algorithm + ":"

// ParseDigest checks that d is "sha256:" followed by 64 lowercase hex
// digits and returns the hex part. Anything else is ErrInvalid, so a digest
// from a request can be used to build a path without further checks.
func ParseDigest(d string) (hexPart string, err error) {
	h, ok := strings.CutPrefix(d, digestPrefix)
	if !ok || len(h) != 2*sha256.Size {
		return "", errdefs.New(errdefs.ErrInvalid, "invalid_digest", "invalid digest %q: want sha256:<64 lowercase hex digits>", d)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", errdefs.New(errdefs.ErrInvalid, "invalid_digest", "invalid digest %q: want sha256:<64 lowercase hex digits>", d)
		}
	}
	return h, nil
}

// FromBytes returns the digest of b.
func FromBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return digestPrefix + hex.EncodeToString(sum[:])
}

// Digester hashes what is written to it; Digest returns the result.
type Digester struct{ h hash.Hash }

// NewDigester returns an empty Digester.
func NewDigester() *Digester { return &Digester{h: sha256.New()} }

func (d *Digester) Write(p []byte) (int, error) { return d.h.Write(p) }

// Digest returns the digest of everything written so far.
func (d *Digester) Digest() string { return digestPrefix + hex.EncodeToString(d.h.Sum(nil)) }

// Verify returns a reader that yields r's content and, instead of io.EOF,
// an ErrInvalid if that content does not hash to digest. Consumers that
// commit only after a clean EOF (Store.Put, the node's layer cache) thus
// never keep corrupt or substituted content. A malformed digest fails the
// first Read.
func Verify(r io.Reader, digest string) io.Reader {
	_, err := ParseDigest(digest)
	return &verifier{r: r, want: digest, d: NewDigester(), err: err}
}

type verifier struct {
	r    io.Reader
	want string
	d    *Digester
	err  error // sticky
}

func (v *verifier) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.r.Read(p)
	v.d.Write(p[:n])
	if err == io.EOF {
		if got := v.d.Digest(); got != v.want {
			err = errdefs.New(errdefs.ErrInvalid, "digest_mismatch", "content has digest %s, want %s", got, v.want)
		}
	}
	if err != nil {
		v.err = err
	}
	return n, err
}

// PutExpected stores r in s only if its content has the expected digest,
// and returns its size. Content already in s is not read again. A mismatch
// is ErrInvalid and leaves nothing behind.
func PutExpected(ctx context.Context, s Store, digest string, r io.Reader) (int64, error) {
	if _, err := ParseDigest(digest); err != nil {
		return 0, err
	}
	if size, err := s.Stat(ctx, digest); err == nil {
		return size, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return 0, err
	}
	got, size, err := s.Put(ctx, Verify(r, digest))
	if err != nil {
		return 0, err
	}
	if got != digest { // only a store that ignores read errors gets here
		return 0, errdefs.New(errdefs.ErrInvalid, "digest_mismatch", "stored %s, want %s", got, digest)
	}
	return size, nil
}
