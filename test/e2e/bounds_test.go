package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// statusKB reads one "Name:   N kB" line of /proc/PID/status.
func statusKB(t *testing.T, pid int, name string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", name, l)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return 0
}

// TestUpExecMemoryFlat runs `warren up` as its own process and, in a real
// container, execs that write 400 MB to stdout and 200 MB to stderr with
// the maximum max_output, buffered and streamed. The process's peak RSS
// (VmHWM, reset before each exec) may not grow past +64 MiB: output is
// spooled to the data dir and streamed back, never held (it took 2.3 GB
// with max_output 1Gi before). An oversized input is refused with 400.
func TestUpExecMemoryFlat(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	c := &cluster{T: t, Bin: warrenBin(t), DataDir: t.TempDir(), Addr: freeAddr(t)}
	c.Start()
	t.Cleanup(c.CleanupSandboxes)
	tok, err := os.ReadFile(filepath.Join(c.DataDir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	post := func(path string, body any) *http.Response {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", "http://"+c.Addr+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	id := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox", "--memory", "256Mi"))
	pid := c.Cmd.Process.Pid

	resp := post("/v1/sandboxes/"+id+"/exec", api.ExecRequest{Argv: []string{"true"}, MaxOutput: 1 << 30})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), api.CodeTooLarge) {
		t.Errorf("max_output 1Gi: %d %s, want 400 %s", resp.StatusCode, b, api.CodeTooLarge)
	}

	script := `yes 'a line of output, "quoted", <tagged> & tabbed	here' | head -c 400000000; yes e | head -c 200000000 >&2`
	for _, stream := range []bool{false, true} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
			t.Fatalf("reset VmHWM: %v", err)
		}
		base := statusKB(t, pid, "VmHWM")
		start := time.Now()
		resp := post("/v1/sandboxes/"+id+"/exec", api.ExecRequest{Argv: []string{"sh", "-c", script}, MaxOutput: api.MaxExecOutput, Stream: stream, Timeout: api.Duration(5 * time.Minute)})
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || n < 2*api.MaxExecOutput {
			t.Fatalf("stream=%v: %d, %d bytes, %v; want 200 and both streams at max_output", stream, resp.StatusCode, n, err)
		}
		peak := statusKB(t, pid, "VmHWM")
		t.Logf("stream=%v: %d MB answer in %v; warren up peak RSS %d MiB before, %d MiB during (+%d MiB)",
			stream, n/1e6, time.Since(start).Round(time.Millisecond), base>>10, peak>>10, (peak-base)>>10)
		if peak-base > 64<<10 {
			t.Errorf("stream=%v: warren up's peak RSS grew by %d MiB during the exec, want at most 64 MiB", stream, (peak-base)>>10)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(c.DataDir, "node", "spool")); len(ents) != 0 {
		t.Errorf("spool dir holds %d files after the execs, want none", len(ents))
	}
}
