package daemon

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/lazy"
	"github.com/warrenhq/warren/internal/testutil"
)

// testLazydEnv makes this test binary a layer server (`warren lazyd`):
// agents that tests run in this process start it as theirs, since the
// test binary is not warren.
const testLazydEnv = "WARREN_DAEMON_TEST_LAZYD"

func TestMain(m *testing.M) {
	if os.Getenv(testLazydEnv) != "" {
		os.Exit(testLazyd(os.Args[1:]))
	}
	layerServerCommand = func(flags []string) (*exec.Cmd, error) {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(exe, flags...)
		cmd.Env = append(os.Environ(), testLazydEnv+"=1")
		return cmd, nil
	}
	os.Exit(m.Run())
}

// testLazyd is `warren lazyd` in this test binary.
func testLazyd(args []string) int {
	var cfg LayerServerConfig
	f := flag.NewFlagSet("lazyd", flag.ContinueOnError)
	f.StringVar(&cfg.Dir, "dir", "", "")
	f.StringVar(&cfg.Blobs, "blobs", "", "")
	f.Int64Var(&cfg.CacheBytes, "chunk-cache", 0, "")
	f.DurationVar(&cfg.TraceWindow, "trace-window", 0, "")
	if err := f.Parse(args); err != nil {
		return 2
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := ServeLayers(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "lazyd:", err)
		return 1
	}
	return 0
}

// TestLayerServerRestart: the agent's layer server runs in a process of
// its own. An agent that stops while a layer file is in use leaves it
// serving, and the next agent goes on with it (the file reads on); when
// the server is killed, the agent starts another, through which layers
// are added and read again, while the dead one's file fails reads at once
// (ENOTCONN), not a hang; a server that hangs is killed and replaced, and
// a read waiting on it fails. Once nothing uses it, the agent's stop
// stops the server: no process, mount or socket is left.
func TestLayerServerRestart(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.Unavailable(t, "needs /dev/fuse: %v", err)
	}
	every, timeout := layerProbeEvery, layerProbeTimeout
	layerProbeEvery, layerProbeTimeout = 200*time.Millisecond, 500*time.Millisecond
	defer func() { layerProbeEvery, layerProbeTimeout = every, timeout }()
	tmp := t.TempDir()
	store, err := blob.NewDir(filepath.Join(tmp, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	content := bytes.Repeat([]byte("0123456789abcdef"), 1<<14) // 256 KiB
	d, _, err := store.Put(context.Background(), bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	layer := lazy.Layer{Digest: blob.FromBytes([]byte("a manifest")), Size: int64(len(content)), Chunks: []lazy.Chunk{{Digest: d, Size: int64(len(content))}}}
	log := &testutil.SyncBuffer{}
	cfg := layerServerConfig{
		Dir: filepath.Join(tmp, "lazy"), Blobs: filepath.Join(tmp, "blobs"), CacheBytes: 64 << 20,
		Log: slog.New(slog.NewTextHandler(log, nil)),
	}
	defer func() {
		if t.Failed() {
			t.Logf("log:\n%s", log)
			b, _ := os.ReadFile(filepath.Join(cfg.Dir, "server.log"))
			t.Logf("server.log:\n%s", b)
		}
	}()
	read := func(path string) error {
		b, err := os.ReadFile(path)
		if err == nil && !bytes.Equal(b, content) {
			err = fmt.Errorf("read %d bytes, not the layer's %d", len(b), len(content))
		}
		return err
	}

	first, err := startLayerServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pid := first.pid()
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) }) // whatever happens
	if _, err := first.Add(lazy.Layer{Digest: layer.Digest, Size: 1, Chunks: layer.Chunks}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a layer whose chunks do not add up: %v, want ErrInvalid", err)
	}
	path, err := first.Add(layer)
	if err != nil {
		t.Fatal(err)
	}
	inUse, err := os.Open(path) // stands for an EROFS mount on it
	if err != nil {
		t.Fatal(err)
	}
	defer inUse.Close()
	first.Close()
	if !strings.Contains(log.String(), "the layer server serves on") {
		t.Errorf("the agent stopped with a layer file in use and did not say the server serves on")
	}

	second, err := startLayerServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close() // idempotent
	if second.pid() != pid || !strings.Contains(log.String(), "the layer server of an earlier agent is still serving") {
		t.Fatalf("the next agent's server is pid %d, want the earlier one %d", second.pid(), pid)
	}
	if err := read(path); err != nil {
		t.Fatalf("the layer file after the agent's restart: %v", err)
	}
	if st, err := second.Stats(); err != nil || st.Limit != 64<<20 {
		t.Errorf("stats through the next agent: %+v, %v", st, err)
	}

	// The server dies: the agent starts another.
	syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(testutil.Scale(15 * time.Second))
	for p := second.pid(); p == 0 || p == pid; p = second.pid() {
		if time.Now().After(deadline) {
			t.Fatalf("no new layer server 15s after the first was killed (pid %d)", p)
		}
		time.Sleep(50 * time.Millisecond)
	}
	newPid := second.pid()
	t.Cleanup(func() { syscall.Kill(newPid, syscall.SIGKILL) })
	if !strings.Contains(log.String(), "the layer server died") {
		t.Error("the agent did not log the server's death")
	}
	// What the page cache holds stays readable: drop it.
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	start := time.Now()
	// The kernel aborted the dead server's connection: ENOTCONN.
	if _, err := inUse.ReadAt(buf, 8192); !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.EIO) {
		t.Errorf("a read of the dead server's file: %v, want ENOTCONN or EIO", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a read of the dead server's file took %v", took)
	}
	inUse.Close()
	if path, err = second.Add(layer); err != nil {
		t.Fatalf("add to the new server: %v", err)
	}
	if err := read(path); err != nil {
		t.Fatalf("the layer file on the new server: %v", err)
	}

	// The server hangs (stopped): a read of its file waits, until the
	// agent, its probes unanswered, kills it and starts another; the
	// read then fails.
	dropCaches := func() {
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
			t.Fatal(err)
		}
	}
	dropCaches()
	syscall.Kill(newPid, syscall.SIGSTOP)
	readErr := make(chan error, 1)
	go func() { readErr <- read(path) }()
	deadline = time.Now().Add(testutil.Scale(15 * time.Second))
	for p := second.pid(); p == 0 || p == newPid; p = second.pid() {
		if time.Now().After(deadline) {
			t.Fatalf("no new layer server 15s after the last one hung (pid %d)", p)
		}
		time.Sleep(50 * time.Millisecond)
	}
	hungPid := newPid
	newPid = second.pid()
	t.Cleanup(func() { syscall.Kill(newPid, syscall.SIGKILL) })
	select {
	case err := <-readErr:
		if err == nil {
			t.Error("a read of a hung server's file succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read of a hung server's file still waits 10s after the agent replaced it")
	}
	if !strings.Contains(log.String(), "stopped answering") {
		t.Error("the agent did not log that the server stopped answering")
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/cmdline", hungPid)); err == nil {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", hungPid)); len(b) > 0 {
			t.Errorf("the hung server (pid %d) still runs", hungPid)
		}
	}
	if path, err = second.Add(layer); err != nil {
		t.Fatalf("add to the server after the hung one: %v", err)
	}
	if err := read(path); err != nil {
		t.Fatalf("the layer file on the server after the hung one: %v", err)
	}

	// Nothing in use: the agent's stop stops the server.
	second.Close()
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/cmdline", newPid)); err == nil {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", newPid)); len(b) > 0 {
			t.Errorf("the layer server (pid %d) still runs after the agent stopped with nothing in use", newPid)
		}
	}
	if mnts, _ := image.MountsUnder(tmp); len(mnts) > 0 {
		t.Errorf("mounts left: %v", mnts)
	}
	if _, err := os.Stat(lazy.Socket(cfg.Dir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left: %v", err)
	}
}

// TestLayerTraces: the trace a layer server records is stored as a blob,
// acknowledged, recorded and listed in the node's status.
func TestLayerTraces(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.Unavailable(t, "needs /dev/fuse: %v", err)
	}
	every := traceCollectEvery
	traceCollectEvery = 100 * time.Millisecond
	defer func() { traceCollectEvery = every }()
	tmp := t.TempDir()
	store, err := blob.NewDir(filepath.Join(tmp, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	content := bytes.Repeat([]byte("0123456789abcdef"), 1<<14)
	d, _, err := store.Put(context.Background(), bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	layer := lazy.Layer{Digest: blob.FromBytes([]byte("a manifest")), Size: int64(len(content)), Chunks: []lazy.Chunk{{Digest: d, Size: int64(len(content))}}}
	log := &testutil.SyncBuffer{}
	s, err := startLayerServer(layerServerConfig{
		Dir: filepath.Join(tmp, "lazy"), Blobs: filepath.Join(tmp, "blobs"), CacheBytes: 64 << 20, TraceWindow: 200 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(log, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	type recorded struct{ layer, trace, node string }
	got := make(chan recorded, 10)
	s.traces = &layerTraces{server: s, blobs: store, node: "n1", log: s.log,
		record: func(ctx context.Context, layer, trace, node string) (bool, error) {
			got <- recorded{layer, trace, node}
			return true, nil
		}}
	go s.traces.run(s.stop)
	path, err := s.Add(layer)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("read the layer: %d bytes, %v", len(b), err)
	}
	var r recorded
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatalf("no trace recorded within 10s; log:\n%s", log)
	}
	if r.layer != layer.Digest || r.node != "n1" {
		t.Errorf("recorded %+v, want layer %s of n1", r, layer.Digest)
	}
	rc, err := store.Open(context.Background(), r.trace)
	if err != nil {
		t.Fatalf("the trace blob: %v", err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if tr, err := lazy.DecodeTrace(b); err != nil || tr.Layer != layer.Digest || !slices.Equal(tr.Pieces, []int{0}) {
		t.Errorf("the trace blob: %+v, %v; want the layer's one chunk", tr, err)
	}
	if recent := s.traces.Recent(); len(recent) != 1 || recent[0].Layer != layer.Digest || recent[0].Trace != r.trace {
		t.Errorf("recent traces %+v, want the one recorded", recent)
	}
	c, _ := s.client()
	if left, err := c.Traces(context.Background()); err != nil || len(left) != 0 {
		t.Errorf("the server still has traces after they were stored: %+v, %v", left, err)
	}
	select {
	case again := <-got:
		t.Errorf("recorded again: %+v", again)
	case <-time.After(300 * time.Millisecond):
	}
}
