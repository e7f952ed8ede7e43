package client

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type entry struct {
	name     string
	typ      byte
	body     string
	link     string
	mode     int64
	devmajor int64
}

func mkTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: mode, Size: int64(len(e.body)), ModTime: time.Unix(1700000000, 0), Devmajor: e.devmajor}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// sandboxDirs returns dest (empty) and outside (holding sentinel "secret"),
// siblings under one temp dir.
func sandboxDirs(t *testing.T) (base, dest, outside string) {
	base = t.TempDir()
	dest, outside = filepath.Join(base, "dest"), filepath.Join(base, "outside")
	for _, d := range []string{dest, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	return base, dest, outside
}

// assertOutsideUntouched fails if anything but dest/ and outside/secret
// (unchanged) exists under base.
func assertOutsideUntouched(t *testing.T, base string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(base, "outside", "secret")); err != nil || string(b) != "original" {
		t.Errorf("outside/secret = %q, %v; want it untouched", b, err)
	}
	for _, dir := range []string{base, filepath.Join(base, "outside")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if n := e.Name(); n != "dest" && n != "outside" && n != "secret" {
				t.Errorf("unexpected %s in %s", n, dir)
			}
		}
	}
}

func TestExtractTarRefusesEscapes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pre     func(t *testing.T, dest, outside string) // state of dest before
		entries []entry
		wantErr string
	}{
		{name: "dotdot", entries: []entry{{name: "../outside/evil", typ: tar.TypeReg, body: "x"}}, wantErr: `".."`},
		{name: "dotdot inside", entries: []entry{{name: "a/../../evil", typ: tar.TypeReg, body: "x"}}, wantErr: `".."`},
		{name: "absolute", entries: []entry{{name: "/tmp/evil", typ: tar.TypeReg, body: "x"}}, wantErr: "absolute"},
		{name: "relative symlink then write through it", entries: []entry{
			{name: "link", typ: tar.TypeSymlink, link: "../outside"},
			{name: "link/pwned", typ: tar.TypeReg, body: "x"},
		}, wantErr: "escapes"},
		{name: "absolute symlink then write through it", entries: []entry{
			{name: "link", typ: tar.TypeSymlink, link: "OUTSIDE"},
			{name: "link/pwned", typ: tar.TypeReg, body: "x"},
		}, wantErr: ""},
		{name: "symlink chain", entries: []entry{
			{name: "l2", typ: tar.TypeSymlink, link: "../.."},
			{name: "l1", typ: tar.TypeSymlink, link: "l2"},
			{name: "l1/outside/pwned", typ: tar.TypeReg, body: "x"},
		}, wantErr: "escapes"},
		{name: "symlink then dir through it", entries: []entry{
			{name: "link", typ: tar.TypeSymlink, link: "../outside"},
			{name: "link/sub/", typ: tar.TypeDir, mode: 0o755},
		}, wantErr: "escapes"},
		{name: "pre-existing symlink in dest", pre: func(t *testing.T, dest, outside string) {
			if err := os.Symlink(outside, filepath.Join(dest, "pre")); err != nil {
				t.Fatal(err)
			}
		}, entries: []entry{{name: "pre/pwned", typ: tar.TypeReg, body: "x"}}, wantErr: ""},
		{name: "hardlink out", entries: []entry{{name: "h", typ: tar.TypeLink, link: "../outside/secret"}}, wantErr: `".."`},
		{name: "hardlink through symlink", entries: []entry{
			{name: "s", typ: tar.TypeSymlink, link: "../outside"},
			{name: "h", typ: tar.TypeLink, link: "s/secret"},
		}, wantErr: "escapes"},
		{name: "char device", entries: []entry{{name: "null", typ: tar.TypeChar, devmajor: 1}}, wantErr: "device node"},
		{name: "block device", entries: []entry{{name: "sda", typ: tar.TypeBlock, devmajor: 8}}, wantErr: "device node"},
		{name: "fifo", entries: []entry{{name: "p", typ: tar.TypeFifo}}, wantErr: "named pipe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, dest, outside := sandboxDirs(t)
			if tc.pre != nil {
				tc.pre(t, dest, outside)
			}
			for i := range tc.entries {
				tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, "OUTSIDE", outside)
			}
			err := ExtractTar(bytes.NewReader(mkTar(t, tc.entries...)), dest)
			if err == nil {
				t.Fatal("extract succeeded, want a refusal")
			}
			t.Logf("refused: %v", err)
			if tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got %v, want it to mention %q", err, tc.wantErr)
			}
			assertOutsideUntouched(t, base)
		})
	}
}

func TestExtractTarReplacesInsteadOfWritingThrough(t *testing.T) {
	base, dest, outside := sandboxDirs(t)
	secret := filepath.Join(outside, "secret")
	if err := os.Symlink(secret, filepath.Join(dest, "pre")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(secret, filepath.Join(dest, "hard")); err != nil {
		t.Fatal(err)
	}
	err := ExtractTar(bytes.NewReader(mkTar(t,
		entry{name: "s", typ: tar.TypeSymlink, link: secret},
		entry{name: "s", typ: tar.TypeReg, body: "new s"},
		entry{name: "pre", typ: tar.TypeReg, body: "new pre"},
		entry{name: "hard", typ: tar.TypeReg, body: "new hard"},
		entry{name: "s2", typ: tar.TypeSymlink, link: secret},
		entry{name: "h2", typ: tar.TypeLink, link: "s2"},
		entry{name: "h2", typ: tar.TypeReg, body: "new h2"},
	)), dest)
	if err != nil {
		t.Fatal(err)
	}
	assertOutsideUntouched(t, base)
	for name, want := range map[string]string{"s": "new s", "pre": "new pre", "hard": "new hard", "h2": "new h2"} {
		fi, err := os.Lstat(filepath.Join(dest, name))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v %v; want a regular file", name, fi, err)
			continue
		}
		if b, _ := os.ReadFile(filepath.Join(dest, name)); string(b) != want {
			t.Errorf("%s = %q, want %q", name, b, want)
		}
	}
}

func TestExtractTarTree(t *testing.T) {
	dest := t.TempDir()
	err := ExtractTar(bytes.NewReader(mkTar(t,
		entry{name: "./a/", typ: tar.TypeDir, mode: 0o555},
		entry{name: "a/b/c.txt", typ: tar.TypeReg, body: "c", mode: 0o4755},
		entry{name: "a/link", typ: tar.TypeSymlink, link: "b/c.txt"},
		entry{name: "a/hard", typ: tar.TypeLink, link: "a/b/c.txt"},
		entry{name: "top.txt", typ: tar.TypeReg, body: "top", mode: 0o600},
	)), dest)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(filepath.Join(dest, "a"), 0o755) // let TempDir clean up
	check := func(name string, want fs.FileMode) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(dest, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeDir); got != want {
			t.Errorf("%s mode = %v, want %v", name, got, want)
		}
	}
	check("a", fs.ModeDir|0o555)
	check("a/b/c.txt", 0o755) // setuid dropped
	check("top.txt", 0o600)
	if l, err := os.Readlink(filepath.Join(dest, "a/link")); err != nil || l != "b/c.txt" {
		t.Errorf("a/link -> %q, %v", l, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "a/hard")); string(b) != "c" {
		t.Errorf("a/hard = %q", b)
	}
	fi, _ := os.Stat(filepath.Join(dest, "top.txt"))
	if !fi.ModTime().Equal(time.Unix(1700000000, 0)) {
		t.Errorf("top.txt mtime = %v", fi.ModTime())
	}
}

func TestPackDirRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o750)
	os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "deep", "data"), bytes.Repeat([]byte{0xff}, 5000), 0o640)
	os.Symlink("sub/deep/data", filepath.Join(src, "ln"))
	var buf bytes.Buffer
	if err := PackDir(&buf, src); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	var names []string
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		if hdr.Uid != 0 || hdr.Uname != "" {
			t.Errorf("%s carries owner %d/%q", hdr.Name, hdr.Uid, hdr.Uname)
		}
		names = append(names, hdr.Name)
	}
	if got, want := strings.Join(names, " "), "ln run.sh sub/ sub/deep/ sub/deep/data"; got != want {
		t.Errorf("entries %q, want %q", got, want)
	}
	dest := t.TempDir()
	if err := ExtractTar(bytes.NewReader(buf.Bytes()), dest); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "ln")); len(b) != 5000 {
		t.Errorf("ln -> %d bytes", len(b))
	}
	if fi, _ := os.Stat(filepath.Join(dest, "run.sh")); fi.Mode().Perm() != 0o755 {
		t.Errorf("run.sh mode %v", fi.Mode())
	}
}

// FuzzExtractTar: whatever the archive, nothing appears outside dest.
func FuzzExtractTar(f *testing.F) {
	f.Add(mkTar(f, entry{name: "../x", typ: tar.TypeReg, body: "x"}))
	f.Add(mkTar(f, entry{name: "l", typ: tar.TypeSymlink, link: ".."}, entry{name: "l/x", typ: tar.TypeReg, body: "x"}))
	f.Add(mkTar(f, entry{name: "a/", typ: tar.TypeDir}, entry{name: "a/b", typ: tar.TypeReg, body: "b"}, entry{name: "h", typ: tar.TypeLink, link: "a/b"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dest := filepath.Join(base, "dest")
		os.Mkdir(dest, 0o755)
		_ = ExtractTar(bytes.NewReader(data), dest)
		filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
		ents, _ := os.ReadDir(base)
		if len(ents) != 1 || ents[0].Name() != "dest" {
			t.Fatalf("extraction created %v beside dest", ents)
		}
	})
}

func TestExtractTarDetectsCutStream(t *testing.T) {
	whole := mkTar(t, entry{name: "a", typ: tar.TypeReg, body: "aaa"}, entry{name: "b", typ: tar.TypeReg, body: "bbb"})
	// Cut after the first entry (header + one data block): a clean block
	// boundary that archive/tar alone would take for the end.
	cut := whole[:1024]
	err := ExtractTar(bytes.NewReader(cut), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "end-of-archive") {
		t.Fatalf("got %v, want a truncation error", err)
	}
	if err := ExtractTar(bytes.NewReader(whole), t.TempDir()); err != nil {
		t.Fatalf("whole archive: %v", err)
	}
}
