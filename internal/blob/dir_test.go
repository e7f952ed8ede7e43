package blob_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/blob/blobtest"
	"github.com/warrenhq/warren/internal/errdefs"
)

func TestDir(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		d, err := blob.NewDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}

func TestDirLayout(t *testing.T) {
	root := t.TempDir()
	d, err := blob.NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	digest, _, err := d.Put(context.Background(), strings.NewReader("layout"))
	if err != nil {
		t.Fatal(err)
	}
	hex := strings.TrimPrefix(digest, "sha256:")
	want := filepath.Join(root, "sha256", hex[:2], hex)
	if p, _ := d.Path(digest); p != want {
		t.Fatalf("Path: got %s, want %s", p, want)
	}
	fi, err := os.Stat(want)
	if err != nil {
		t.Fatalf("blob file: %v", err)
	}
	if fi.Mode().Perm() != 0o444 {
		t.Errorf("blob file mode: got %v, want read-only", fi.Mode())
	}
	if tmp, _ := os.ReadDir(filepath.Join(root, "tmp")); len(tmp) != 0 {
		t.Errorf("tmp/ after Put: got %d entries, want none", len(tmp))
	}
}

// TestDirIgnoresStrays: files a person or another tool left in the tree
// are not blobs.
func TestDirIgnoresStrays(t *testing.T) {
	root := t.TempDir()
	d, err := blob.NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "sha256", "zz"), 0o755)
	os.WriteFile(filepath.Join(root, "sha256", "zz", "notes.txt"), nil, 0o644)
	os.WriteFile(filepath.Join(root, "sha256", "README"), nil, 0o644)
	good := strings.Repeat("b", 64)
	os.MkdirAll(filepath.Join(root, "sha256", "aa"), 0o755)
	os.WriteFile(filepath.Join(root, "sha256", "aa", good), nil, 0o644) // wrong shard
	l, err := d.List(context.Background())
	if err != nil || len(l) != 0 {
		t.Fatalf("List: got %v, %v; want none", l, err)
	}
}

func TestDirRemovesStaleTemp(t *testing.T) {
	root := t.TempDir()
	if _, err := blob.NewDir(root); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(root, "tmp", "put-stale")
	fresh := filepath.Join(root, "tmp", "put-fresh")
	os.WriteFile(stale, []byte("x"), 0o644)
	os.WriteFile(fresh, []byte("x"), 0o644)
	old := time.Now().Add(-48 * time.Hour)
	os.Chtimes(stale, old, old)
	if _, err := blob.NewDir(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp file survived NewDir: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh temp file (maybe another node's write) removed: %v", err)
	}
}

func TestVerify(t *testing.T) {
	content := []byte("verify me")
	good := blob.FromBytes(content)
	if err := iotest.TestReader(blob.Verify(bytes.NewReader(content), good), content); err != nil {
		t.Fatalf("Verify(matching): %v", err)
	}
	_, err := bytes.NewBuffer(nil).ReadFrom(blob.Verify(bytes.NewReader(content), blob.FromBytes([]byte("other"))))
	if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != "digest_mismatch" {
		t.Fatalf("Verify(mismatch): got %v, want ErrInvalid digest_mismatch", err)
	}
	_, err = bytes.NewBuffer(nil).ReadFrom(blob.Verify(bytes.NewReader(content), "md5:x"))
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Verify(bad digest): got %v, want ErrInvalid", err)
	}
}

func TestParseDigest(t *testing.T) {
	hex := strings.Repeat("0123456789abcdef", 4)
	if got, err := blob.ParseDigest("sha256:" + hex); err != nil || got != hex {
		t.Fatalf("ParseDigest(valid): got %q, %v", got, err)
	}
	if _, err := blob.ParseDigest("sha256:" + strings.ToUpper(hex)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("ParseDigest(uppercase): got %v, want ErrInvalid", err)
	}
}

func FuzzParseDigest(f *testing.F) {
	f.Add("sha256:" + strings.Repeat("a", 64))
	f.Add("sha256:../" + strings.Repeat("a", 61))
	f.Fuzz(func(t *testing.T, d string) {
		h, err := blob.ParseDigest(d)
		if err != nil {
			return
		}
		if strings.ContainsAny(h, "./\\\x00") || len(h) != 64 || "sha256:"+h != d {
			t.Fatalf("ParseDigest(%q) accepted %q", d, h)
		}
	})
}
