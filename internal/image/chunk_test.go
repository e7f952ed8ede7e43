package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/testutil"
)

func mustT(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// buildImage writes files into a new tree and builds an EROFS image of it.
func buildImage(t *testing.T, files map[string][]byte) string {
	t.Helper()
	testutil.RequireBinary(t, "mkfs.erofs")
	src := t.TempDir()
	for p, b := range files {
		full := filepath.Join(src, p)
		mustT(t, os.MkdirAll(filepath.Dir(full), 0o755))
		mustT(t, os.WriteFile(full, b, 0o644))
	}
	out := filepath.Join(t.TempDir(), "img.erofs")
	mustT(t, BuildEROFS(context.Background(), src, out))
	return out
}

// cut returns the chunk digests and sizes of an image cut with or
// without anchoring on large files.
func cut(t *testing.T, path string, anchored bool) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	mustT(t, err)
	var files []extent
	if anchored {
		files, err = fileExtents(bytes.NewReader(b), int64(len(b)), ChunkSize)
		mustT(t, err)
	}
	out := map[string]int64{}
	off := int64(0)
	for _, n := range chunkSizes(int64(len(b)), ChunkSize, files) {
		out[blob.FromBytes(b[off:off+n])] = n
		off += n
	}
	if off != int64(len(b)) {
		t.Fatalf("chunks cover %d of %d bytes", off, len(b))
	}
	return out
}

func sharedBytes(a, b map[string]int64) (n int64) {
	for d, size := range a {
		if _, ok := b[d]; ok {
			n += size
		}
	}
	return n
}

func TestFileExtents(t *testing.T) {
	big := randomBytes(3<<20 + 12345)
	also := randomBytes(1 << 20)
	path := buildImage(t, map[string][]byte{
		"a/small": []byte("small"), "a/b/big": big, "z/also": also, "z/link-target": randomBytes(5000),
	})
	img, err := os.ReadFile(path)
	mustT(t, err)
	ext, err := fileExtents(bytes.NewReader(img), int64(len(img)), ChunkSize)
	mustT(t, err)
	if len(ext) != 2 {
		t.Fatalf("got %d extents %+v, want the 2 files of 1 MiB or more", len(ext), ext)
	}
	for _, f := range [][]byte{big, also} {
		at := int64(bytes.Index(img, f[:4096]))
		found := false
		for _, e := range ext {
			if e.off == at && e.len >= int64(len(f))/4096*4096 {
				found = true
				if !bytes.Equal(img[e.off:e.off+int64(len(f))/4096*4096], f[:len(f)/4096*4096]) {
					t.Errorf("extent at %d does not hold the file's data", e.off)
				}
			}
		}
		if !found {
			t.Errorf("file at %d not among the extents %+v", at, ext)
		}
	}
	if _, err := fileExtents(bytes.NewReader(make([]byte, 8192)), 8192, ChunkSize); err == nil {
		t.Error("fileExtents of zeros: no error")
	}
}

// TestChunkDedup measures how much of two layers sharing large files the
// blob store holds once, with the plain 1 MiB grid and with the grid
// anchored on large files, and requires the anchored cut to share the
// shared files whole.
func TestChunkDedup(t *testing.T) {
	shared := randomBytes(8 << 20)
	lib := randomBytes(2<<20 + 777)
	small := func(n, size int) map[string][]byte {
		m := map[string][]byte{}
		for i := range n {
			m[fmt.Sprintf("aa/f%03d", i)] = randomBytes(size)
		}
		return m
	}
	cases := []struct {
		name   string
		a, b   map[string][]byte
		shared int64 // bytes of large files the two layers share
	}{
		{"same big file, different neighbours", merge(small(3, 7000), map[string][]byte{"data/model.bin": shared}),
			merge(small(40, 9000), map[string][]byte{"data/model.bin": shared}), int64(len(shared))},
		{"toolkit v1 -> v2, one small file changed", merge(small(20, 3000), map[string][]byte{"lib/a.so": lib, "lib/b.bin": shared, "VERSION": []byte("1")}),
			merge(small(20, 3000), map[string][]byte{"lib/a.so": lib, "lib/b.bin": shared, "VERSION": []byte("2 with a longer note")}), int64(len(shared) + len(lib))},
	}
	for _, tc := range cases {
		a, b := buildImage(t, tc.a), buildImage(t, tc.b)
		plain := sharedBytes(cut(t, a, false), cut(t, b, false))
		anchored := sharedBytes(cut(t, a, true), cut(t, b, true))
		t.Logf("%s: shared large files %.1f MiB; stored once: plain grid %.1f MiB, anchored grid %.1f MiB",
			tc.name, float64(tc.shared)/(1<<20), float64(plain)/(1<<20), float64(anchored)/(1<<20))
		// The files' whole blocks are shared; only a sub-block tail may not be.
		if anchored < tc.shared-2*4096 {
			t.Errorf("%s: anchored grid shares %d bytes, want at least %d", tc.name, anchored, tc.shared-2*4096)
		}
	}
}

func merge(ms ...map[string][]byte) map[string][]byte {
	out := map[string][]byte{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func TestChunkSizes(t *testing.T) {
	got := chunkSizes(5<<20, 1<<20, []extent{{off: 4096, len: 2 << 20}})
	want := []int64{4096, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 1<<20 - 4096}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("chunkSizes: got %v, want %v", got, want)
	}
	if got := chunkSizes(10, 1<<20, nil); len(got) != 1 || got[0] != 10 {
		t.Fatalf("chunkSizes of a tiny image: %v", got)
	}
}

// FuzzFileExtents: chunking reads the directory tree of images it built,
// but must stay safe (no panic, no hang) on any bytes.
func FuzzFileExtents(f *testing.F) {
	if _, err := os.Stat("/usr/bin/mkfs.erofs"); err == nil {
		src := f.TempDir()
		os.MkdirAll(filepath.Join(src, "d/e"), 0o755)
		os.WriteFile(filepath.Join(src, "d/e/f"), bytes.Repeat([]byte("x"), 5000), 0o644)
		os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte("y"), 70000), 0o644)
		out := filepath.Join(f.TempDir(), "seed.erofs")
		if err := BuildEROFS(context.Background(), src, out); err == nil {
			b, _ := os.ReadFile(out)
			f.Add(b)
		}
	}
	f.Add(make([]byte, 2048))
	f.Fuzz(func(t *testing.T, img []byte) {
		ext, err := fileExtents(bytes.NewReader(img), int64(len(img)), 4096)
		if err != nil {
			return
		}
		for _, e := range ext {
			if e.off < 0 || e.len < 0 || e.off+e.len > int64(len(img)) {
				t.Fatalf("extent %+v outside a %d-byte image", e, len(img))
			}
		}
		sizes := chunkSizes(int64(len(img)), 4096, ext)
		var total int64
		for _, n := range sizes {
			if n <= 0 || n > 4096 {
				t.Fatalf("chunk of %d bytes", n)
			}
			total += n
		}
		if total != int64(len(img)) {
			t.Fatalf("chunks cover %d of %d bytes", total, len(img))
		}
	})
}
