package image_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/testutil"
)

// sampleTree writes a small tree with a nested file, a symlink and an
// old mtime, and returns its root.
func sampleTree(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	must(t, os.MkdirAll(filepath.Join(src, "a/b"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "a/b/file"), []byte("content\n"), 0o640))
	must(t, os.Symlink("a/b/file", filepath.Join(src, "link")))
	old := time.Unix(1_600_000_000, 0)
	must(t, os.Chtimes(filepath.Join(src, "a/b/file"), old, old))
	return src
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func build(t *testing.T, src string, opts ...image.BuildOption) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "layer.erofs")
	if err := image.BuildEROFS(context.Background(), src, out, opts...); err != nil {
		t.Fatalf("BuildEROFS: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// superblockUUID reads the filesystem UUID from an EROFS image: the
// superblock starts at 1024, the UUID at offset 48 in it.
func superblockUUID(img []byte) []byte { return img[1024+48 : 1024+64] }

func TestBuildEROFS(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs")
	src := sampleTree(t)
	outDir := t.TempDir()
	out := filepath.Join(outDir, "layer.erofs")
	if err := image.BuildEROFS(context.Background(), src, out); err != nil {
		t.Fatalf("BuildEROFS: %v", err)
	}
	img, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if magic := img[1024:1028]; !bytes.Equal(magic, []byte{0xe2, 0xe1, 0xf5, 0xe0}) {
		t.Fatalf("superblock magic: got % x, want EROFS's", magic)
	}
	if entries, _ := os.ReadDir(outDir); len(entries) != 1 {
		t.Fatalf("output dir: got %d entries, want only the image (no temp files)", len(entries))
	}

	// Same tree, fixed timestamp: identical bytes. Another tree: another UUID.
	fixed := image.WithTimestamp(time.Unix(1_700_000_000, 0))
	a, b := build(t, src, fixed), build(t, src, fixed)
	if !bytes.Equal(a, b) {
		t.Fatal("two WithTimestamp builds of one tree differ")
	}
	must(t, os.WriteFile(filepath.Join(src, "extra"), nil, 0o644))
	if c := build(t, src, fixed); bytes.Equal(superblockUUID(a), superblockUUID(c)) {
		t.Fatal("different trees got the same filesystem UUID")
	}
}

func TestBuildEROFSErrors(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs")
	ctx := context.Background()
	dir := t.TempDir()
	out := filepath.Join(dir, "out.erofs")

	err := image.BuildEROFS(ctx, filepath.Join(dir, "missing"), out)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing source: got %v, want ErrNotFound", err)
	}
	file := filepath.Join(dir, "file")
	must(t, os.WriteFile(file, nil, 0o644))
	if err := image.BuildEROFS(ctx, file, out); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("file as source: got %v, want ErrInvalid", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := image.BuildEROFS(canceled, sampleTree(t), out); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: got %v, want context.Canceled", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed builds left %s behind", out)
	}

	t.Setenv("PATH", t.TempDir())
	err = image.BuildEROFS(ctx, sampleTree(t), out)
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != "mkfs_erofs_missing" {
		t.Errorf("no mkfs.erofs: got %v, want ErrUnavailable mkfs_erofs_missing", err)
	}
}

// mountEROFS mounts img read-only and returns the mountpoint.
func mountEROFS(t *testing.T, img string) string {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireKernelFeature(t, "erofs")
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "erofs", "-o", "ro", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v: %s", img, err, out)
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	return mnt
}

// TestBuildEROFSKeepsMetadata mounts images to check what they record:
// owners and mtimes by default, the fixed time with WithTimestamp, root
// with WithAllRoot.
func TestBuildEROFSKeepsMetadata(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs")
	testutil.RequireRoot(t)
	src := sampleTree(t)
	file := filepath.Join(src, "a/b/file")
	must(t, os.Lchown(file, 1234, 5678))

	cases := []struct {
		name      string
		opts      []image.BuildOption
		uid, gid  uint32
		wantMtime int64
	}{
		{"default", nil, 1234, 5678, 1_600_000_000},
		{"fixed", []image.BuildOption{image.WithTimestamp(time.Unix(1_700_000_000, 0)), image.WithAllRoot()}, 0, 0, 1_700_000_000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "layer.erofs")
			must(t, image.BuildEROFS(context.Background(), src, out, tc.opts...))
			mnt := mountEROFS(t, out)
			got, err := os.ReadFile(filepath.Join(mnt, "link"))
			if err != nil || string(got) != "content\n" {
				t.Fatalf("read through symlink: got %q, %v", got, err)
			}
			fi, err := os.Stat(filepath.Join(mnt, "a/b/file"))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != tc.uid || st.Gid != tc.gid {
				t.Errorf("owner: got %d:%d, want %d:%d", st.Uid, st.Gid, tc.uid, tc.gid)
			}
			if fi.Mode().Perm() != 0o640 {
				t.Errorf("mode: got %v, want 0640", fi.Mode().Perm())
			}
			if got := fi.ModTime().Unix(); got != tc.wantMtime {
				t.Errorf("mtime: got %d, want %d", got, tc.wantMtime)
			}
		})
	}
}
