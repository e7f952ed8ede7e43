package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hostile plants symlinks that would reach the host if followed from the
// host's "/", plus in-root decoys at the places they reach when resolved as
// if root were "/".
func hostile(t *testing.T, s *sandbox) {
	up := strings.Repeat("../", 20)
	s.mk(t,
		"etc/evil -> $OUT/shadow",
		"abs -> $OUT/secret",
		"rel -> "+up+"$OUT/secret",
		"dirlink -> $OUT",
		"updir -> "+up,
		"loop1 -> loop2",
		"loop2 -> loop1",
		"self -> self",
		"dangling -> /nowhere",
		"file=plain",
		"adir/",
	)
	// The in-root copy of the host path: what those links really reach.
	s.mk(t, strings.TrimPrefix(s.outside, "/")+"/secret=sandbox secret")
}

func TestReadHostile(t *testing.T) {
	s := newSandbox(t)
	hostile(t, s)
	out := s.outside
	tests := []struct {
		path string
		want string // content
		err  error  // kind
	}{
		{path: "/abs", want: "sandbox secret"},
		{path: "/rel", want: "sandbox secret"},
		{path: "/dirlink/secret", want: "sandbox secret"},
		{path: "/updir" + out + "/secret", want: "sandbox secret"},
		{path: "/../../../.." + out + "/secret", want: "sandbox secret"},
		{path: "adir/../../.." + out + "/secret", want: "sandbox secret"},
		{path: "/etc/evil", err: notFound}, // in-root $OUT/shadow does not exist
		{path: "/dirlink/shadow", err: notFound},
		{path: "/loop1", err: invalidK},
		{path: "/self", err: invalidK},
		{path: "/loop1/x", err: invalidK},
		{path: "/nope", err: notFound},
		{path: "/nope/x", err: notFound},
		{path: "/file/x", err: invalidK},
		{path: "/adir", err: invalidK},
		{path: "/file", want: "plain"},
		{path: "/with\x00nul", err: invalidK},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, err := readString(s, tt.path)
			checkKind(t, err, tt.err)
			if got != tt.want {
				t.Errorf("ReadFile(%q) = %q, want %q", tt.path, got, tt.want)
			}
			if tt.err == nil || tt.path == "/adir" {
				return
			}
			if _, err := Stat(s.root, tt.path); !errors.Is(err, tt.err) {
				t.Errorf("Stat(%q): got error %v, want %v", tt.path, err, tt.err)
			}
		})
	}
	s.checkOutside(t)
}

func TestMagicLinksRefused(t *testing.T) {
	// With the host's "/" as root, /proc/self/root is a magic link.
	if _, err := Stat("/", "/proc/self/root/etc"); !errors.Is(err, invalidK) {
		t.Fatalf("Stat through a magic link: got %v, want ErrInvalid", err)
	}
}

func TestWriteHostile(t *testing.T) {
	tests := []struct {
		name   string
		path   string
		err    error
		landed string // where it must land, under root; "$OUT" is the outside path
	}{
		{name: "replaces absolute symlink", path: "/abs", landed: "abs"},
		{name: "replaces relative symlink", path: "/rel", landed: "rel"},
		{name: "replaces etc/evil", path: "/etc/evil", landed: "etc/evil"},
		{name: "symlinked parent in-root", path: "/dirlink/new", landed: "$OUT/new"},
		{name: "climbing parent in-root", path: "/updir$OUT/new", landed: "$OUT/new"},
		{name: "symlinked grandparent", path: "/dirlink/dir/new", landed: "$OUT/dir/new"},
		{name: "dangling symlinked parent", path: "/dangling/new", err: notFound},
		{name: "loop parent", path: "/loop1/x", err: invalidK},
		{name: "loop final replaced", path: "/loop1", landed: "loop1"},
		{name: "parent is a file", path: "/file/x", err: invalidK},
		{name: "over a directory", path: "/adir", err: invalidK},
		{name: "root", path: "/", err: invalidK},
		{name: "dotdot", path: "/a/../../../b", landed: "b"},
		{name: "relative creates parents", path: "x/y/z.txt", landed: "x/y/z.txt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSandbox(t)
			hostile(t, s)
			p := strings.ReplaceAll(tt.path, "$OUT", s.outside)
			err := WriteFile(s.root, p, 0o640, strings.NewReader("written"))
			checkKind(t, err, tt.err)
			s.checkOutside(t)
			if tt.landed == "" {
				return
			}
			host := s.in(strings.ReplaceAll(tt.landed, "$OUT", s.outside))
			fi, err := os.Lstat(host)
			must(t, err)
			if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o640 {
				t.Errorf("%s: got mode %v, want regular 0640", tt.landed, fi.Mode())
			}
			if b, _ := os.ReadFile(host); string(b) != "written" {
				t.Errorf("%s: got %q, want %q", tt.landed, b, "written")
			}
		})
	}
}

func TestWriteFile(t *testing.T) {
	old := syscall.Umask(0o077) // modes must not depend on the umask
	defer syscall.Umask(old)
	s := newSandbox(t)
	must(t, WriteFile(s.root, "/a/b/c.sh", 0o4755, strings.NewReader("#!/bin/sh\n")))
	for p, want := range map[string]uint32{"/a": 0o755, "/a/b": 0o755, "/a/b/c.sh": 0o4755} {
		fi, err := Stat(s.root, p)
		must(t, err)
		if fi.Mode != want {
			t.Errorf("Stat(%q).Mode = %o, want %o", p, fi.Mode, want)
		}
	}
	fi, err := Stat(s.root, "/a/b/c.sh")
	must(t, err)
	if fi.Size != 10 || fi.IsDir {
		t.Errorf("Stat = %+v, want size 10, not a dir", fi)
	}
	// Replacing keeps no temporary files and changes the content.
	must(t, WriteFile(s.root, "/a/b/c.sh", 0o600, strings.NewReader("new")))
	if got, _ := readString(s, "/a/b/c.sh"); got != "new" {
		t.Errorf("after replace got %q, want %q", got, "new")
	}
	assertNoTemp(t, s.in("a/b"))
}

// failingReader yields some bytes, then an error.
type failingReader struct{ sent bool }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.sent {
		return 0, errors.New("client went away")
	}
	r.sent = true
	return copy(p, "partial"), nil
}

func TestWriteFileAtomic(t *testing.T) {
	s := newSandbox(t)
	s.mk(t, "d/f=original")
	err := WriteFile(s.root, "/d/f", 0o644, &failingReader{})
	if err == nil || !strings.Contains(err.Error(), "client went away") {
		t.Fatalf("got error %v, want the reader's error", err)
	}
	if got, _ := readString(s, "/d/f"); got != "original" {
		t.Errorf("after a failed write got %q, want %q", got, "original")
	}
	assertNoTemp(t, s.in("d"))
}

func TestWriteFileKeepsOwner(t *testing.T) {
	if !canChown() {
		t.Skip("needs root to give files away")
	}
	s := newSandbox(t)
	s.mk(t, "home/f=x")
	must(t, os.Chown(s.in("home/f"), 1234, 5678))
	must(t, WriteFile(s.root, "/home/f", 0o644, strings.NewReader("y")))
	var st unix.Stat_t
	must(t, unix.Lstat(s.in("home/f"), &st))
	if st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("owner after replace: got %d:%d, want 1234:5678", st.Uid, st.Gid)
	}
}

func assertNoTemp(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".warren-tmp-") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
}

func TestReadFileNotRegular(t *testing.T) {
	s := newSandbox(t)
	s.mk(t, "dev/")
	must(t, unix.Mkfifo(s.in("dev/fifo"), 0o644))
	done := make(chan error, 1)
	go func() { _, err := readString(s, "/dev/fifo"); done <- err }()
	select {
	case err := <-done:
		checkKind(t, err, invalidK)
	case <-time.After(5 * time.Second):
		t.Fatal("ReadFile of a fifo blocked: it must never open one")
	}
	fi, err := Stat(s.root, "/dev/fifo")
	must(t, err)
	if fi.IsDir || fi.Mode != 0o644 {
		t.Errorf("Stat(fifo) = %+v, want mode 0644", fi)
	}
}

func TestStatFollowsInRoot(t *testing.T) {
	s := newSandbox(t)
	s.mk(t, "real/f=12345", "link -> /real")
	fi, err := Stat(s.root, "/link")
	must(t, err)
	if !fi.IsDir {
		t.Errorf("Stat(/link).IsDir = false, want true (the link is followed)")
	}
	fi, err = Stat(s.root, "link/f")
	must(t, err)
	if fi.Size != 5 {
		t.Errorf("Stat(link/f).Size = %d, want 5", fi.Size)
	}
}

func TestOpen(t *testing.T) {
	s := newSandbox(t)
	hostile(t, s)
	f, err := Open(s.root, "/dirlink", unix.O_PATH|unix.O_DIRECTORY)
	must(t, err)
	defer f.Close()
	got, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	must(t, err)
	if want := s.in(s.outside); got != want {
		t.Errorf("Open(/dirlink) reached %s, want %s", got, want)
	}
	if _, err := Open(s.root, "/nope", unix.O_PATH); !errors.Is(err, notFound) {
		t.Errorf("Open(/nope): got %v, want ErrNotFound", err)
	}
	if _, err := Open(filepath.Join(s.root, "missing-root"), "/", unix.O_PATH); !errors.Is(err, notFound) {
		t.Errorf("Open with a missing root: got %v, want ErrNotFound", err)
	}
}

func TestOpenRefusesCreate(t *testing.T) {
	s := newSandbox(t)
	for _, flags := range []int{unix.O_CREAT | unix.O_WRONLY, unix.O_TMPFILE | unix.O_RDWR} {
		if _, err := Open(s.root, "/new", flags); !errors.Is(err, invalidK) {
			t.Errorf("Open(flags %#x): got %v, want ErrInvalid", flags, err)
		}
	}
}
