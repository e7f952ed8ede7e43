package blob_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/blob/blobtest"
	"github.com/warrenhq/warren/internal/blob/s3test"
	"github.com/warrenhq/warren/internal/errdefs"
)

// TestS3 runs the conformance suite and the S3 store's own tests against
// one real S3 server (starting one takes seconds). Gated: see package
// s3test.
func TestS3(t *testing.T) {
	srv := s3test.Start(t)
	for _, tt := range []struct {
		name string
		fn   func(t *testing.T, srv *s3test.Server, bucket string)
	}{
		{"Conformance", testS3Conformance},
		{"ConformanceMultipart", testS3ConformanceMultipart},
		{"LargePaths", testS3LargePaths},
		{"FailedLargePutCleansUp", testS3FailedLargePutCleansUp},
		{"ServerVerifiesDigest", testS3ServerVerifiesDigest},
		{"EmptyPrefixAndStrays", testS3EmptyPrefixAndStrays},
		{"RemovesStaleTemp", testS3RemovesStaleTemp},
		{"Misconfigured", testS3Misconfigured},
		{"ServerGone", testS3ServerGone},
	} {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, srv, srv.NewBucket(t)) })
	}
}

// testS3Conformance gives each subtest of the suite its own prefix.
func testS3Conformance(t *testing.T, srv *s3test.Server, bucket string) {
	blobtest.Run(t, newS3Store(srv, bucket, nil))
}

// testS3ConformanceMultipart runs the suite with every blob sent through a
// temporary object, as blobs over 8 MiB are.
func testS3ConformanceMultipart(t *testing.T, srv *s3test.Server, bucket string) {
	blobtest.Run(t, newS3Store(srv, bucket, func(s *blob.S3) { blob.SetS3Limits(s, -1, 5<<20, 5<<30) }))
}

var prefixes atomic.Int64

func newS3Store(srv *s3test.Server, bucket string, tune func(*blob.S3)) func(t *testing.T) blob.Store {
	return func(t *testing.T) blob.Store {
		prefix := "t" + string(rune('a'+prefixes.Add(1)%26)) + "/" + strings.ReplaceAll(t.Name(), "/", "-")
		s, err := blob.NewS3(context.Background(), srv.Config(bucket, prefix))
		if err != nil {
			t.Fatal(err)
		}
		if tune != nil {
			tune(s)
		}
		return s
	}
}

// testS3LargePaths puts blobs larger than the (lowered) single-PUT limit,
// part size and single-copy limit, and checks content, and that nothing is
// left under tmp/.
func testS3LargePaths(t *testing.T, srv *s3test.Server, bucket string) {
	ctx := context.Background()
	s, err := blob.NewS3(ctx, srv.Config(bucket, "large"))
	if err != nil {
		t.Fatal(err)
	}
	content := make([]byte, 12<<20+5)
	rand.New(rand.NewSource(2)).Read(content)
	for _, tc := range []struct {
		name                  string
		singlePutMax, copyMax int64
	}{
		{"single put", 16 << 20, 5 << 30},
		{"multipart upload, copy", 1 << 20, 5 << 30},
		{"multipart upload, multipart copy", 1 << 20, 6 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob.SetS3Limits(s, tc.singlePutMax, 5<<20, tc.copyMax)
			d, size, err := s.Put(ctx, bytes.NewReader(content))
			if err != nil {
				t.Fatalf("Put: %v", err)
			}
			if want := blob.FromBytes(content); d != want || size != int64(len(content)) {
				t.Fatalf("Put: got %s (%d bytes), want %s (%d bytes)", d, size, want, len(content))
			}
			rc, err := s.Open(ctx, d)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, content) {
				t.Fatalf("Open: %d bytes, %v; want the %d bytes put", len(got), err, len(content))
			}
			rc, err = blob.OpenRange(ctx, s, d, 6<<20, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			got, _ = io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(got, content[6<<20:7<<20]) {
				t.Fatalf("OpenRange: wrong %d bytes", len(got))
			}
			wantNoTemp(t, srv, bucket, "large/")
			if err := s.Delete(ctx, d); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// testS3FailedLargePutCleansUp: a source that breaks in the middle of a
// multipart upload leaves no blob, no temporary object and no pending
// upload behind.
func testS3FailedLargePutCleansUp(t *testing.T, srv *s3test.Server, bucket string) {
	ctx := context.Background()
	s, err := blob.NewS3(ctx, srv.Config(bucket, "broken"))
	if err != nil {
		t.Fatal(err)
	}
	blob.SetS3Limits(s, 1<<20, 5<<20, 5<<30)
	broken := io.MultiReader(bytes.NewReader(make([]byte, 11<<20)), iotestErrReader{errors.New("source broke")})
	if _, _, err := s.Put(ctx, broken); err == nil || !strings.Contains(err.Error(), "source broke") {
		t.Fatalf("Put from a broken source: got %v, want its error", err)
	}
	if l, err := s.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("List: got %v, %v; want none", l, err)
	}
	wantNoTemp(t, srv, bucket, "broken/")
}

type iotestErrReader struct{ err error }

func (r iotestErrReader) Read([]byte) (int, error) { return 0, r.err }

func wantNoTemp(t *testing.T, srv *s3test.Server, bucket, prefix string) {
	t.Helper()
	ctx := context.Background()
	for obj := range srv.Client().ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix + "tmp/", Recursive: true}) {
		t.Errorf("left under tmp/: %s %v", obj.Key, obj.Err)
	}
	core := minio.Core{Client: srv.Client()}
	res, err := core.ListMultipartUploads(ctx, bucket, prefix, "", "", "", 1000)
	if err != nil {
		t.Logf("list multipart uploads: %v", err)
		return
	}
	for _, u := range res.Uploads {
		t.Errorf("multipart upload left pending: %s", u.Key)
	}
}

// testS3ServerVerifiesDigest: the single PUT names the content's sha256 in
// its signed x-amz-content-sha256, and the server refuses content that does
// not match it, so a blob corrupted on the wire never lands under a digest.
func testS3ServerVerifiesDigest(t *testing.T, srv *s3test.Server, bucket string) {
	ctx := context.Background()
	sum := sha256.Sum256([]byte("claimed"))
	core := minio.Core{Client: srv.Client()}
	_, err := core.PutObject(ctx, bucket, "sha256/"+hex.EncodeToString(sum[:]), strings.NewReader("swapped"), 7, "", hex.EncodeToString(sum[:]),
		minio.PutObjectOptions{DisableContentSha256: true})
	if err == nil {
		t.Fatal("server accepted content that does not match x-amz-content-sha256")
	}
	t.Logf("server refused: %v", err)
}

func testS3EmptyPrefixAndStrays(t *testing.T, srv *s3test.Server, bucket string) {
	ctx := context.Background()
	s, err := blob.NewS3(ctx, srv.Config(bucket, ""))
	if err != nil {
		t.Fatal(err)
	}
	d, _, err := s.Put(ctx, strings.NewReader("no prefix"))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"sha256/README", "sha256/" + strings.Repeat("A", 64), "other/x"} {
		if _, err := srv.Client().PutObject(ctx, bucket, key, strings.NewReader("x"), 1, minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if l, err := s.List(ctx); err != nil || len(l) != 1 || l[0] != d {
		t.Fatalf("List: got %v, %v; want [%s]", l, err, d)
	}
	if _, err := srv.Client().StatObject(ctx, bucket, "sha256/"+strings.TrimPrefix(d, "sha256:"), minio.StatObjectOptions{}); err != nil {
		t.Fatalf("blob not at sha256/<hex>: %v", err)
	}
}

func testS3RemovesStaleTemp(t *testing.T, srv *s3test.Server, bucket string) {
	ctx := context.Background()
	s, err := blob.NewS3(ctx, srv.Config(bucket, "p"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client().PutObject(ctx, bucket, "p/tmp/put-crashed", strings.NewReader("x"), 1, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	core := minio.Core{Client: srv.Client()}
	if _, err := core.NewMultipartUpload(ctx, bucket, "p/tmp/put-crashed-multipart", minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, err := core.ListMultipartUploads(ctx, bucket, "p/tmp/", "", "", "", 1000); err != nil || len(res.Uploads) != 1 {
		t.Fatalf("ListMultipartUploads: got %v, %v; want the one just begun", res.Uploads, err)
	}
	blob.RemoveStaleS3Temp(ctx, s, time.Hour)
	if _, err := srv.Client().StatObject(ctx, bucket, "p/tmp/put-crashed", minio.StatObjectOptions{}); err != nil {
		t.Fatalf("young temporary object (maybe another node's write) removed: %v", err)
	}
	blob.RemoveStaleS3Temp(ctx, s, 0)
	wantNoTemp(t, srv, bucket, "p/")
}

func testS3Misconfigured(t *testing.T, srv *s3test.Server, bucket string) {
	ctx := context.Background()

	cfg := srv.Config("no-such-bucket", "")
	_, err := blob.NewS3(ctx, cfg)
	wantS3Kind(t, "NewS3(missing bucket)", err, errdefs.ErrUnavailable)

	cfg = srv.Config(bucket, "")
	cfg.SecretKey = "wrong"
	cfg.MaxRetries = 1
	_, err = blob.NewS3(ctx, cfg)
	wantS3Kind(t, "NewS3(wrong secret)", err, errdefs.ErrUnavailable)
}

// TestS3Unreachable needs no server: a store whose server is down says
// ErrUnavailable, not ErrNotFound or a bare network error.
func TestS3Unreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	ctx := context.Background()
	cfg := blob.S3Config{Endpoint: addr, Bucket: "bucket", AccessKey: "k", SecretKey: "s", MaxRetries: 1}
	start := time.Now()
	_, err = blob.NewS3(ctx, cfg)
	wantS3Kind(t, "NewS3(nothing listening)", err, errdefs.ErrUnavailable)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("NewS3 took %v to give up with MaxRetries 1", d)
	}

	for _, cfg := range []blob.S3Config{{Bucket: "bucket"}, {Endpoint: addr}, {Endpoint: "http://" + addr, Bucket: "bucket"}, {Endpoint: addr, Bucket: "b"}} {
		_, err := blob.NewS3(ctx, cfg)
		wantS3Kind(t, "NewS3(incomplete config)", err, errdefs.ErrInvalid)
	}
}

// testS3ServerGone: operations on a store whose server has stopped are
// ErrUnavailable.
func testS3ServerGone(t *testing.T, srv *s3test.Server, bucket string) {
	ctx := context.Background()
	p := startProxy(t, srv.Endpoint)
	cfg := srv.Config(bucket, "")
	cfg.Endpoint = p.addr()
	cfg.MaxRetries = 1
	s, err := blob.NewS3(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, _, err := s.Put(ctx, strings.NewReader("before the cut"))
	if err != nil {
		t.Fatal(err)
	}
	p.cut()
	_, err = s.Stat(ctx, d)
	wantS3Kind(t, "Stat", err, errdefs.ErrUnavailable)
	_, err = s.Open(ctx, d)
	wantS3Kind(t, "Open", err, errdefs.ErrUnavailable)
	_, _, err = s.Put(ctx, strings.NewReader("after the cut"))
	wantS3Kind(t, "Put", err, errdefs.ErrUnavailable)
	_, err = s.List(ctx)
	wantS3Kind(t, "List", err, errdefs.ErrUnavailable)
	wantS3Kind(t, "Delete", s.Delete(ctx, d), errdefs.ErrUnavailable)
}

// proxy forwards TCP connections to a server until cut, which stands in
// for the network failing: it closes the listener and every connection.
type proxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l}
	t.Cleanup(p.cut)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go io.Copy(up, c)
			go io.Copy(c, up)
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) cut() {
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func wantS3Kind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got %v, want %v", what, err, kind)
	}
}
