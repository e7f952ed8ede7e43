package lazy_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/lazy"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestServer: a layer server serves a layer added through its socket;
// EROFS mounts on the layer's file and reads it through the server; the
// server refuses a bad layer as invalid, counts the reads, refuses to
// stop "if unused" while the layer is mounted, and stops and unmounts
// once it is not.
func TestServer(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "mkfs.erofs")
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.Unavailable(t, "needs /dev/fuse: %v", err)
	}
	ctx := context.Background()
	store := newStore(t)
	src := t.TempDir()
	content := bytes.Repeat([]byte("served by another process\n"), 40000) // ~1 MiB
	if err := os.WriteFile(filepath.Join(src, "data"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "layer.erofs")
	if err := image.BuildEROFS(ctx, src, file, image.WithPlainData()); err != nil {
		t.Fatal(err)
	}
	img, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var chunks []lazy.Chunk
	for off := 0; off < len(img); off += 512 << 10 {
		n := min(len(img)-off, 512<<10)
		d, _, err := store.Put(ctx, bytes.NewReader(img[off:off+n]))
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, lazy.Chunk{Digest: d, Size: int64(n)})
	}
	layer := lazy.Layer{Digest: blob.FromBytes([]byte("manifest of the test layer")), Size: int64(len(img)), Chunks: chunks}

	dir := t.TempDir()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- lazy.Serve(sctx, lazy.ServerConfig{Dir: dir, Store: store, CacheBytes: 64 << 20, TraceWindow: 200 * time.Millisecond})
	}()
	var c *lazy.Client
	var info lazy.Info
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, info, err = lazy.Dial(ctx, dir); err == nil {
			break
		}
		select {
		case err := <-served:
			t.Fatalf("Serve: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no server answers in %s: %v", dir, err)
		}
	}
	defer c.Close()
	if info.Pid != os.Getpid() || info.Mount != lazy.MountDir(dir) || info.Limit != 64<<20 {
		t.Errorf("info %+v", info)
	}
	if b, err := os.ReadFile(lazy.PidFile(dir)); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("pid file: %q, %v", b, err)
	}

	bad := layer
	bad.Size++
	if _, err := c.Add(bad); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("add a layer whose chunks do not add up: %v, want ErrInvalid", err)
	}
	path, err := c.Add(layer)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(path) != lazy.MountDir(dir) {
		t.Errorf("layer file %s, want one in %s", path, lazy.MountDir(dir))
	}
	target := t.TempDir()
	if err := unix.Mount(path, target, "erofs", unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("mount erofs on the served file: %v", err)
	}
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(target, unix.MNT_DETACH)
		}
	}()
	if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("read through the server: %d bytes, %v; want %d", len(got), err, len(content))
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Fetched == 0 || st.Fetched > int64(len(img)) || st.Misses == 0 || len(st.Layers) != 1 || st.Layers[0].Digest != layer.Digest {
		t.Errorf("stats %+v: want the layer's reads, at most its %d bytes fetched", st, len(img))
	}

	// The reads were recorded: the server hands the trace out until it
	// is acknowledged.
	var traces []lazy.Trace
	for deadline := time.Now().Add(10 * time.Second); len(traces) == 0; time.Sleep(50 * time.Millisecond) {
		if traces, err = c.Traces(ctx); err != nil || time.Now().After(deadline) {
			t.Fatalf("no trace from the server within 10s: %v", err)
		}
	}
	if len(traces) != 1 || traces[0].Layer != layer.Digest || traces[0].Schema != lazy.TraceSchema || len(traces[0].Pieces) == 0 {
		t.Errorf("traces %+v, want one of layer %s", traces, layer.Digest)
	}
	if err := c.AckTrace(ctx, layer.Digest); err != nil {
		t.Fatal(err)
	}
	if traces, err := c.Traces(ctx); err != nil || len(traces) != 0 {
		t.Errorf("traces after the ack: %+v, %v", traces, err)
	}

	// Mounted: a stop "if unused" is refused, and the server serves on.
	if err := c.StopUnused(ctx); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("stop if unused with a layer mounted: %v, want ErrConflict", err)
	}
	if _, err := c.Info(ctx); err != nil {
		t.Fatalf("the server after a refused stop: %v", err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if err := c.StopUnused(ctx); err != nil {
		t.Fatalf("stop if unused: %v", err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still runs 10s after its stop")
	}
	if mnts, _ := image.MountsUnder(dir); len(mnts) > 0 {
		t.Errorf("mounts left: %v", mnts)
	}
	for _, p := range []string{lazy.Socket(dir), lazy.PidFile(dir)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after the server stopped: %v", p, err)
		}
	}
	if _, _, err := lazy.Dial(ctx, dir); err == nil {
		t.Error("a stopped server still answers")
	}
}
