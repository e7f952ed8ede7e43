package backendtest

import (
	"archive/tar"
	"bytes"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// testFiles runs its cases in parallel in one sandbox, each under its own
// directory.
func (s *suite) testFiles(t *testing.T) {
	needs(t, s.caps.Files, "Files")
	id := s.running(t)
	f := s.b.(backend.Files)

	t.Run("PutGet", func(t *testing.T) {
		t.Parallel()
		c := ctx(t)
		if err := f.WriteFile(c, id, "/pg/a.txt", 0o640, strings.NewReader("hello")); err != nil {
			t.Fatalf("WriteFile: %v", err)
		}
		fi, err := f.Stat(c, id, "/pg/a.txt")
		if err != nil || fi != (backend.FileInfo{Size: 5, Mode: 0o640}) {
			t.Errorf("Stat = %+v, %v; want size 5, mode 0640, not a dir", fi, err)
		}
		if fi, err := f.Stat(c, id, "/pg"); err != nil || !fi.IsDir {
			t.Errorf("Stat(/pg) = %+v, %v; want a directory", fi, err)
		}
		if got := s.read(t, id, "/pg/a.txt"); got != "hello" {
			t.Errorf("ReadFile = %q, want %q", got, "hello")
		}
		// Replacing.
		if err := f.WriteFile(c, id, "/pg/a.txt", 0o600, strings.NewReader("bye")); err != nil {
			t.Fatalf("WriteFile over a file: %v", err)
		}
		if got := s.read(t, id, "/pg/a.txt"); got != "bye" {
			t.Errorf("ReadFile after replace = %q, want %q", got, "bye")
		}
		// Large, streamed both ways.
		big := bytes.Repeat([]byte("0123456789abcdef"), 5<<20/16)
		if err := f.WriteFile(c, id, "/pg/big", 0o644, bytes.NewReader(big)); err != nil {
			t.Fatalf("WriteFile 5 MiB: %v", err)
		}
		if got := s.read(t, id, "/pg/big"); got != string(big) {
			t.Errorf("ReadFile of 5 MiB: got %d bytes (intact: false), want %d", len(got), len(big))
		}
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		c := ctx(t)
		var buf bytes.Buffer
		_, err := f.Stat(c, id, "/errs/nope")
		wantErr(t, "Stat of a missing path", err, errdefs.ErrNotFound)
		wantErr(t, "ReadFile of a missing path", f.ReadFile(c, id, "/errs/nope", &buf), errdefs.ErrNotFound)
		wantErr(t, "ReadTar of a missing path", f.ReadTar(c, id, "/errs/nope", &buf), errdefs.ErrNotFound)
		if err := f.WriteFile(c, id, "/errs/d/f", 0o644, strings.NewReader("x")); err != nil {
			t.Fatalf("WriteFile: %v", err)
		}
		wantErr(t, "ReadFile of a directory", f.ReadFile(c, id, "/errs/d", &buf), errdefs.ErrInvalid)
		wantErr(t, "WriteFile over a directory", f.WriteFile(c, id, "/errs/d", 0o644, strings.NewReader("x")), errdefs.ErrInvalid)
		wantErr(t, "WriteTar of a device node", f.WriteTar(c, id, "/errs", tarOf(t,
			tarEntry{name: "null", typ: tar.TypeChar})), errdefs.ErrInvalid)
	})

	t.Run("TarRoundTrip", func(t *testing.T) {
		t.Parallel()
		c := ctx(t)
		mtime := time.Unix(1650000000, 0)
		src := []tarEntry{
			{name: "t/", typ: tar.TypeDir, mode: 0o750},
			{name: "t/f", typ: tar.TypeReg, mode: 0o640, body: "hello"},
			{name: "t/x", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho hi\n"},
			{name: "t/h", typ: tar.TypeLink, link: "t/f"},
			{name: "t/l", typ: tar.TypeSymlink, link: "f"},
			{name: "t/sub/", typ: tar.TypeDir, mode: 0o700},
			{name: "t/sub/g", typ: tar.TypeReg, mode: 0o600, body: "deep"},
		}
		for i := range src {
			src[i].mtime = mtime
		}
		if err := f.WriteTar(c, id, "/rt", tarOf(t, src...)); err != nil {
			t.Fatalf("WriteTar: %v", err)
		}
		var out bytes.Buffer
		if err := f.ReadTar(c, id, "/rt/t", &out); err != nil {
			t.Fatalf("ReadTar: %v", err)
		}
		got := readTar(t, &out)
		want := map[string]tarEntry{
			"t/":      {typ: tar.TypeDir, mode: 0o750},
			"t/f":     {typ: tar.TypeReg, mode: 0o640, body: "hello"},
			"t/h":     {typ: tar.TypeLink, mode: 0o640, link: "t/f"},
			"t/l":     {typ: tar.TypeSymlink, mode: 0o777, link: "f"},
			"t/sub/":  {typ: tar.TypeDir, mode: 0o700},
			"t/sub/g": {typ: tar.TypeReg, mode: 0o600, body: "deep"},
			"t/x":     {typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho hi\n"},
		}
		names := slices.Sorted(maps.Keys(got))
		wantNames := []string{"t/", "t/f", "t/h", "t/l", "t/sub/", "t/sub/g", "t/x"}
		if !slices.Equal(names, wantNames) {
			t.Fatalf("ReadTar entries: got %q, want %q", names, wantNames)
		}
		for n, w := range want {
			g := got[n]
			if g.typ != w.typ || g.mode != w.mode || g.link != w.link || g.body != w.body {
				t.Errorf("%s: got %+v, want %+v", n, g, w)
			}
			if w.typ != tar.TypeLink && !g.mtime.Equal(mtime) {
				t.Errorf("%s: mtime %v, want %v", n, g.mtime, mtime)
			}
		}
		if s.caps.Exec {
			if out := s.shOK(t, id, "cat rt/t/l; rt/t/x"); out != "hellohi\n" {
				t.Errorf("the extracted tree seen by exec: got %q, want %q", out, "hellohi\n")
			}
		}
	})

	t.Run("SharedWithExec", func(t *testing.T) {
		needs(t, s.caps.Exec, "Exec")
		t.Parallel()
		c := ctx(t)
		if err := f.WriteFile(c, id, "/xchg/in.txt", 0o644, strings.NewReader("from files")); err != nil {
			t.Fatalf("WriteFile: %v", err)
		}
		if out := s.shOK(t, id, "cat xchg/in.txt"); out != "from files" {
			t.Errorf("exec reads a file put by WriteFile: got %q, want %q", out, "from files")
		}
		s.shOK(t, id, "echo from exec > xchg/out.txt")
		if got := s.read(t, id, "/xchg/out.txt"); got != "from exec\n" {
			t.Errorf("ReadFile of a file written by exec: got %q, want %q", got, "from exec\n")
		}
	})

	t.Run("NoEscape", func(t *testing.T) { t.Parallel(); s.testNoEscape(t, id) })
}

// testNoEscape plants symlinks aiming at a host directory and checks that
// no file call reads or changes it. "Inside" is wherever the backend keeps
// the sandbox's root; the host canary is outside it for every backend.
func (s *suite) testNoEscape(t *testing.T, id string) {
	c := ctx(t)
	f := s.b.(backend.Files)
	host := t.TempDir()
	canary := filepath.Join(host, "canary")
	if err := os.WriteFile(canary, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	up := strings.Repeat("../", 40)
	plant := tarOf(t,
		tarEntry{name: "esc", typ: tar.TypeSymlink, link: host},
		tarEntry{name: "up", typ: tar.TypeSymlink, link: up},
		tarEntry{name: "uphost", typ: tar.TypeSymlink, link: up + host},
	)
	if err := f.WriteTar(c, id, "/noesc", plant); err != nil {
		t.Fatalf("WriteTar of symlinks: %v", err)
	}
	if s.caps.Exec {
		s.shOK(t, id, "ln -s / noesc/slash")
	}

	// Writes through each link: errors are fine, landing on the host not.
	for _, p := range []string{
		"/noesc/esc/canary", "/noesc/esc/new",
		"/noesc/up" + host + "/new", "/noesc/uphost/new",
		"/noesc/slash" + host + "/new", "/noesc/slash" + host + "/canary",
	} {
		f.WriteFile(c, id, p, 0o644, strings.NewReader("escaped"))
	}
	f.WriteTar(c, id, "/noesc", tarOf(t,
		tarEntry{name: up + host + "/new", typ: tar.TypeReg, body: "escaped"},
		tarEntry{name: "esc/new", typ: tar.TypeReg, body: "escaped"},
		tarEntry{name: "hl", typ: tar.TypeLink, link: up + host + "/canary"},
	))
	// Reads through them must not see the host's content.
	for _, p := range []string{"/noesc/esc/canary", "/noesc/uphost/canary", "/noesc/slash" + host + "/canary", "/noesc/hl"} {
		var buf bytes.Buffer
		if f.ReadFile(c, id, p, &buf); buf.String() == "host" {
			t.Errorf("ReadFile(%s) read the host's file", p)
		}
	}
	var buf bytes.Buffer
	if f.ReadTar(c, id, "/noesc/esc", &buf); strings.Contains(readTarBodies(&buf), "host") {
		t.Errorf("ReadTar(/noesc/esc) read the host's file")
	}

	ents, err := os.ReadDir(host)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		t.Errorf("host directory has %d entries, want only the canary", len(ents))
	}
	if b, err := os.ReadFile(canary); err != nil || string(b) != "host" {
		t.Errorf("host canary: got %q, %v; want %q untouched", b, err, "host")
	}
}

// read returns the content of path in sandbox id.
func (s *suite) read(t *testing.T, id, path string) string {
	t.Helper()
	var buf bytes.Buffer
	if err := s.b.(backend.Files).ReadFile(ctx(t), id, path, &buf); err != nil {
		t.Fatalf("ReadFile(%s): %v", path, err)
	}
	return buf.String()
}

// tarEntry is one entry to build or read back.
type tarEntry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
	mtime      time.Time
}

func tarOf(t *testing.T, ents ...tarEntry) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, ModTime: e.mtime}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

func readTar(t *testing.T, r io.Reader) map[string]tarEntry {
	t.Helper()
	m := map[string]tarEntry{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return m
		}
		if err != nil {
			t.Fatalf("reading ReadTar's output: %v", err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("reading ReadTar's output: %v", err)
		}
		m[h.Name] = tarEntry{name: h.Name, link: h.Linkname, typ: h.Typeflag, mode: h.Mode, body: string(body), mtime: h.ModTime}
	}
}

// readTarBodies concatenates the file contents of a tar stream, "" if it is
// not one.
func readTarBodies(r io.Reader) string {
	var all strings.Builder
	tr := tar.NewReader(r)
	for {
		if _, err := tr.Next(); err != nil {
			return all.String()
		}
		io.Copy(&all, tr)
	}
}
