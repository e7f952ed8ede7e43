// Package testutil holds helpers for tests that need privileges or host
// features. Each Require* helper skips on a developer laptop that lacks the
// feature, but FAILS when WARREN_TEST_STRICT=1 (CI sets it), so a test that
// CI is meant to run can never pass there by skipping.
package testutil

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Strict reports whether missing host features must fail tests.
func Strict() bool { return os.Getenv("WARREN_TEST_STRICT") == "1" }

// Unavailable skips t, or fails it in strict mode, saying why.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if Strict() {
		t.Fatalf("WARREN_TEST_STRICT=1 but: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireRoot needs uid 0.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root")
	}
}

// RequireBinary needs each named program on PATH.
func RequireBinary(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			Unavailable(t, "needs %s on PATH (scripts/setup installs it)", n)
		}
	}
}

// RequireKernelFeature needs a filesystem type the kernel knows, such as
// "erofs", "overlay" or "fuse".
func RequireKernelFeature(t testing.TB, fs string) {
	t.Helper()
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		Unavailable(t, "cannot read /proc/filesystems: %v", err)
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[len(f)-1] == fs {
			return
		}
	}
	Unavailable(t, "kernel lacks %s", fs)
}

// RequireContainers needs what the container backend needs: root, runc,
// mkfs.erofs, catatonit, the trusted shell (bash-static), overlay and
// erofs; and it builds warren's helpers (Helpers).
func RequireContainers(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	RequireBinary(t, "runc", "mkfs.erofs", "catatonit", "bash-static")
	RequireKernelFeature(t, "overlay")
	RequireKernelFeature(t, "erofs")
	Helpers(t)
}

// RequireQEMU needs qemu-system-x86_64 (Debian's qemu-system-x86;
// scripts/test-cgroup-v2 installs it). No /dev/kvm is needed: QEMU falls
// back to TCG.
func RequireQEMU(t testing.TB) {
	t.Helper()
	RequireBinary(t, "qemu-system-x86_64")
}

// TimeScaleEnv names how many times slower than a real host this one
// runs: scripts/test-cgroup-v2 sets it for tests inside a QEMU guest under
// TCG, where a memory cgroup's OOM kill takes minutes (the sandbox's own
// file pages are evicted and refaulted through emulated I/O before the
// kernel gives up), on cgroup v1 and v2 alike.
const TimeScaleEnv = "WARREN_TEST_TIME_SCALE"

// Scale stretches a timeout by WARREN_TEST_TIME_SCALE (default 1, and
// never below 1). Use it for bounds that wait on the kernel, not for
// bounds a test asserts as behaviour.
func Scale(d time.Duration) time.Duration {
	f, err := strconv.ParseFloat(os.Getenv(TimeScaleEnv), 64)
	if err != nil || f < 1 {
		return d
	}
	return time.Duration(float64(d) * f)
}

// SyncBuffer is a bytes.Buffer safe for concurrent writes and reads: a
// log or a subprocess's output that a test reads while it is written.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var helpers struct {
	once sync.Once
	dir  string
	err  error
}

// Helpers builds warren's C helpers (warren-enter, warren-fninit; see
// scripts/build-helpers) once per test process, into a directory keyed by
// their sources so that later runs reuse it, puts that directory first in
// PATH (where hostbin.Find looks, in this process and the ones it starts)
// and returns it. RequireContainers calls it.
func Helpers(t testing.TB) string {
	t.Helper()
	helpers.once.Do(func() { helpers.dir, helpers.err = buildHelpers() })
	if helpers.err != nil {
		t.Fatalf("build warren's helpers: %v", helpers.err)
	}
	return helpers.dir
}

func buildHelpers() (string, error) {
	root, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for !exists(filepath.Join(root, "scripts", "build-helpers")) {
		if root == "/" {
			return "", errors.New("scripts/build-helpers not found above the working directory")
		}
		root = filepath.Dir(root)
	}
	h := sha256.New()
	for _, f := range []string{"scripts/build-helpers", "cmd/warren-enter/enter.c", "cmd/warren-fninit/fninit.c"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("warren-helpers-%x", h.Sum(nil)[:8]))
	if !exists(filepath.Join(dir, "warren-enter")) {
		tmp, err := os.MkdirTemp(os.TempDir(), "warren-helpers-build-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(tmp)
		if out, err := exec.Command(filepath.Join(root, "scripts", "build-helpers"), tmp).CombinedOutput(); err != nil {
			return "", fmt.Errorf("%v\n%s", err, out)
		}
		// Another test process may have won the race: either is fine.
		if err := os.Rename(tmp, dir); err != nil && !exists(filepath.Join(dir, "warren-enter")) {
			return "", err
		}
	}
	return dir, os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Searchable makes dir and every directory above it searchable by other
// users (o+x), as a sandbox's root in a user namespace needs of the
// directories above a container backend's state directory: t.TempDir's
// are 0700.
func Searchable(t testing.TB, dir string) {
	t.Helper()
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				t.Fatal(err)
			}
		}
	}
}

var guestAgent struct {
	once sync.Once
	path string
	err  error
}

// VMDiskEnv names a bootable disk image (qcow2) whose display's console
// logs in by itself, for the vm backend's tests: scripts/build-vm-disk
// builds one and prints its path.
const VMDiskEnv = "WARREN_VM_DISK"

// VMReady is what that image's tty1 login shell writes to its serial
// port once it takes input.
const VMReady = "warren-vm: shell ready on tty1"

// GuestKernelEnv names a guest kernel for microVM tests: a vmlinuz, or an
// unpacked linux-image package (scripts/fetch-guest-kernel prints one).
const GuestKernelEnv = "WARREN_GUEST_KERNEL"

// GuestAgent builds warren-guest (guest/agent, static) once per test
// process from these sources, puts its directory first in PATH (where
// hostbin.Find looks, in this process and the ones it starts: a cached
// helpers directory's may be of other sources) and returns its path.
func GuestAgent(t testing.TB) string {
	t.Helper()
	guestAgent.once.Do(func() {
		root, err := repoRoot()
		if err != nil {
			guestAgent.err = err
			return
		}
		dir, err := os.MkdirTemp("", "warren-guest-")
		if err != nil {
			guestAgent.err = err
			return
		}
		guestAgent.path = filepath.Join(dir, "warren-guest")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s", "-o", guestAgent.path, "./guest/agent")
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			guestAgent.err = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if guestAgent.err != nil {
		t.Fatalf("build warren-guest: %v", guestAgent.err)
	}
	dir := filepath.Dir(guestAgent.path)
	if !strings.HasPrefix(os.Getenv("PATH"), dir+string(os.PathListSeparator)) {
		os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	return guestAgent.path
}

// repoRoot is the directory of go.mod above the working directory.
func repoRoot() (string, error) {
	root, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for !exists(filepath.Join(root, "go.mod")) {
		if root == "/" {
			return "", errors.New("go.mod not found above the working directory")
		}
		root = filepath.Dir(root)
	}
	return root, nil
}

// VMDiskWithAgent returns the disk image of VMDiskEnv with this source
// tree's warren-guest installed as a service (scripts/vm-disk-add-agent),
// made once per agent build and kept in the temporary directory. Unset
// VMDiskEnv is Unavailable.
func VMDiskWithAgent(t testing.TB) string {
	t.Helper()
	disk := os.Getenv(VMDiskEnv)
	if disk == "" {
		Unavailable(t, "set %s to a disk image (scripts/build-vm-disk builds one)", VMDiskEnv)
		return ""
	}
	agent := GuestAgent(t)
	b, err := os.ReadFile(agent)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	out := filepath.Join(os.TempDir(), fmt.Sprintf("warren-vm-agent-%x-%s", sum[:6], filepath.Base(disk)))
	if exists(out) {
		return out
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmp := fmt.Sprintf("%s.tmp%d", out, os.Getpid())
	cmd := exec.Command(filepath.Join(root, "scripts", "vm-disk-add-agent"), disk, tmp, "--agent", agent)
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		t.Fatalf("vm-disk-add-agent: %v\n%s", err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		t.Fatal(err)
	}
	return out
}
