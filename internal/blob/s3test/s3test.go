// Package s3test runs a real S3-compatible server for tests: SeaweedFS's
// `weed mini` (master, volume, filer and S3 gateway in one process) on
// loopback, in a temporary directory, with signature-checked credentials.
//
// weed is built from the Go module proxy at WeedVersion by scripts/build-weed
// (several minutes on two cores, so it is cached). The tests that need it
// are gated: they run when WARREN_TEST_S3=1 and fail then if weed is
// missing; otherwise they skip, even under WARREN_TEST_STRICT=1.
// Benchmarks start one with Run, also inside a network namespace of their
// own (a store across a link with the bandwidth and latency they set).
package s3test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/warrenhq/warren/internal/blob"
)

// WeedVersion is the seaweedfs module version scripts/build-weed builds.
// Keep the two in step.
const WeedVersion = "v0.0.0-20261109003541-7506e5f91cd6"

// DefaultWeed is where scripts/build-weed installs weed.
var DefaultWeed = "/var/cache/warren/weed/" + WeedVersion + "/weed"

const (
	accessKey = "warren-test"
	secretKey = "warren-test-secret"
)

// Server is a running weed with one admin identity.
type Server struct {
	Endpoint  string // host:port, plain HTTP
	AccessKey string
	SecretKey string
	client    *minio.Client
	stop      func()
}

// Enabled reports whether the S3 tests are meant to run (WARREN_TEST_S3=1).
func Enabled() bool { return os.Getenv("WARREN_TEST_S3") == "1" }

// Weed returns the weed binary to run: $WARREN_WEED, else DefaultWeed, else
// weed on PATH; "" if there is none.
func Weed() string {
	if p := os.Getenv("WARREN_WEED"); p != "" {
		return p
	}
	if _, err := os.Stat(DefaultWeed); err == nil {
		return DefaultWeed
	}
	if p, err := exec.LookPath("weed"); err == nil {
		return p
	}
	return ""
}

// Start starts weed for t and stops it when t ends. It skips t unless the
// S3 tests are enabled, and fails t if they are but weed is missing or does
// not come up.
func Start(t testing.TB) *Server {
	t.Helper()
	if !Enabled() {
		t.Skip("S3 tests are gated: set WARREN_TEST_S3=1 after scripts/build-weed")
	}
	s, err := Run(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Options say where a weed started by Run lives.
type Options struct {
	// Dir holds its data, configuration and log (weed.log); it must exist.
	Dir string
	// Netns, if set, is a named network namespace (ip netns) weed runs in,
	// listening on IP there; otherwise it listens on free ports of the
	// host's loopback.
	Netns, IP string
	// Volumes bounds the 64 MB volumes weed may make: what it can hold
	// (default 16, 1 GB).
	Volumes int
}

// Run starts weed as opts say and waits until it serves (up to 90 s).
// Stop ends it; so does the death of this process.
func Run(opts Options) (*Server, error) {
	bin := Weed()
	if bin == "" {
		return nil, fmt.Errorf("no weed: run scripts/build-weed, or set WARREN_WEED to a weed binary")
	}
	dir := opts.Dir
	cfg := fmt.Sprintf(`{"identities":[{"name":"warren","credentials":[{"accessKey":%q,"secretKey":%q}],"actions":["Admin","Read","List","Tagging","Write"]}]}`, accessKey, secretKey)
	cfgPath := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		return nil, err
	}

	volumes := opts.Volumes
	if volumes <= 0 {
		volumes = 16
	}
	ip, ports := "127.0.0.1", []string{}
	if opts.Netns != "" {
		// The namespace is weed's own: fixed ports.
		ip = opts.IP
		for p := range 9 {
			ports = append(ports, strconv.Itoa(18330+p))
		}
	} else {
		// Every listener gets its own free port, so test binaries running
		// in parallel (go test ./...) each have their own weed.
		var err error
		if ports, err = freePorts(9); err != nil {
			return nil, err
		}
	}
	s3Port := ports[6]
	args := []string{
		"mini", "-dir=" + data,
		"-ip=" + ip, "-ip.bind=" + ip,
		"-master.port=" + ports[0], "-master.port.grpc=" + ports[1],
		"-volume.port=" + ports[2], "-volume.port.grpc=" + ports[3],
		"-filer.port=" + ports[4], "-filer.port.grpc=" + ports[5],
		"-s3.port=" + s3Port, "-s3.port.grpc=" + ports[7],
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-s3.config=" + cfgPath,
		"-s3.localSocket=" + filepath.Join(dir, "s3.sock"),
		"-filer.localSocket=" + filepath.Join(dir, "filer.sock"),
		"-webdav=false", "-admin.ui=false", "-admin.port.legacy=0", "-admin.port=" + ports[8],
		"-master.telemetry=false", // no traffic off this machine
		"-master.volumeSizeLimitMB=64", "-volume.max=" + strconv.Itoa(volumes),
	}
	if opts.Netns != "" {
		args = append([]string{"netns", "exec", opts.Netns, bin}, args...)
		bin = "ip" // which execs weed in the namespace: the pid is weed's
	}
	logPath := filepath.Join(dir, "weed.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a stop reaches anything it spawned, and the
	// kernel ends it if this process dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start weed: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	s := &Server{Endpoint: net.JoinHostPort(ip, s3Port), AccessKey: accessKey, SecretKey: secretKey}
	s.stop = func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		logf.Close()
	}
	s.client, err = minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(accessKey, secretKey, ""), MaxRetries: 1})
	if err != nil {
		s.Stop()
		return nil, err
	}
	// Ready once a bucket can be made and written: the S3 port opens before
	// the filer and volume server behind it are up.
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := s.probe()
		if err == nil {
			return s, nil
		}
		select {
		case werr := <-exited:
			s.Stop()
			return nil, fmt.Errorf("weed exited: %v\n%s", werr, tail(logPath))
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("weed not ready after 90s: %v\n%s", err, tail(logPath))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Stop ends weed.
func (s *Server) Stop() { s.stop() }

func (s *Server) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const b = "warren-probe"
	if ok, err := s.client.BucketExists(ctx, b); err != nil {
		return err
	} else if !ok {
		if err := s.client.MakeBucket(ctx, b, minio.MakeBucketOptions{}); err != nil {
			return err
		}
	}
	_, err := s.client.PutObject(ctx, b, "probe", strings.NewReader("ok"), 2, minio.PutObjectOptions{})
	return err
}

var buckets atomic.Int64

// NewBucket creates an empty bucket and returns its name.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("warren-test-%d-%d", os.Getpid(), buckets.Add(1))
	if err := s.client.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket %s: %v", name, err)
	}
	return name
}

// MakeBucket creates bucket name.
func (s *Server) MakeBucket(ctx context.Context, name string) error {
	return s.client.MakeBucket(ctx, name, minio.MakeBucketOptions{})
}

// Config returns a store config for bucket under prefix.
func (s *Server) Config(bucket, prefix string) blob.S3Config {
	return blob.S3Config{Endpoint: s.Endpoint, Bucket: bucket, Prefix: prefix, AccessKey: s.AccessKey, SecretKey: s.SecretKey}
}

// Client returns a client with the server's credentials, for tests that
// look under a store.
func (s *Server) Client() *minio.Client { return s.client }

func freePorts(n int) ([]string, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return out, nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
