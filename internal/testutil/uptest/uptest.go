// Package uptest runs the warren binary the way a user does, for tests
// that treat the platform as a whole: `warren up` as its own process and
// the CLI's verbs against it (test/e2e, test/hostile).
package uptest

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/testutil"
)

// Bin builds cmd/warren into a temporary directory of t, with build tags
// such as warrenfake (`warren agent --backend fake`), and returns its
// path. Its helpers (warren-enter, warren-fninit) are on PATH
// (testutil.Helpers).
func Bin(t *testing.T, tags ...string) string {
	t.Helper()
	testutil.Helpers(t)
	testutil.GuestAgent(t) // for microVMs
	bin := filepath.Join(t.TempDir(), "warren")
	cmd := exec.Command("go", "build", "-tags", strings.Join(tags, ","), "-o", bin, "github.com/warrenhq/warren/cmd/warren")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// FreeAddr returns a loopback address nothing listens on now.
func FreeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Up is one `warren up` process and the CLI pointed at it.
type Up struct {
	T       *testing.T
	Bin     string   // the warren binary (Bin)
	DataDir string   // --data-dir
	Addr    string   // --listen
	Args    []string // more flags for `warren up`
	Env     []string // more environment for CLI verbs (later entries win)

	Cmd *exec.Cmd            // the running `warren up`, after Start
	Log *testutil.SyncBuffer // its stdout and stderr
}

// New returns an Up on a fresh binary, data directory and address, not
// started yet.
func New(t *testing.T, args ...string) *Up {
	u := &Up{T: t, Bin: Bin(t), DataDir: t.TempDir(), Addr: FreeAddr(t), Args: args}
	testutil.Searchable(t, u.DataDir)
	return u
}

// Start runs `warren up` with u.Args and waits until it answers.
func (u *Up) Start() { u.StartWith() }

// StartWith is Start with more `warren up` flags.
func (u *Up) StartWith(extra ...string) {
	u.T.Helper()
	u.Log = &testutil.SyncBuffer{}
	args := append([]string{"up", "--data-dir", u.DataDir, "--listen", u.Addr}, u.Args...)
	u.Cmd = exec.Command(u.Bin, append(args, extra...)...)
	u.Cmd.Stdout, u.Cmd.Stderr = u.Log, u.Log
	if err := u.Cmd.Start(); err != nil {
		u.T.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if _, _, code := u.Run("node", "ls"); code == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	u.T.Fatalf("warren up did not come up:\n%s", u.Log)
}

// CleanupSandboxes leaves nothing running, whatever a test did: it removes
// every sandbox, stops warren up and logs its output if the test failed.
func (u *Up) CleanupSandboxes() {
	if ids, _, code := u.Run("sandbox", "ls", "-o", "id"); code == 0 && strings.TrimSpace(ids) != "" {
		u.Run(append([]string{"sandbox", "rm"}, strings.Fields(ids)...)...)
	}
	u.Stop()
	if u.T.Failed() {
		u.T.Logf("warren up log:\n%s", u.Log)
	}
}

// Kill9 kills `warren up` the hard way: no cleanup runs.
func (u *Up) Kill9() {
	u.Cmd.Process.Signal(syscall.SIGKILL)
	u.Cmd.Wait()
}

// Stop ends `warren up` with SIGTERM, and SIGKILL after 20 s.
func (u *Up) Stop() {
	if u.Cmd == nil || u.Cmd.ProcessState != nil {
		return
	}
	u.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { u.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		u.Kill9()
	}
}

// Run runs a CLI verb against the cluster.
func (u *Up) Run(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	cmd := exec.Command(u.Bin, args...)
	cmd.Env = append(append(os.Environ(), "WARREN_ADDR="+u.Addr, "WARREN_DATA_DIR="+u.DataDir, "WARREN_TOKEN="), u.Env...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		u.T.Fatalf("%v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// MustRun is Run for a verb that must succeed; it returns its stdout.
func (u *Up) MustRun(args ...string) string {
	u.T.Helper()
	out, errs, code := u.Run(args...)
	if code != 0 {
		u.T.Fatalf("warren %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// Token is the admin token `warren up` wrote into its data directory.
func (u *Up) Token() string {
	b, err := os.ReadFile(filepath.Join(u.DataDir, "admin-token"))
	if err != nil {
		u.T.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
