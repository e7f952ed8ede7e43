// Package e2e runs the warren binary the way a user does: `warren up` as its
// own process, the CLI verbs against it, a kill -9 and a restart in the
// middle, and checks that deleting leaves nothing behind on the host.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
	"github.com/warrenhq/warren/internal/testutil/uptest"
)

// cluster is one `warren up` and the CLI against it (package uptest,
// shared with test/hostile).
type cluster = uptest.Up

var (
	warrenBin = uptest.Bin
	freeAddr  = uptest.FreeAddr
)

func TestUpEndToEnd(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	c := &cluster{T: t, Bin: warrenBin(t), DataDir: t.TempDir(), Addr: freeAddr(t)}
	c.Start()
	t.Cleanup(c.CleanupSandboxes)

	// create -o json
	var sb api.Sandbox
	out := c.MustRun("sandbox", "create", "--image", "busybox", "--cpu", "1", "--memory", "256Mi", "--ttl", "30m", "--label", "task=demo", "-o", "json")
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		t.Fatalf("create -o json: %v\n%s", err, out)
	}
	if sb.State != api.StateRunning || sb.Resources.Memory != 256<<20 || sb.Labels["task"] != "demo" {
		t.Fatalf("created %+v", sb)
	}
	other := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox"))

	// exec: both streams, exit code.
	stdout, stderr, code := c.Run("exec", sb.ID, "--", "sh", "-c", "echo hello; echo oops >&2; exit 3")
	if stdout != "hello\n" || !strings.Contains(stderr, "oops") || code != 3 {
		t.Errorf("exec: stdout %q stderr %q code %d; want hello, oops, 3", stdout, stderr, code)
	}
	// exec timeout: killed at 2s and reported.
	start := time.Now()
	_, stderr, code = c.Run("exec", sb.ID, "--timeout", "2s", "--", "sleep", "60")
	if took := time.Since(start); code != 124 || !strings.Contains(stderr, "timed out") || took > 15*time.Second {
		t.Errorf("exec --timeout 2s sleep 60: code %d after %v, stderr %q; want 124 and timed out", code, took, stderr)
	}
	// Isolation as the sandbox sees it.
	out = c.MustRun("exec", sb.ID, "--sh", "hostname; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; ls /sys/class/net")
	for _, want := range []string{sb.ID, "Seccomp:\t2", "NoNewPrivs:\t1", "lo"} {
		if !strings.Contains(out, want) {
			t.Errorf("inside the sandbox, missing %q in:\n%s", want, out)
		}
	}

	// cp a directory in, and a file out.
	local := t.TempDir()
	os.MkdirAll(filepath.Join(local, "dir", "sub"), 0o755)
	os.WriteFile(filepath.Join(local, "dir", "a.txt"), []byte("alpha\n"), 0o644)
	os.WriteFile(filepath.Join(local, "dir", "sub", "b.txt"), []byte("beta\n"), 0o600)
	c.MustRun("cp", filepath.Join(local, "dir"), sb.ID+":/work")
	c.MustRun("exec", sb.ID, "-w", "/work", "--sh", "cat a.txt sub/b.txt > out.txt")
	c.MustRun("cp", sb.ID+":/work/out.txt", local)
	if b, err := os.ReadFile(filepath.Join(local, "out.txt")); err != nil || string(b) != "alpha\nbeta\n" {
		t.Errorf("cp out: %q, %v", b, err)
	}

	// ls with a label filter.
	var list api.SandboxList
	if err := json.Unmarshal([]byte(c.MustRun("sandbox", "ls", "--label", "task=demo", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Errorf("ls --label task=demo: %+v", list.Sandboxes)
	}

	// Errors with stable codes.
	if _, stderr, code := c.Run("sandbox", "create", "--image", "nope"); code != 1 || !strings.Contains(stderr, "image_not_found") {
		t.Errorf("unknown image: code %d, %q", code, stderr)
	}

	// kill -9 warren up: sandboxes keep running and come back.
	c.MustRun("exec", sb.ID, "--sh", "echo kept > /root/state; sleep 1000 >/dev/null 2>&1 &")
	c.Kill9()
	c.Start()
	out = c.MustRun("exec", sb.ID, "--sh", "cat /root/state; ps | grep -q '[s]leep 1000' && echo bg-alive")
	if out != "kept\nbg-alive\n" {
		t.Errorf("after kill -9 and restart: %q, want the file and the background process", out)
	}
	if !strings.Contains(c.Log.String(), "re-adopted") {
		t.Errorf("restart log does not mention re-adoption:\n%s", c.Log)
	}

	// rm, twice; then nothing of either sandbox remains on the host.
	c.MustRun("sandbox", "rm", sb.ID, other)
	c.MustRun("sandbox", "rm", sb.ID)
	if out := c.MustRun("sandbox", "ls", "-o", "json"); strings.Contains(out, sb.ID) {
		t.Errorf("ls after rm still shows %s", sb.ID)
	}
	for _, id := range []string{sb.ID, other} {
		assertNoTrace(t, c.DataDir, id)
	}
}

// assertNoTrace checks that nothing of sandbox id remains: mounts, cgroups,
// runc state, directories or processes.
func assertNoTrace(t *testing.T, dataDir, id string) {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), id) {
			t.Errorf("mount left for %s: %s", id, sc.Text())
		}
	}
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Contains(d.Name(), id) {
			t.Errorf("cgroup left for %s: %s", id, p)
			return filepath.SkipDir
		}
		return nil
	})
	filepath.WalkDir(dataDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), id) {
			t.Errorf("file left for %s: %s", id, p)
		}
		return nil
	})
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		// A zombie has exited; only its parent (often the host's init,
		// which the sandbox's init was reparented to) has yet to reap it.
		if st, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat")); err == nil && isZombie(st) {
			continue
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(id)) {
			t.Errorf("process left in %s's cgroup: %s", id, p)
		}
	}

}

// isZombie reads the state field of /proc/<pid>/stat.
func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}
