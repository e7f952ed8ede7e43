package mountns

import (
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
