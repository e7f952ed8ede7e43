package store_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/store/storetest"
)

func startEmbedded(t *testing.T, dir string, opts ...store.EmbeddedOption) *store.Embedded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	e, err := store.StartEmbedded(ctx, dir, opts...)
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	t.Logf("embedded etcd ready in %v at %s", time.Since(start).Round(time.Millisecond), e.Endpoint())
	return e
}

// TestEtcd runs the conformance suite against one embedded member, each
// subtest in its own key prefix so it starts from an empty store.
func TestEtcd(t *testing.T) {
	e := startEmbedded(t, t.TempDir())
	defer e.Close()
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T) store.Store {
		return store.NewEtcd(e.Client(), fmt.Sprintf("/test%d", n.Add(1)))
	})
	// The embedded store itself is a Store in the default namespace.
	storetest.Run(t, func(t *testing.T) store.Store {
		return &noClose{e.Etcd}
	})
}

// noClose keeps the suite from closing the shared client; the namespace is
// cleared instead.
type noClose struct{ *store.Etcd }

func (s *noClose) Close() error {
	_, err := s.Client().Delete(context.Background(), s.Prefix()+"/", clientv3.WithPrefix())
	return err
}

func TestEmbeddedRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	e := startEmbedded(t, dir)
	if err := e.Put(ctx, "/persist", []byte("yes")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	v1, _ := e.Get(ctx, "/persist")
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	e = startEmbedded(t, dir)
	defer e.Close()
	kv, err := e.Get(ctx, "/persist")
	if err != nil || string(kv.Value) != "yes" || kv.Version != v1.Version {
		t.Fatalf("after restart: got %q@%d, %v; want yes@%d", kv.Value, kv.Version, err, v1.Version)
	}
}

func TestEmbeddedLocked(t *testing.T) {
	dir := t.TempDir()
	e := startEmbedded(t, dir)
	defer e.Close()
	_, err := store.StartEmbedded(context.Background(), dir)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("second StartEmbedded on %s: got %v, want ErrUnavailable", dir, err)
	}
}

func TestEmbeddedLongPathUsesTCP(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	e := startEmbedded(t, dir, store.WithPrefix("/other"))
	defer e.Close()
	if !strings.HasPrefix(e.Endpoint(), "http://127.0.0.1:") {
		t.Fatalf("Endpoint: got %s, want a loopback TCP URL", e.Endpoint())
	}
	if err := e.Put(context.Background(), "/k", []byte("v")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if got, err := e.Client().Get(context.Background(), "/other/k"); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("raw get /other/k: got %v, %v; want one key", got, err)
	}
}

// TestEmbeddedSurvivesKill starts the member in a child process, which
// writes a key and reports it; the child is then killed with SIGKILL (no
// Close, no flush) and the member restarted here on the same directory.
func TestEmbeddedSurvivesKill(t *testing.T) {
	if dir := os.Getenv("WARREN_STORE_KILL_CHILD"); dir != "" {
		killChild(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestEmbeddedSurvivesKill$")
	cmd.Env = append(os.Environ(), "WARREN_STORE_KILL_CHILD="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "written") {
		t.Fatalf("child: got %q, %v; want \"written\"", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	e := startEmbedded(t, dir)
	defer e.Close()
	for i := range 20 {
		key := fmt.Sprintf("/k%d", i)
		kv, err := e.Get(context.Background(), key)
		if err != nil || string(kv.Value) != key {
			t.Fatalf("after kill -9: Get(%s) got %q, %v; want %s", key, kv.Value, err, key)
		}
	}
}

func killChild(dir string) {
	ctx := context.Background()
	e, err := store.StartEmbedded(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	for i := range 20 {
		key := fmt.Sprintf("/k%d", i)
		if err := e.Put(ctx, key, []byte(key)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
	}
	fmt.Println("written")
	select {} // wait for SIGKILL
}

// TestEmbeddedQuiet: a clean start, write and stop logs nothing at warn
// level or above (etcd's own defaults are very chatty).
func TestEmbeddedQuiet(t *testing.T) {
	var buf bytes.Buffer
	e := startEmbedded(t, t.TempDir(), store.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	if err := e.Put(context.Background(), "/x", nil); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if buf.Len() > 0 {
		t.Fatalf("logged on a clean run:\n%s", buf.String())
	}
}

func TestDialEtcd(t *testing.T) {
	e := startEmbedded(t, t.TempDir())
	defer e.Close()
	ctx := context.Background()
	s, err := store.DialEtcd([]string{e.Endpoint()}, "/dialed")
	if err != nil {
		t.Fatalf("DialEtcd: %v", err)
	}
	if err := s.Put(ctx, "/k", []byte("v")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if kv, err := e.Store().Get(ctx, "/k"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("key leaked out of its prefix: got %v, %v", kv, err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestEtcdUnreachable(t *testing.T) {
	s, err := store.DialEtcd([]string{"unix://" + filepath.Join(t.TempDir(), "none.sock")}, "")
	if err != nil {
		t.Fatalf("DialEtcd: %v", err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := s.Get(ctx, "/k"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Get from a dead cluster: got %v, want ErrUnavailable", err)
	}
}
