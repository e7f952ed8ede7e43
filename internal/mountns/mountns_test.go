package mountns

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/testutil"
)

// mounted reports whether the caller's mount table has a mount at dir.
func mounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// A mount made in a scratch namespace stays out of the host's table, even
// under a shared mount (as / is under systemd); a process started there
// sees it; a clone keeps its files reachable after the namespace is gone.
func TestScratch(t *testing.T) {
	testutil.RequireRoot(t)
	// A shared mount of the host's, with the target below it.
	shared := t.TempDir()
	if err := unix.Mount("tmpfs", shared, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(shared, unix.MNT_DETACH)
	if err := unix.Mount("", shared, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(shared, "mnt")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}

	ns, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	err = ns.Run(func() error {
		if err := unix.Mount("tmpfs", target, "tmpfs", 0, "size=1m"); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(target, "f"), []byte("inside"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	if mounted(t, target) {
		t.Fatalf("a mount made in the scratch namespace shows in the host's table")
	}
	if _, err := os.Stat(filepath.Join(target, "f")); !os.IsNotExist(err) {
		t.Errorf("the host sees the scratch mount's file: %v", err)
	}

	// A process started in it sees the mount (runc create, in the backend).
	cmd := exec.Command("cat", filepath.Join(target, "f"))
	var b strings.Builder
	cmd.Stdout = &b
	if err := ns.RunCmd(cmd); err != nil || b.String() != "inside" {
		t.Errorf("a process started in the namespace read %q, %v; want %q", b.String(), err, "inside")
	}

	// A clone outlives the namespace, and is in no table.
	clone, err := ns.Clone(unix.AT_FDCWD, target, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer clone.Close()
	ns.Close()
	got, err := os.ReadFile("/proc/self/fd/" + strconv.Itoa(int(clone.Fd())) + "/f")
	if err != nil || string(got) != "inside" {
		t.Errorf("through the clone after the namespace closed: %q, %v", got, err)
	}
	if mounted(t, target) {
		t.Errorf("the clone shows in the host's table")
	}
}

// Of names a process's namespace: a clone made there is of its mounts.
func TestOf(t *testing.T) {
	testutil.RequireRoot(t)
	ns, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	root, err := ns.Clone(unix.AT_FDCWD, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	var a, b unix.Stat_t
	if err := unix.Fstat(int(root.Fd()), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/", &b); err != nil {
		t.Fatal(err)
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		t.Errorf("clone of / in this process's namespace is %d:%d, / is %d:%d", a.Dev, a.Ino, b.Dev, b.Ino)
	}
}

// openFiles counts this process's descriptors.
func openFiles(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A shelf keeps clones reachable with no descriptor of theirs open, out
// of the host's table; Drop lets them go, except through a descriptor
// still open; a bare name is not a mount.
func TestShelf(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	shelf, err := NewShelf(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer shelf.Close()

	const n = 20
	before := openFiles(t)
	for i := range n {
		src := t.TempDir()
		if err := unix.Mount("tmpfs", src, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, "f"), []byte(strconv.Itoa(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		ns, err := Of(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		clone, err := ns.Clone(unix.AT_FDCWD, src, 0)
		ns.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Unmount(src, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
		if err := shelf.Put("m"+strconv.Itoa(i), clone); err != nil {
			t.Fatal(err)
		}
		clone.Close()
	}
	if after := openFiles(t); after > before {
		t.Errorf("%d mounts on the shelf hold %d descriptors", n, after-before)
	}
	if mounted(t, filepath.Join(dir, "m0")) || mounted(t, dir) {
		t.Errorf("the shelf's mounts show in the host's table")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("the host sees %d entries in the shelf's directory", len(ents))
	}
	read := func(name string) (string, error) {
		f, err := shelf.Open(name)
		if err != nil {
			return "", err
		}
		defer f.Close()
		b, err := os.ReadFile("/proc/self/fd/" + strconv.Itoa(int(f.Fd())) + "/f")
		return string(b), err
	}
	for _, i := range []int{0, n - 1} {
		if got, err := read("m" + strconv.Itoa(i)); err != nil || got != strconv.Itoa(i) {
			t.Errorf("m%d: read %q, %v; want %q", i, got, err, strconv.Itoa(i))
		}
	}
	if err := shelf.Put("m0", nil); err == nil {
		t.Errorf("a second Put under a name taken succeeded")
	}

	held, err := shelf.Open("m1")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := shelf.Drop("m1"); err != nil {
		t.Fatal(err)
	}
	if _, err := read("m1"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Drop, Open = %v, want not exist", err)
	}
	if b, err := os.ReadFile("/proc/self/fd/" + strconv.Itoa(int(held.Fd())) + "/f"); err != nil || string(b) != "1" {
		t.Errorf("a descriptor opened before Drop read %q, %v", b, err)
	}
	if err := shelf.Drop("m1"); err != nil {
		t.Errorf("dropping a name twice: %v", err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := shelf.Open(bad); err == nil {
			t.Errorf("Open(%q) succeeded", bad)
		}
	}
}

// A closed shelf refuses calls instead of blocking, and Open finds nothing.
func TestShelfClosed(t *testing.T) {
	testutil.RequireRoot(t)
	shelf, err := NewShelf(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	shelf.Close()
	if err := shelf.Drop("x"); err == nil {
		t.Errorf("Drop on a closed shelf succeeded")
	}
	if _, err := shelf.Open("x"); err == nil {
		t.Errorf("Open on a closed shelf succeeded")
	}
	shelf.Close()
}
