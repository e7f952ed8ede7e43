package rootfs

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestWriteTarNames(t *testing.T) {
	tests := []struct {
		name   string // in the archive
		landed string // under root
	}{
		{"../../x", "dst/x"},
		{"/abs/y", "dst/abs/y"},
		{"a/../../z", "dst/z"},
		{"./ok", "dst/ok"},
		{"deep/../../../../../../w", "dst/w"},
		{"$OUT/secret", "dst$OUT/secret"},
		{"../../../../../../../../$OUT/secret", "dst$OUT/secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSandbox(t)
			name := strings.ReplaceAll(tt.name, "$OUT", s.outside)
			must(t, WriteTar(s.root, "/dst", tarOf(t, entry{name: name, typ: tar.TypeReg, body: "evil"})))
			s.checkOutside(t)
			if b, err := os.ReadFile(s.in(strings.ReplaceAll(tt.landed, "$OUT", s.outside))); string(b) != "evil" {
				t.Errorf("%s: got %q (%v), want %q", tt.landed, b, err, "evil")
			}
		})
	}
}

func TestWriteTarHostileLinks(t *testing.T) {
	tests := []struct {
		name string
		ents []entry
		err  error
		want map[string]string // sandbox path -> content read back in-root
	}{
		{
			name: "symlink then file through it",
			ents: []entry{
				{name: "esc", typ: tar.TypeSymlink, link: "$OUT"},
				{name: "esc/secret", typ: tar.TypeReg, body: "overwritten?"},
			},
			want: map[string]string{"$OUT/secret": "overwritten?", "/dst/esc/secret": "overwritten?"},
		},
		{
			name: "climbing symlink then file through it",
			ents: []entry{
				{name: "up", typ: tar.TypeSymlink, link: strings.Repeat("../", 30)},
				{name: "up$OUT/secret", typ: tar.TypeReg, body: "in root"},
			},
			want: map[string]string{"$OUT/secret": "in root"},
		},
		{
			name: "symlink replaced by file",
			ents: []entry{
				{name: "s", typ: tar.TypeSymlink, link: "$OUT/secret"},
				{name: "s", typ: tar.TypeReg, body: "plain"},
			},
			want: map[string]string{"/dst/s": "plain"},
		},
		{
			name: "hard link to a host path",
			ents: []entry{{name: "h", typ: tar.TypeLink, link: "$OUT/secret"}},
			err:  invalidK,
		},
		{
			name: "hard link climbing out",
			ents: []entry{{name: "h", typ: tar.TypeLink, link: "../../../../../../$OUT/secret"}},
			err:  invalidK,
		},
		{
			name: "hard link through a symlinked dir",
			ents: []entry{
				{name: "d", typ: tar.TypeSymlink, link: "$OUT"},
				{name: "h", typ: tar.TypeLink, link: "d/secret"},
			},
			err: invalidK,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSandbox(t)
			s.mk(t, strings.TrimPrefix(s.outside, "/")+"/") // the in-root twin of the host dir
			for i := range tt.ents {
				tt.ents[i].name = strings.ReplaceAll(tt.ents[i].name, "$OUT", s.outside)
				tt.ents[i].link = strings.ReplaceAll(tt.ents[i].link, "$OUT", s.outside)
			}
			err := WriteTar(s.root, "/dst", tarOf(t, tt.ents...))
			checkKind(t, err, tt.err)
			s.checkOutside(t)
			for p, want := range tt.want {
				p = strings.ReplaceAll(p, "$OUT", s.outside)
				if got, err := readString(s, p); got != want {
					t.Errorf("%s: got %q (%v), want %q", p, got, err, want)
				}
			}
		})
	}
}

func TestWriteTarRefuses(t *testing.T) {
	tests := []struct {
		name string
		ents []entry
	}{
		{"char device", []entry{{name: "null", typ: tar.TypeChar}}},
		{"block device", []entry{{name: "sda", typ: tar.TypeBlock}}},
		{"fifo", []entry{{name: "p", typ: tar.TypeFifo}}},
		{"unknown type", []entry{{name: "c", typ: tar.TypeCont}}},
		{"hard link to missing", []entry{{name: "h", typ: tar.TypeLink, link: "nope"}}},
		{"hard link to dir", []entry{{name: "d", typ: tar.TypeDir}, {name: "h", typ: tar.TypeLink, link: "d"}}},
		{"empty symlink", []entry{{name: "l", typ: tar.TypeSymlink}}},
		{"file over dir", []entry{{name: "d", typ: tar.TypeDir}, {name: "d", typ: tar.TypeReg, body: "x"}}},
		{"file as the dir itself", []entry{{name: ".", typ: tar.TypeReg, body: "x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSandbox(t)
			err := WriteTar(s.root, "/dst", tarOf(t, tt.ents...))
			checkKind(t, err, invalidK)
			s.checkOutside(t)
		})
	}
	t.Run("corrupt stream", func(t *testing.T) {
		s := newSandbox(t)
		b := tarOf(t, entry{name: "f", typ: tar.TypeReg, body: "x"}).Bytes()
		b[148] ^= 0x7 // header checksum
		checkKind(t, WriteTar(s.root, "/", bytes.NewReader(b)), invalidK)
	})
	t.Run("truncated stream", func(t *testing.T) {
		s := newSandbox(t)
		b := tarOf(t, entry{name: "f", typ: tar.TypeReg, body: strings.Repeat("x", 2000)}).Bytes()
		checkKind(t, WriteTar(s.root, "/", bytes.NewReader(b[:1024])), invalidK)
	})
}

// tarEntry is what a test compares of a read-back entry.
type tarEntry struct {
	typ   byte
	mode  int64
	link  string
	body  string
	mtime int64
	owner string
}

func (e tarEntry) String() string {
	return fmt.Sprintf("{%c %o %q %q %d %s}", e.typ, e.mode, e.link, e.body, e.mtime, e.owner)
}

// readBack runs ReadTar and indexes its entries by name, keeping order.
func readBack(t *testing.T, root, p string) ([]string, map[string]tarEntry) {
	t.Helper()
	var b bytes.Buffer
	must(t, ReadTar(root, p, &b))
	var names []string
	m := map[string]tarEntry{}
	tr := tar.NewReader(&b)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names, m
		}
		must(t, err)
		body, err := io.ReadAll(tr)
		must(t, err)
		names = append(names, h.Name)
		m[h.Name] = tarEntry{typ: h.Typeflag, mode: h.Mode, link: h.Linkname, body: string(body),
			mtime: h.ModTime.Unix(), owner: fmt.Sprintf("%d:%d", h.Uid, h.Gid)}
	}
}

func TestTarRoundTrip(t *testing.T) {
	t1, t2 := time.Unix(1600000000, 0), time.Unix(1650000000, 0)
	src := []entry{
		{name: "t/", typ: tar.TypeDir, mode: 0o750, mtime: t1, uid: 1234, gid: 5678},
		{name: "t/f", typ: tar.TypeReg, mode: 0o640, body: "hello", mtime: t2, uid: 1234, gid: 5678},
		{name: "t/x", typ: tar.TypeReg, mode: 0o4755, body: "#!/bin/sh\n", mtime: t2},
		{name: "t/h", typ: tar.TypeLink, link: "t/f"},
		{name: "t/l", typ: tar.TypeSymlink, link: "f", mtime: t1, uid: 1234, gid: 5678},
		{name: "t/abs", typ: tar.TypeSymlink, link: "/etc/passwd", mtime: t1},
		{name: "t/ro/", typ: tar.TypeDir, mode: 0o555, mtime: t1},
		{name: "t/ro/inner", typ: tar.TypeReg, mode: 0o444, body: "ro", mtime: t2},
		{name: "t/empty/", typ: tar.TypeDir, mode: 0o700, mtime: t2},
	}
	s := newSandbox(t)
	must(t, WriteTar(s.root, "/dst", tarOf(t, src...)))

	owner := func(uid, gid int) string {
		if canChown() {
			return fmt.Sprintf("%d:%d", uid, gid)
		}
		return fmt.Sprintf("%d:%d", os.Geteuid(), os.Getegid())
	}
	me := owner(0, 0)
	want := map[string]tarEntry{
		"t/":         {typ: tar.TypeDir, mode: 0o750, mtime: t1.Unix(), owner: owner(1234, 5678)},
		"t/abs":      {typ: tar.TypeSymlink, mode: 0o777, link: "/etc/passwd", mtime: t1.Unix(), owner: me},
		"t/empty/":   {typ: tar.TypeDir, mode: 0o700, mtime: t2.Unix(), owner: me},
		"t/f":        {typ: tar.TypeReg, mode: 0o640, body: "hello", mtime: t2.Unix(), owner: owner(1234, 5678)},
		"t/h":        {typ: tar.TypeLink, mode: 0o640, link: "t/f", mtime: t2.Unix(), owner: owner(1234, 5678)},
		"t/l":        {typ: tar.TypeSymlink, mode: 0o777, link: "f", mtime: t1.Unix(), owner: owner(1234, 5678)},
		"t/ro/":      {typ: tar.TypeDir, mode: 0o555, mtime: t1.Unix(), owner: me},
		"t/ro/inner": {typ: tar.TypeReg, mode: 0o444, body: "ro", mtime: t2.Unix(), owner: me},
		"t/x":        {typ: tar.TypeReg, mode: 0o4755, body: "#!/bin/sh\n", mtime: t2.Unix(), owner: me},
	}
	wantNames := []string{"t/", "t/abs", "t/empty/", "t/f", "t/h", "t/l", "t/ro/", "t/ro/inner", "t/x"}

	names, got := readBack(t, s.root, "/dst/t")
	if !slices.Equal(names, wantNames) {
		t.Errorf("entries: got %q, want %q", names, wantNames)
	}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("%s: got %v, want %v", n, got[n], w)
		}
	}

	// Through the sandbox, the symlink resolves in-root and the hard link
	// shares its inode.
	if c, _ := readString(s, "/dst/t/l"); c != "hello" {
		t.Errorf("/dst/t/l reads %q, want %q", c, "hello")
	}
	var a, b unix.Stat_t
	must(t, unix.Stat(s.in("dst/t/f"), &a))
	must(t, unix.Stat(s.in("dst/t/h"), &b))
	if a.Ino != b.Ino {
		t.Errorf("t/h is not a hard link of t/f")
	}

	// A second trip through WriteTar and ReadTar changes nothing.
	var out bytes.Buffer
	must(t, ReadTar(s.root, "/dst/t", &out))
	must(t, WriteTar(s.root, "/copy", &out))
	names2, got2 := readBack(t, s.root, "/copy/t")
	if !slices.Equal(names2, names) {
		t.Errorf("second trip entries: got %q, want %q", names2, names)
	}
	for n, w := range got {
		if got2[n] != w {
			t.Errorf("second trip %s: got %v, want %v", n, got2[n], w)
		}
	}
	s.checkOutside(t)
}

func TestReadTarNames(t *testing.T) {
	s := newSandbox(t)
	s.mk(t, "work/a.txt=a", "work/sub/b=b", "wl -> /work", "work/host -> $OUT", "work/up -> ../../../..")
	must(t, unix.Mkfifo(s.in("work/fifo"), 0o644))

	tests := []struct {
		path string
		want []string
	}{
		{"/work", []string{"work/", "work/a.txt", "work/host", "work/sub/", "work/sub/b", "work/up"}},
		{"work/a.txt", []string{"a.txt"}},
		{"/wl", []string{"wl/", "wl/a.txt", "wl/host", "wl/sub/", "wl/sub/b", "wl/up"}},
		{"/work/sub/../sub", []string{"sub/", "sub/b"}},
		{"/", []string{"./", "./wl", "./work/", "./work/a.txt", "./work/host", "./work/sub/", "./work/sub/b", "./work/up"}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			names, ents := readBack(t, s.root, tt.path)
			if !slices.Equal(names, tt.want) {
				t.Errorf("ReadTar(%q) names: got %q, want %q", tt.path, names, tt.want)
			}
			for n, e := range ents {
				if strings.HasSuffix(n, "/host") && (e.typ != tar.TypeSymlink || e.link != s.outside) {
					t.Errorf("%s: got %v, want a symlink to %s, stored verbatim", n, e, s.outside)
				}
			}
		})
	}
	var b bytes.Buffer
	checkKind(t, ReadTar(s.root, "/nope", &b), notFound)
	s.checkOutside(t)
}
