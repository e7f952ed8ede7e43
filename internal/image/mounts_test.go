package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/testutil"
)

func requireErofs(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireKernelFeature(t, "erofs")
}

// testLayer builds a tiny layer holding /hello.
func testLayer(t *testing.T) backend.Layer {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "hello"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return imagetest.FromDir(t, src)
}

// newMounts returns a Mounts whose leftovers are unmounted when t ends.
func newMounts(t *testing.T) *Mounts {
	dir := t.TempDir()
	t.Cleanup(func() {
		names, _ := mountpointsUnder(dir)
		for _, n := range names {
			unix.Unmount(filepath.Join(dir, n), unix.MNT_DETACH)
		}
	})
	return NewMounts(filepath.Join(dir, "layers"))
}

func isMounted(t *testing.T, dir string) bool {
	t.Helper()
	names, err := mountpointsUnder(filepath.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if n == filepath.Base(dir) {
			return true
		}
	}
	return false
}

func TestMountsRefcount(t *testing.T) {
	requireErofs(t)
	ctx := context.Background()
	l := testLayer(t)
	m := newMounts(t)

	p1, err := m.Acquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := m.Acquire(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	if p1 != p2 {
		t.Fatalf("two mountpoints for one digest: %s, %s", p1, p2)
	}
	if b, err := os.ReadFile(filepath.Join(p1, "hello")); err != nil || string(b) != "hi\n" {
		t.Fatalf("read through mount: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(p1, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write to layer: got %v, want EROFS", err)
	}
	if got := m.Refs(l.Digest); got != 2 {
		t.Errorf("refs = %d, want 2", got)
	}
	if err := m.Release(l.Digest); err != nil {
		t.Fatal(err)
	}
	if !isMounted(t, p1) {
		t.Fatal("unmounted while a reference remains")
	}
	if err := m.Release(l.Digest); err != nil {
		t.Fatal(err)
	}
	if isMounted(t, p1) {
		t.Fatal("still mounted after the last release")
	}
	if _, err := os.Stat(p1); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mountpoint left behind: %v", err)
	}
	if err := m.Release(l.Digest); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("extra release: got %v, want ErrNotFound", err)
	}
}

func TestMountsAdoptAndPrune(t *testing.T) {
	requireErofs(t)
	ctx := context.Background()
	a, b := testLayer(t), imagetest.FromDir(t, t.TempDir())
	m := newMounts(t)
	pa, err := m.Acquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := m.Acquire(ctx, b)
	if err != nil {
		t.Fatal(err)
	}

	// A new process (agent restart) re-acquires a, never b, then prunes.
	m2 := NewMounts(m.Dir())
	if p, err := m2.Acquire(ctx, a); err != nil || p != pa {
		t.Fatalf("adopt: %s, %v", p, err)
	}
	if err := m2.Prune(); err != nil {
		t.Fatal(err)
	}
	if !isMounted(t, pa) {
		t.Error("prune unmounted a referenced layer")
	}
	if isMounted(t, pb) {
		t.Error("prune left an unreferenced layer mounted")
	}
	// Adoption must not stack a second mount on the first.
	names, _ := mountpointsUnder(m.Dir())
	if len(names) != 1 {
		t.Errorf("mounts under dir = %v, want just %s", names, filepath.Base(pa))
	}
	if err := m2.Release(a.Digest); err != nil {
		t.Fatal(err)
	}
	if names, _ := mountpointsUnder(m.Dir()); len(names) != 0 {
		t.Errorf("mounts left: %v", names)
	}
}

func TestMountsConcurrent(t *testing.T) {
	requireErofs(t)
	ctx := context.Background()
	layers := []backend.Layer{testLayer(t), imagetest.FromDir(t, t.TempDir())}
	m := newMounts(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 10; j++ {
				l := layers[(i+j)%2]
				p, err := m.Acquire(ctx, l)
				if err != nil {
					errs <- err
					return
				}
				if _, err := os.ReadDir(p); err != nil {
					errs <- err
				}
				if err := m.Release(l.Digest); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if names, _ := mountpointsUnder(m.Dir()); len(names) != 0 {
		t.Errorf("mounts left: %v", names)
	}
}

func TestMountsErrors(t *testing.T) {
	ctx := context.Background()
	m := NewMounts(t.TempDir())
	for _, d := range []string{"", "sha256", "sha256:xyz", "SHA256:" + hex64, "sha256:../../etc" + hex64} {
		if _, err := m.Acquire(ctx, backend.Layer{Digest: d, Path: "/x"}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("digest %q: got %v, want ErrInvalid", d, err)
		}
	}
	if _, err := m.Acquire(ctx, backend.Layer{Digest: "sha256:" + hex64, Path: "rel"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("relative path: got %v, want ErrInvalid", err)
	}
	testutil.RequireRoot(t)
	_, err := m.Acquire(ctx, backend.Layer{Digest: "sha256:" + hex64, Path: "/nonexistent/layer.erofs"})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing file: got %v, want ErrNotFound", err)
	}
	if m.Refs("sha256:"+hex64) != 0 {
		t.Error("failed acquire kept a reference")
	}
}

func TestMountLoopFallback(t *testing.T) {
	requireErofs(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		testutil.Unavailable(t, "no loop devices: %v", err)
	}
	l := testLayer(t)
	target := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mountLoop(l.Path, target); err != nil {
		t.Fatal(err)
	}
	defer unmountDir(target)
	if b, err := os.ReadFile(filepath.Join(target, "hello")); err != nil || string(b) != "hi\n" {
		t.Fatalf("read through loop mount: %q, %v", b, err)
	}
	if err := unmountDir(target); err != nil {
		t.Fatal(err)
	}
}

func TestDigestNames(t *testing.T) {
	for _, d := range []string{"sha256:" + hex64, "sha512:" + hex64 + hex64} {
		n, err := mountName(d)
		if err != nil {
			t.Fatal(err)
		}
		if back, ok := digestOf(n); !ok || back != d {
			t.Errorf("digestOf(mountName(%s)) = %s, %v", d, back, ok)
		}
	}
	if _, ok := digestOf("lost+found"); ok {
		t.Error("lost+found taken for a digest")
	}
	if got := unescapeMountinfo(`/a\040b`); got != "/a b" {
		t.Errorf("unescape = %q", got)
	}
}

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
