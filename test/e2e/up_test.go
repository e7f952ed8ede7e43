// Package e2e runs the warren binary the way a user does: `warren up` as its
// own process, the CLI verbs against it, a kill -9 and a restart in the
// middle, and checks that deleting leaves nothing behind on the host.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// warrenBin builds the binary once per test run, with build tags such as
// warrenfake (`warren agent --backend fake`).
func warrenBin(t *testing.T, tags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "warren")
	cmd := exec.Command("go", "build", "-tags", strings.Join(tags, ","), "-o", bin, "github.com/warrenhq/warren/cmd/warren")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type cluster struct {
	t       *testing.T
	bin     string
	dataDir string
	addr    string
	up      *exec.Cmd
	log     *bytes.Buffer
	args    []string // more flags for `warren up`
	env     []string // more environment for CLI verbs (later entries win)
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// start runs `warren up` with c.args and waits until it answers.
func (c *cluster) start() { c.startWith() }

// startWith is start with more `warren up` flags.
func (c *cluster) startWith(extra ...string) {
	c.t.Helper()
	c.log = &bytes.Buffer{}
	args := append([]string{"up", "--data-dir", c.dataDir, "--listen", c.addr}, c.args...)
	c.up = exec.Command(c.bin, append(args, extra...)...)
	c.up.Stdout, c.up.Stderr = c.log, c.log
	if err := c.up.Start(); err != nil {
		c.t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if _, _, code := c.run("node", "ls"); code == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("warren up did not come up:\n%s", c.log)
}

// cleanupSandboxes leaves nothing running, whatever a test did: it removes
// every sandbox, stops warren up and logs its output if the test failed.
func (c *cluster) cleanupSandboxes() {
	if ids, _, code := c.run("sandbox", "ls", "-o", "id"); code == 0 && strings.TrimSpace(ids) != "" {
		c.run(append([]string{"sandbox", "rm"}, strings.Fields(ids)...)...)
	}
	c.stop()
	if c.t.Failed() {
		c.t.Logf("warren up log:\n%s", c.log)
	}
}

// kill9 kills `warren up` the hard way: no cleanup runs.
func (c *cluster) kill9() {
	c.up.Process.Signal(syscall.SIGKILL)
	c.up.Wait()
}

func (c *cluster) stop() {
	if c.up == nil || c.up.ProcessState != nil {
		return
	}
	c.up.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.up.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		c.kill9()
	}
}

// run runs a CLI verb against the cluster.
func (c *cluster) run(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	cmd := exec.Command(c.bin, args...)
	cmd.Env = append(append(os.Environ(), "WARREN_ADDR="+c.addr, "WARREN_DATA_DIR="+c.dataDir, "WARREN_TOKEN="), c.env...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("%v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func (c *cluster) mustRun(args ...string) string {
	c.t.Helper()
	out, errs, code := c.run(args...)
	if code != 0 {
		c.t.Fatalf("warren %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

func TestUpEndToEnd(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	c := &cluster{t: t, bin: warrenBin(t), dataDir: t.TempDir(), addr: freeAddr(t)}
	c.start()
	t.Cleanup(c.cleanupSandboxes)

	// create -o json
	var sb api.Sandbox
	out := c.mustRun("sandbox", "create", "--image", "busybox", "--cpu", "1", "--memory", "256Mi", "--ttl", "30m", "--label", "task=demo", "-o", "json")
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		t.Fatalf("create -o json: %v\n%s", err, out)
	}
	if sb.State != api.StateRunning || sb.Resources.Memory != 256<<20 || sb.Labels["task"] != "demo" {
		t.Fatalf("created %+v", sb)
	}
	other := strings.TrimSpace(c.mustRun("sandbox", "create", "--image", "busybox"))

	// exec: both streams, exit code.
	stdout, stderr, code := c.run("exec", sb.ID, "--", "sh", "-c", "echo hello; echo oops >&2; exit 3")
	if stdout != "hello\n" || !strings.Contains(stderr, "oops") || code != 3 {
		t.Errorf("exec: stdout %q stderr %q code %d; want hello, oops, 3", stdout, stderr, code)
	}
	// exec timeout: killed at 2s and reported.
	start := time.Now()
	_, stderr, code = c.run("exec", sb.ID, "--timeout", "2s", "--", "sleep", "60")
	if took := time.Since(start); code != 124 || !strings.Contains(stderr, "timed out") || took > 15*time.Second {
		t.Errorf("exec --timeout 2s sleep 60: code %d after %v, stderr %q; want 124 and timed out", code, took, stderr)
	}
	// Isolation as the sandbox sees it.
	out = c.mustRun("exec", sb.ID, "--sh", "hostname; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; ls /sys/class/net")
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
	c.mustRun("cp", filepath.Join(local, "dir"), sb.ID+":/work")
	c.mustRun("exec", sb.ID, "-w", "/work", "--sh", "cat a.txt sub/b.txt > out.txt")
	c.mustRun("cp", sb.ID+":/work/out.txt", local)
	if b, err := os.ReadFile(filepath.Join(local, "out.txt")); err != nil || string(b) != "alpha\nbeta\n" {
		t.Errorf("cp out: %q, %v", b, err)
	}

	// ls with a label filter.
	var list api.SandboxList
	if err := json.Unmarshal([]byte(c.mustRun("sandbox", "ls", "--label", "task=demo", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Errorf("ls --label task=demo: %+v", list.Sandboxes)
	}

	// Errors with stable codes.
	if _, stderr, code := c.run("sandbox", "create", "--image", "nope"); code != 1 || !strings.Contains(stderr, "image_not_found") {
		t.Errorf("unknown image: code %d, %q", code, stderr)
	}

	// kill -9 warren up: sandboxes keep running and come back.
	c.mustRun("exec", sb.ID, "--sh", "echo kept > /root/state; sleep 1000 >/dev/null 2>&1 &")
	c.kill9()
	c.start()
	out = c.mustRun("exec", sb.ID, "--sh", "cat /root/state; ps | grep -q '[s]leep 1000' && echo bg-alive")
	if out != "kept\nbg-alive\n" {
		t.Errorf("after kill -9 and restart: %q, want the file and the background process", out)
	}
	if !strings.Contains(c.log.String(), "re-adopted") {
		t.Errorf("restart log does not mention re-adoption:\n%s", c.log)
	}

	// rm, twice; then nothing of either sandbox remains on the host.
	c.mustRun("sandbox", "rm", sb.ID, other)
	c.mustRun("sandbox", "rm", sb.ID)
	if out := c.mustRun("sandbox", "ls", "-o", "json"); strings.Contains(out, sb.ID) {
		t.Errorf("ls after rm still shows %s", sb.ID)
	}
	for _, id := range []string{sb.ID, other} {
		assertNoTrace(t, c.dataDir, id)
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
