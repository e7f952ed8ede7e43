package oci

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/errdefs"
)

// ent is one tar entry of a test layer.
type ent struct {
	name   string
	typ    byte // tar.TypeReg when 0
	body   string
	link   string
	mode   int64
	uid    int
	gid    int
	xattrs map[string]string
	major  int64
}

var testTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// tarBytes builds an uncompressed tar of entries.
func tarBytes(t testing.TB, entries ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name:     e.name,
			Typeflag: e.typ,
			Linkname: e.link,
			Mode:     e.mode,
			Uid:      e.uid,
			Gid:      e.gid,
			ModTime:  testTime,
			Devmajor: e.major,
			Format:   tar.FormatPAX,
		}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %s: %v", e.name, err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, e.body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// memLayer is a Layer over bytes.
type memLayer []byte

func (m memLayer) Uncompressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(m)), nil
}

func layersOf(t testing.TB, layers ...[]ent) []Layer {
	var out []Layer
	for _, l := range layers {
		out = append(out, memLayer(tarBytes(t, l...)))
	}
	return out
}

// v1Image builds a go-containerregistry image from layers and a config.
func v1Image(t testing.TB, cfg v1.Config, layers ...[]ent) v1.Image {
	t.Helper()
	img := empty.Image
	for _, l := range layers {
		b := tarBytes(t, l...)
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config = cfg
	cf.OS, cf.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// snapshot describes a tree for comparison: one line per entry.
func snapshot(t testing.TB, dir string, withXattrs bool) []string {
	t.Helper()
	var out []string
	inodes := map[uint64]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := rel + " " + fi.Mode().String() + " " + itoa(st.Uid) + ":" + itoa(st.Gid)
		if rel != "." {
			line += " " + fi.ModTime().UTC().Format(time.RFC3339)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case fi.Mode().IsRegular():
			if first, ok := inodes[st.Ino]; ok && st.Nlink > 1 {
				line += " link=" + first
			} else {
				inodes[st.Ino] = rel
				b, _ := os.ReadFile(p)
				line += " " + strings.ReplaceAll(string(b), "\n", `\n`)
			}
		}
		if withXattrs {
			x, err := getXattrs(p)
			if err != nil {
				return err
			}
			var keys []string
			for k, v := range x {
				keys = append(keys, k+"="+v)
			}
			sort.Strings(keys)
			if len(keys) > 0 {
				line += " xattrs=" + strings.Join(keys, ",")
			}
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// wantInvalid fails unless err is ErrInvalid.
func wantInvalid(t testing.TB, err error, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want ErrInvalid (%q)", substr)
	}
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
	if substr != "" && !strings.Contains(err.Error(), substr) {
		t.Fatalf("got %q, want it to mention %q", err, substr)
	}
}

// onlyChild checks that parent holds nothing but name: a hostile archive
// wrote nothing beside the root it was given.
func onlyChild(t testing.TB, parent, name string) {
	t.Helper()
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != name {
			t.Errorf("%s appeared next to the root", e.Name())
		}
	}
}

func xattrOf(t testing.TB, p, name string) (string, bool) {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", false
	}
	return string(buf[:n]), true
}
