package blob

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"
	"github.com/warrenhq/warren/internal/errdefs"
)

// S3Config says where an S3 store lives.
type S3Config struct {
	Endpoint  string // host:port, no scheme
	Bucket    string // must exist
	Prefix    string // key prefix inside the bucket, e.g. "warren/"; may be empty
	AccessKey string
	SecretKey string
	Region    string // empty: the server's default
	UseTLS    bool
	// MaxRetries bounds minio-go's retries of a failed request (with
	// backoff); 0 keeps its default of 10, which rides out a restarting
	// server but takes seconds to report one that is down.
	MaxRetries int
}

// S3 is a Store in an S3-compatible object store (AWS S3, SeaweedFS, Ceph
// RGW, MinIO...), for fleets that share no filesystem. Layout under the
// configured prefix:
//
//	sha256/<64 hex>   one object per blob
//	tmp/<id>          large blobs being written
//
// S3 makes an object visible only once its upload completes, but a blob's
// key is its digest, known only after the last byte. So Put reads a blob of
// up to 8 MiB into memory, hashes it, and uploads it straight
// to its final key in one PUT that carries the digest as
// x-amz-content-sha256 and Content-MD5: the server itself checks the
// content against the name before the object appears. A larger blob is
// streamed as a multipart upload (each part checked by its Content-MD5) to
// a temporary key while it is hashed, then copied server-side to its final
// key, and the temporary object removed. Either way a partial blob is never
// visible under sha256/. Layer chunks are a few MiB, so they take the
// single-PUT path.
//
// Uploads a crashed writer left under tmp/ are removed by NewS3 after a
// day; a bucket lifecycle rule that aborts incomplete multipart uploads is
// a good backstop.
type S3 struct {
	client *minio.Client
	bucket string
	prefix string

	// Tunables, changed by tests to reach the multipart paths with small blobs.
	singlePutMax int64  // largest blob sent in one PUT; <0 sends every blob through tmp/
	partSize     uint64 // multipart upload part size
	copyMax      int64  // largest single server-side copy; above it, a multipart copy
}

var (
	_ Store       = (*S3)(nil)
	_ RangeReader = (*S3)(nil)
)

const (
	// s3SinglePutMax bounds the memory one Put holds: layer chunks (1-4 MiB)
	// and manifests fit with room to spare.
	s3SinglePutMax = 8 << 20
	// s3PartSize: 10,000 parts (S3's limit) of 16 MiB allow 156 GiB blobs.
	s3PartSize = 16 << 20
	// s3CopyMax is S3's limit for one CopyObject.
	s3CopyMax = 5 << 30
)

// NewS3 connects to the bucket and removes day-old temporary uploads that
// crashed writers left behind. ErrInvalid for an incomplete config;
// ErrUnavailable if the server cannot be reached, refuses the credentials,
// or has no such bucket.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errdefs.Invalid("blob: s3 needs an endpoint and a bucket")
	}
	if strings.Contains(cfg.Endpoint, "://") {
		return nil, errdefs.Invalid("blob: s3 endpoint %q: want host:port without a scheme (UseTLS picks https)", cfg.Endpoint)
	}
	if err := s3utils.CheckValidBucketName(cfg.Bucket); err != nil {
		return nil, errdefs.Invalid("blob: s3 bucket %q: %v", cfg.Bucket, err)
	}
	opts := &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: cfg.UseTLS,
		Region: cfg.Region,
	}
	if cfg.MaxRetries > 0 {
		opts.MaxRetries = cfg.MaxRetries
	}
	client, err := minio.New(cfg.Endpoint, opts)
	if err != nil {
		return nil, errdefs.Invalid("blob: s3 endpoint %q: %v", cfg.Endpoint, err)
	}
	prefix := strings.Trim(cfg.Prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	s := &S3{
		client:       client,
		bucket:       cfg.Bucket,
		prefix:       prefix,
		singlePutMax: s3SinglePutMax,
		partSize:     s3PartSize,
		copyMax:      s3CopyMax,
	}
	ok, err := client.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, s.err(ctx, "open bucket", "", err)
	}
	if !ok {
		return nil, errdefs.New(errdefs.ErrUnavailable, "blob_store_unavailable", "blob: s3 bucket %q does not exist on %s", cfg.Bucket, cfg.Endpoint)
	}
	s.removeStaleTemp(ctx, staleTemp)
	return s, nil
}

func (s *S3) key(hexDigest string) string { return s.prefix + Algorithm + "/" + hexDigest }

func (s *S3) tmpPrefix() string { return s.prefix + "tmp/" }

// Put costs one HEAD, and for new content one PUT of up to singlePutMax
// bytes or, for a larger blob, a multipart upload, a server-side copy and a
// DELETE. Content already stored is detected after hashing and not sent.
func (s *S3) Put(ctx context.Context, r io.Reader) (string, int64, error) {
	src := &sourceReader{r: ContextReader(ctx, r)}
	limit := s.singlePutMax
	if limit < 0 {
		limit = 0
	}
	head, err := io.ReadAll(io.LimitReader(src, limit+1))
	if err != nil {
		return "", 0, fmt.Errorf("blob: put: %w", err)
	}
	if int64(len(head)) <= s.singlePutMax {
		return s.putSmall(ctx, head)
	}
	return s.putLarge(ctx, io.MultiReader(bytes.NewReader(head), src), src)
}

// putSmall uploads b straight to its final key in a single PUT the server
// verifies against the digest.
func (s *S3) putSmall(ctx context.Context, b []byte) (string, int64, error) {
	digest := FromBytes(b)
	h, _ := ParseDigest(digest)
	size := int64(len(b))
	if _, err := s.Stat(ctx, digest); err == nil {
		return digest, size, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return "", 0, err
	}
	sum := md5.Sum(b)
	core := minio.Core{Client: s.client}
	_, err := core.PutObject(ctx, s.bucket, s.key(h), bytes.NewReader(b), size,
		base64.StdEncoding.EncodeToString(sum[:]), h,
		// With a precomputed x-amz-content-sha256, no streaming signature.
		minio.PutObjectOptions{ContentType: "application/octet-stream", DisableContentSha256: true})
	if err != nil {
		return "", 0, s.err(ctx, "put", digest, err)
	}
	return digest, size, nil
}

// putLarge streams r to a temporary object while hashing it, then copies
// it to its final key. src is r's underlying source, whose own errors are
// reported as they are.
func (s *S3) putLarge(ctx context.Context, r io.Reader, src *sourceReader) (string, int64, error) {
	tmp := s.tmpPrefix() + fmt.Sprintf("put-%d-%s", time.Now().UnixNano(), rand.Text())
	// The temporary object goes even when ctx has ended.
	defer s.removeQuietly(ctx, tmp)

	dg := NewDigester()
	info, err := s.client.PutObject(ctx, s.bucket, tmp, io.TeeReader(r, dg), -1, minio.PutObjectOptions{
		ContentType:    "application/octet-stream",
		PartSize:       s.partSize,
		SendContentMd5: true,
	})
	if src.err != nil { // minio-go aborted the multipart upload
		return "", 0, fmt.Errorf("blob: put: %w", src.err)
	}
	if err != nil {
		return "", 0, s.err(ctx, "put", "", err)
	}
	digest := dg.Digest()
	h, _ := ParseDigest(digest)
	if _, err := s.Stat(ctx, digest); err == nil {
		return digest, info.Size, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return "", 0, err
	}
	dst := minio.CopyDestOptions{Bucket: s.bucket, Object: s.key(h)}
	srcOpts := minio.CopySrcOptions{Bucket: s.bucket, Object: tmp, MatchETag: info.ETag}
	if info.Size <= s.copyMax {
		_, err = s.client.CopyObject(ctx, dst, srcOpts)
	} else { // UploadPartCopy in parts of up to 5 GiB
		_, err = s.client.ComposeObject(ctx, dst, srcOpts)
	}
	if err != nil {
		return "", 0, s.err(ctx, "put: copy", digest, err)
	}
	return digest, info.Size, nil
}

func (s *S3) Open(ctx context.Context, digest string) (io.ReadCloser, error) {
	h, err := ParseDigest(digest)
	if err != nil {
		return nil, err
	}
	core := minio.Core{Client: s.client}
	rc, _, _, err := core.GetObject(ctx, s.bucket, s.key(h), minio.GetObjectOptions{})
	if err != nil {
		return nil, s.err(ctx, "open", digest, err)
	}
	return rc, nil
}

// OpenRange costs one ranged GET (and a HEAD when the range starts at or
// past the blob's end).
func (s *S3) OpenRange(ctx context.Context, digest string, off, n int64) (io.ReadCloser, error) {
	if err := checkRange(digest, off, n); err != nil {
		return nil, err
	}
	h, _ := ParseDigest(digest)
	if n == 0 { // S3 has no empty range: check the blob and the offset only.
		return s.emptyRange(ctx, digest, off)
	}
	var opts minio.GetObjectOptions
	if n <= math.MaxInt64-off {
		opts.SetRange(off, off+n-1)
	} else if off > 0 { // to the end
		opts.SetRange(off, 0)
	}
	core := minio.Core{Client: s.client}
	rc, _, _, err := core.GetObject(ctx, s.bucket, s.key(h), opts)
	if err != nil {
		if minio.ToErrorResponse(err).Code == "InvalidRange" {
			return s.emptyRange(ctx, digest, off)
		}
		return nil, s.err(ctx, "open", digest, err)
	}
	return rc, nil
}

// emptyRange returns an empty reader if off is the blob's size, and the
// classified error otherwise.
func (s *S3) emptyRange(ctx context.Context, digest string, off int64) (io.ReadCloser, error) {
	size, err := s.Stat(ctx, digest)
	if err != nil {
		return nil, err
	}
	if off > size {
		return nil, rangePastEnd(digest, off, size)
	}
	return io.NopCloser(bytes.NewReader(nil)), nil
}

func (s *S3) Stat(ctx context.Context, digest string) (int64, error) {
	h, err := ParseDigest(digest)
	if err != nil {
		return 0, err
	}
	info, err := s.client.StatObject(ctx, s.bucket, s.key(h), minio.StatObjectOptions{})
	if err != nil {
		return 0, s.err(ctx, "stat", digest, err)
	}
	return info.Size, nil
}

func (s *S3) Delete(ctx context.Context, digest string) error {
	h, err := ParseDigest(digest)
	if err != nil {
		return err
	}
	err = s.client.RemoveObject(ctx, s.bucket, s.key(h), minio.RemoveObjectOptions{})
	if err = s.err(ctx, "delete", digest, err); errors.Is(err, errdefs.ErrNotFound) {
		return nil // S3 says so only for versioned buckets
	}
	return err
}

// List pages through every key under sha256/ (1,000 a request). Keys that
// are not well-formed blob names are skipped.
func (s *S3) List(ctx context.Context) ([]string, error) {
	base := s.prefix + Algorithm + "/"
	out := []string{}
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: base, Recursive: true}) {
		if obj.Err != nil {
			return nil, s.err(ctx, "list", "", obj.Err)
		}
		digest := digestPrefix + strings.TrimPrefix(obj.Key, base)
		if _, err := ParseDigest(digest); err == nil {
			out = append(out, digest)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sort.Strings(out)
	return out, nil
}

// removeStaleTemp removes temporary objects and aborts multipart uploads
// under tmp/ older than age, best effort: another node may be writing the
// younger ones.
func (s *S3) removeStaleTemp(ctx context.Context, age time.Duration) {
	cutoff := time.Now().Add(-age)
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.tmpPrefix(), Recursive: true}) {
		if obj.Err != nil {
			break
		}
		if obj.LastModified.Before(cutoff) {
			s.client.RemoveObject(ctx, s.bucket, obj.Key, minio.RemoveObjectOptions{})
		}
	}
	core := minio.Core{Client: s.client}
	res, err := core.ListMultipartUploads(ctx, s.bucket, s.tmpPrefix(), "", "", "", 1000)
	if err != nil {
		return
	}
	for _, u := range res.Uploads {
		if u.Initiated.Before(cutoff) {
			core.AbortMultipartUpload(ctx, s.bucket, u.Key, u.UploadID)
		}
	}
}

func (s *S3) removeQuietly(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{})
}

// err classifies an error from minio-go: a missing key is ErrNotFound; a
// server that cannot be reached, is overloaded, refuses our credentials or
// lacks the bucket is ErrUnavailable (the store, not the caller, is at
// fault); an ended ctx is returned as is.
func (s *S3) err(ctx context.Context, op, digest string, err error) error {
	if err == nil {
		return nil
	}
	what := "blob: s3 " + op
	if digest != "" {
		what += " " + digest
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", what, ctxErr)
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		switch {
		case resp.Code == "NoSuchKey" || resp.Code == "NotFound" && resp.Key != "":
			return errdefs.New(errdefs.ErrNotFound, "blob_not_found", "blob %s not found", digest)
		case resp.Code == "NoSuchBucket",
			resp.Code == "AccessDenied", resp.Code == "InvalidAccessKeyId", resp.Code == "SignatureDoesNotMatch",
			resp.Code == "SlowDown", resp.StatusCode == 503, resp.StatusCode >= 500:
			return errdefs.New(errdefs.ErrUnavailable, "blob_store_unavailable", "%s: %v", what, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if unreachable(err) {
		return errdefs.New(errdefs.ErrUnavailable, "blob_store_unavailable", "%s: %v", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// unreachable reports whether err says the server could not be reached or
// dropped the connection.
func unreachable(err error) bool {
	var netErr net.Error
	var urlErr *url.Error
	return errors.As(err, &netErr) || errors.As(err, &urlErr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.ErrUnexpectedEOF)
}

// sourceReader remembers the first error of the reader given to Put, so
// that error is reported rather than what minio-go made of it.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF && s.err == nil {
		s.err = err
	}
	return n, err
}
