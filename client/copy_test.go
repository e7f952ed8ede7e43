package client_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/client/clienttest"
)

func newSandbox(t *testing.T, opts ...clienttest.Option) (*clienttest.Server, *client.Client, string) {
	t.Helper()
	srv := clienttest.NewServer(append([]clienttest.Option{clienttest.WithToken("tok")}, opts...)...)
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, "tok")
	sb, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	return srv, c, sb.ID
}

func writeLocal(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := fs.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// tree lists regular files under dir as "rel=content".
func tree(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			out = append(out, filepath.ToSlash(rel)+"="+string(b))
		}
		return nil
	})
	sort.Strings(out)
	return strings.Join(out, " ")
}

func TestCopyTo(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		local   map[string]string
		src     string // relative to the local temp dir
		dst     string
		want    map[string]string // sandbox path -> content
		wantErr string
	}{
		{name: "file into existing dir", local: map[string]string{"a.txt": "A"}, src: "a.txt", dst: "/work",
			want: map[string]string{"/work/a.txt": "A"}},
		{name: "file into existing dir with slash", local: map[string]string{"a.txt": "A"}, src: "a.txt", dst: "/work/",
			want: map[string]string{"/work/a.txt": "A"}},
		{name: "file to new name", local: map[string]string{"a.txt": "A"}, src: "a.txt", dst: "/work/b.txt",
			want: map[string]string{"/work/b.txt": "A"}},
		{name: "file to missing dir", local: map[string]string{"a.txt": "A"}, src: "a.txt", dst: "/nope/",
			wantErr: "does not exist"},
		{name: "dir into existing dir", local: map[string]string{"proj/x.sh": "X", "proj/sub/y": "Y"}, src: "proj", dst: "/work",
			want: map[string]string{"/work/proj/x.sh": "X", "/work/proj/sub/y": "Y"}},
		{name: "dir becomes missing path", local: map[string]string{"proj/x.sh": "X"}, src: "proj", dst: "/dst",
			want: map[string]string{"/dst/x.sh": "X"}},
		{name: "dir contents", local: map[string]string{"proj/x.sh": "X"}, src: "proj/.", dst: "/work",
			want: map[string]string{"/work/x.sh": "X"}},
		{name: "relative remote", local: map[string]string{"a.txt": "A"}, src: "a.txt", dst: "work",
			wantErr: "must be absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, c, id := newSandbox(t)
			dir := writeLocal(t, tc.local)
			err := c.CopyTo(ctx, id, dir+string(filepath.Separator)+filepath.FromSlash(tc.src), tc.dst)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error about %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for p, want := range tc.want {
				got, mode, ok := srv.File(id, p)
				if !ok || string(got) != want {
					t.Errorf("%s = %q (found %v), want %q", p, got, ok, want)
				}
				if strings.HasSuffix(p, ".sh") && mode != 0o755 {
					t.Errorf("%s mode %v, want 0755", p, mode)
				}
			}
		})
	}
}

func TestCopyToDirOntoFile(t *testing.T) {
	srv, c, id := newSandbox(t)
	srv.PutFile(id, "/work/f", []byte("f"), 0o644)
	dir := writeLocal(t, map[string]string{"d/x": "x"})
	err := c.CopyTo(context.Background(), id, filepath.Join(dir, "d"), "/work/f")
	if err == nil || !strings.Contains(err.Error(), "onto file") {
		t.Fatalf("got %v", err)
	}
}

func TestCopyToMissingSandbox(t *testing.T) {
	_, c, _ := newSandbox(t)
	dir := writeLocal(t, map[string]string{"a": "a"})
	err := c.CopyTo(context.Background(), "n1-nope", filepath.Join(dir, "a"), "/work")
	if !client.IsSandboxNotFound(err) {
		t.Fatalf("got %v, want sandbox_not_found", err)
	}
}

func TestCopyFrom(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		src      string
		dst      string // relative to a local temp dir holding "existing/"
		want     string // tree() of the local temp dir
		wantMode map[string]fs.FileMode
		wantErr  func(error) bool
	}{
		{name: "file into dir", src: "/work/out.txt", dst: ".",
			want: "out.txt=OUT", wantMode: map[string]fs.FileMode{"out.txt": 0o600}},
		{name: "file to new name", src: "/work/out.txt", dst: "renamed.txt", want: "renamed.txt=OUT"},
		{name: "file into existing subdir", src: "/work/out.txt", dst: "existing", want: "existing/out.txt=OUT"},
		{name: "dir into existing dir", src: "/work", dst: "existing",
			want: "existing/work/bin/run.sh=RUN existing/work/out.txt=OUT", wantMode: map[string]fs.FileMode{"existing/work/bin/run.sh": 0o755}},
		{name: "dir into cwd", src: "/work", dst: ".", want: "work/bin/run.sh=RUN work/out.txt=OUT"},
		{name: "dir becomes new path", src: "/work", dst: "copy", want: "copy/bin/run.sh=RUN copy/out.txt=OUT"},
		{name: "dir contents", src: "/work/.", dst: "existing", want: "existing/bin/run.sh=RUN existing/out.txt=OUT"},
		{name: "missing", src: "/work/nope", dst: ".", wantErr: client.IsFileNotFound},
		{name: "missing parent", src: "/work", dst: "a/b/c", wantErr: func(err error) bool { return err != nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, c, id := newSandbox(t)
			srv.PutFile(id, "/work/out.txt", []byte("OUT"), 0o600)
			srv.PutFile(id, "/work/bin/run.sh", []byte("RUN"), 0o755)
			base := t.TempDir()
			os.Mkdir(filepath.Join(base, "existing"), 0o755)
			err := c.CopyFrom(ctx, id, tc.src, base+string(filepath.Separator)+filepath.FromSlash(tc.dst))
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Fatalf("got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tree(t, base); got != tc.want {
				t.Errorf("local tree %q, want %q", got, tc.want)
			}
			for p, want := range tc.wantMode {
				fi, err := os.Stat(filepath.Join(base, p))
				if err != nil || fi.Mode().Perm() != want {
					t.Errorf("%s mode %v %v, want %v", p, fi.Mode(), err, want)
				}
			}
		})
	}
}

func TestCopyRoundTrip(t *testing.T) {
	ctx := context.Background()
	_, c, id := newSandbox(t)
	src := writeLocal(t, map[string]string{"p/a.sh": "a", "p/d/e/f": strings.Repeat("z", 100000), "p/g": "\xff\x00"})
	if err := c.CopyTo(ctx, id, filepath.Join(src, "p"), "/work"); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := c.CopyFrom(ctx, id, "/work/p", dst); err != nil {
		t.Fatal(err)
	}
	if got, want := tree(t, dst), tree(t, src); got != want {
		t.Errorf("round trip: got %.80q, want %.80q", got, want)
	}
}

// TestCopyFromHostileArchive serves archives a compromised sandbox could
// send and checks nothing lands outside the destination.
func TestCopyFromHostileArchive(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []tar.Header
	}{
		{"dotdot", []tar.Header{{Name: "work/", Typeflag: tar.TypeDir}, {Name: "work/../../evil", Typeflag: tar.TypeReg}}},
		{"sibling of top", []tar.Header{{Name: "work/", Typeflag: tar.TypeDir}, {Name: "evil", Typeflag: tar.TypeReg}}},
		{"absolute", []tar.Header{{Name: "/tmp/evil", Typeflag: tar.TypeReg}}},
		{"symlink escape", []tar.Header{{Name: "work/ln", Typeflag: tar.TypeSymlink, Linkname: "../.."}, {Name: "work/ln/evil", Typeflag: tar.TypeReg}}},
		{"top is a symlink", []tar.Header{{Name: "work", Typeflag: tar.TypeSymlink, Linkname: ".."}, {Name: "work/evil", Typeflag: tar.TypeReg}}},
		{"device", []tar.Header{{Name: "work/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, c, id := newSandbox(t, clienttest.WithIntercept(serveArchive(tc.entries)))
			base := t.TempDir()
			dest := filepath.Join(base, "dest")
			err := c.CopyFrom(context.Background(), id, "/work", dest)
			if err == nil {
				t.Fatal("copy succeeded, want a refusal")
			}
			t.Logf("refused: %v", err)
			ents, _ := os.ReadDir(base)
			for _, e := range ents {
				if e.Name() != "dest" {
					t.Errorf("%s written beside dest", e.Name())
				}
			}
			if _, err := os.Lstat(filepath.Join(base, "..", "evil")); err == nil {
				t.Error("evil written above the temp dir")
			}
		})
	}
}

// TestCopyFromLinks plants links a sandbox's owner could, and checks what
// each policy leaves in the copy: links inside the tree always arrive
// (absolute ones rewritten), links out of it never do by default, however
// they are chained.
func TestCopyFromLinks(t *testing.T) {
	entries := []tar.Header{
		{Name: "work/", Typeflag: tar.TypeDir},
		{Name: "work/d/", Typeflag: tar.TypeDir},
		{Name: "work/d/f", Typeflag: tar.TypeReg},
		{Name: "work/rel", Typeflag: tar.TypeSymlink, Linkname: "d/f"},          // inside
		{Name: "work/d/up", Typeflag: tar.TypeSymlink, Linkname: "../d/f"},      // inside
		{Name: "work/abs-in", Typeflag: tar.TypeSymlink, Linkname: "/work/d/f"}, // inside, rewritten
		{Name: "work/d/abs-top", Typeflag: tar.TypeSymlink, Linkname: "/work"},  // inside, rewritten
		{Name: "work/token", Typeflag: tar.TypeSymlink, Linkname: "/root/.warren/token"},
		{Name: "work/ssh", Typeflag: tar.TypeSymlink, Linkname: "../../.ssh/id_ed25519"},
		{Name: "work/d/back", Typeflag: tar.TypeSymlink, Linkname: ".."},       // the top: inside
		{Name: "work/chain", Typeflag: tar.TypeSymlink, Linkname: "d/back/.."}, // back is a link: out
		{Name: "work/loop", Typeflag: tar.TypeSymlink, Linkname: "loop/x"},     // never resolves
		{Name: "work/hard", Typeflag: tar.TypeLink, Linkname: "work/token"},    // a hard link to a link out
	}
	inside := map[string]string{"rel": "d/f", "d/up": "../d/f", "abs-in": "d/f", "d/abs-top": "..", "d/back": ".."}
	out := map[string]string{"token": "/root/.warren/token", "ssh": "../../.ssh/id_ed25519",
		"chain": "d/back/..", "loop": "loop/x", "hard": "/root/.warren/token"}
	_, c, id := newSandbox(t, clienttest.WithIntercept(serveArchive(entries)))
	links := func(t *testing.T, dir string) map[string]string {
		got := map[string]string{}
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type() == fs.ModeSymlink {
				rel, _ := filepath.Rel(dir, p)
				got[filepath.ToSlash(rel)], _ = os.Readlink(p)
			}
			return nil
		})
		return got
	}

	t.Run("skip", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "dest")
		skipped := map[string]string{}
		err := c.CopyFrom(context.Background(), id, "/work", dest,
			client.OnSkippedLink(func(name, target string) { skipped[name] = target }))
		if err != nil {
			t.Fatal(err)
		}
		if got := links(t, dest); !maps.Equal(got, inside) {
			t.Errorf("links copied: %v, want %v", got, inside)
		}
		if !maps.Equal(skipped, out) {
			t.Errorf("links skipped: %v, want %v", skipped, out)
		}
		if b, err := os.ReadFile(filepath.Join(dest, "abs-in")); err != nil || len(b) != 0 {
			t.Errorf("abs-in does not read d/f: %q, %v", b, err)
		}
	})
	t.Run("refuse", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "dest")
		err := c.CopyFrom(context.Background(), id, "/work", dest, client.WithLinks(client.LinksRefuse))
		if err == nil || !strings.Contains(err.Error(), "leads out of the copied tree") {
			t.Fatalf("copy: %v, want a refusal", err)
		}
		for name := range links(t, dest) {
			if _, bad := out[name]; bad {
				t.Errorf("%s created before the refusal", name)
			}
		}
	})
	t.Run("keep", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "dest")
		if err := c.CopyFrom(context.Background(), id, "/work", dest, client.WithLinks(client.LinksKeep)); err != nil {
			t.Fatal(err)
		}
		got := links(t, dest)
		for name, target := range out {
			if name == "hard" {
				continue // a hard link to a link is the link's inode under keep
			}
			if got[name] != target {
				t.Errorf("%s -> %q, want %q kept", name, got[name], target)
			}
		}
	})
}

// serveArchive answers every tar download with an archive of entries (mode
// 0644, no contents), as a compromised sandbox could.
func serveArchive(entries []tar.Header) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/files") || r.URL.Query().Get("format") != "tar" {
			return false
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			h.Mode = 0o644
			tw.WriteHeader(&h)
		}
		tw.Close()
		w.Header().Set("Content-Type", "application/x-tar")
		w.Write(buf.Bytes())
		return true
	}
}
