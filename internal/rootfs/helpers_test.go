package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// sandbox is a test root with a host directory beside it that holds
// canaries: nothing done through rootfs may ever change outside.
type sandbox struct {
	root    string // the sandbox's "/"
	outside string // absolute host path, not under root
	before  map[string]string
}

func newSandbox(t testing.TB) *sandbox {
	t.Helper()
	base := t.TempDir()
	s := &sandbox{root: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	must(t, os.Mkdir(s.root, 0o755))
	must(t, os.Mkdir(s.outside, 0o755))
	must(t, os.WriteFile(filepath.Join(s.outside, "secret"), []byte("host secret"), 0o644))
	must(t, os.WriteFile(filepath.Join(s.outside, "shadow"), []byte("host shadow"), 0o600))
	must(t, os.Mkdir(filepath.Join(s.outside, "dir"), 0o755))
	s.before = snapshot(t, s.outside)
	// Tests make read-only directories; let TempDir's cleanup remove them
	// when not running as root.
	t.Cleanup(func() {
		filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	return s
}

// checkOutside fails t if anything under outside changed.
func (s *sandbox) checkOutside(t testing.TB) {
	t.Helper()
	after := snapshot(t, s.outside)
	if !mapsEqual(after, s.before) {
		t.Errorf("host directory outside the root changed:\ngot  %v\nwant %v", after, s.before)
	}
	ents, err := os.ReadDir(filepath.Dir(s.root))
	must(t, err)
	if len(ents) != 2 {
		t.Errorf("entries beside the root: got %d, want 2 (root, outside)", len(ents))
	}
}

// in is the host path of sandbox path p, for checking results directly.
func (s *sandbox) in(p string) string { return filepath.Join(s.root, p) }

// mk creates sandbox entries directly on the host, trusted setup: "dir/"
// makes a directory, "name -> target" a symlink, "name=content" a file.
func (s *sandbox) mk(t testing.TB, specs ...string) {
	t.Helper()
	for _, spec := range specs {
		switch {
		case strings.Contains(spec, " -> "):
			name, target, _ := strings.Cut(spec, " -> ")
			must(t, os.MkdirAll(filepath.Dir(s.in(name)), 0o755))
			must(t, os.Symlink(strings.ReplaceAll(target, "$OUT", s.outside), s.in(name)))
		case strings.HasSuffix(spec, "/"):
			must(t, os.MkdirAll(s.in(spec), 0o755))
		default:
			name, content, _ := strings.Cut(spec, "=")
			must(t, os.MkdirAll(filepath.Dir(s.in(name)), 0o755))
			must(t, os.WriteFile(s.in(name), []byte(content), 0o644))
		}
	}
}

// snapshot maps each path under dir to its type, mode and content.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		v := info.Mode().String()
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		m[p] = v
		return nil
	})
	must(t, err)
	return m
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// checkKind fails t unless err is of kind want (nil: no error).
func checkKind(t testing.TB, err, want error) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("got error %v, want none", err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("got error %v, want %v", err, want)
	}
}

// readString reads sandbox file p with ReadFile.
func readString(s *sandbox, p string) (string, error) {
	var b bytes.Buffer
	err := ReadFile(s.root, p, &b)
	return b.String(), err
}

// entry is one tar entry for building archives in tests.
type entry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
	mtime      time.Time
	uid, gid   int
}

func tarOf(t testing.TB, ents ...entry) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode,
			Size: int64(len(e.body)), ModTime: e.mtime, Uid: e.uid, Gid: e.gid, Format: tar.FormatPAX}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		must(t, tw.WriteHeader(h))
		if h.Size > 0 {
			_, err := tw.Write([]byte(e.body))
			must(t, err)
		}
	}
	must(t, tw.Close())
	return &b
}

var (
	notFound = errdefs.ErrNotFound
	invalidK = errdefs.ErrInvalid
)
