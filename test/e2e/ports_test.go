package e2e

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/warrenhq/warren/internal/testutil"
)

// A sandbox with no network (the default) serves HTTP and WebSocket on its
// loopback; warren up reaches them through the API's /ports path and
// through `warren port-forward`, with the real container backend.
func TestUpPorts(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	c := &cluster{T: t, Bin: warrenBin(t), DataDir: t.TempDir(), Addr: freeAddr(t)}
	c.Start()
	t.Cleanup(c.CleanupSandboxes)
	tok, err := os.ReadFile(filepath.Join(c.DataDir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))

	id := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox"))
	if out := c.MustRun("exec", id, "--sh", "ls /sys/class/net"); out != "lo\n" {
		t.Fatalf("the sandbox's interfaces: %q, want lo only (no network)", out)
	}
	// busybox httpd on 8000; a static Go server (HTTP, WebSocket) on 8001,
	// copied in through the files API.
	c.MustRun("exec", id, "--sh", "mkdir -p /www && echo 'busybox in '$(hostname) > /www/index.html && "+
		"(httpd -f -p 127.0.0.1:8000 -h /www </dev/null >/dev/null 2>&1 &)")
	app := filepath.Join(t.TempDir(), "portapp")
	build := exec.Command("go", "build", "-o", app, "./testdata/portapp")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build portapp: %v\n%s", err, out)
	}
	c.MustRun("cp", app, id+":/portapp")
	c.MustRun("exec", id, "--sh", "chmod +x /portapp; (/portapp 127.0.0.1:8001 </dev/null >/tmp/portapp.log 2>&1 &)")

	get := func(url string, auth bool) (int, string) {
		req, _ := http.NewRequest("GET", url, nil)
		if auth {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	api := "http://" + c.Addr + "/v1/sandboxes/" + id + "/ports/"
	waitFor(t, "the servers in the sandbox", func() bool {
		s1, _ := get(api+"8000/", true)
		s2, _ := get(api+"8001/", true)
		return s1 == 200 && s2 == 200
	})
	if status, body := get(api+"8000/index.html", true); status != 200 || body != "busybox in "+id+"\n" {
		t.Errorf("/ports/8000: %d %q", status, body)
	}
	if status, body := get(api+"8001/headers", true); status != 200 || strings.Contains(body, token) || strings.Contains(body, "Authorization") {
		t.Errorf("/ports/8001/headers: %d %s; want no Authorization in the sandbox", status, body)
	}
	if status, _ := get(api+"8000/", false); status != 401 {
		t.Errorf("/ports without a token: %d, want 401", status)
	}
	if status, body := get(api+"8002/", true); status != 502 || !strings.Contains(body, "port_unreachable") {
		t.Errorf("/ports/8002 with nothing listening: %d %s", status, body)
	}

	// WebSocket through the API.
	cfg, _ := websocket.NewConfig("ws://"+c.Addr+"/v1/sandboxes/"+id+"/ports/8001/ws", "http://localhost/")
	cfg.Header = http.Header{"Authorization": {"Bearer " + token}}
	ws, err := websocket.DialConfig(cfg)
	if err != nil {
		t.Fatalf("websocket through /ports: %v", err)
	}
	ws.Write([]byte("over the wire"))
	msg := make([]byte, len("over the wire"))
	if _, err := io.ReadFull(ws, msg); err != nil || string(msg) != "over the wire" {
		t.Errorf("websocket echo: %q, %v", msg, err)
	}
	ws.Close()

	// warren port-forward: both ports on free local ones, until Ctrl-C.
	pf := exec.Command(c.Bin, "port-forward", id, ":8000", ":8001")
	pf.Env = append(os.Environ(), "WARREN_ADDR="+c.Addr, "WARREN_DATA_DIR="+c.DataDir, "WARREN_TOKEN=")
	out, err := pf.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var pfErr strings.Builder
	pf.Stderr = &pfErr
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer pf.Process.Kill()
	re := regexp.MustCompile(`^Forwarding from (127\.0\.0\.1:\d+) -> (800[01])$`)
	local := map[string]string{}
	sc := bufio.NewScanner(out)
	for len(local) < 2 && sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			local[m[2]] = m[1]
		}
	}
	if len(local) < 2 {
		t.Fatalf("port-forward printed no forwards; stderr %s", pfErr.String())
	}
	if status, body := get("http://"+local["8000"]+"/index.html", false); status != 200 || body != "busybox in "+id+"\n" {
		t.Errorf("port-forward 8000: %d %q", status, body)
	}
	cfg, _ = websocket.NewConfig("ws://"+local["8001"]+"/ws", "http://localhost/")
	if ws, err = websocket.DialConfig(cfg); err != nil {
		t.Fatalf("websocket through port-forward: %v", err)
	}
	ws.Write([]byte("forwarded"))
	msg = make([]byte, len("forwarded"))
	if _, err := io.ReadFull(ws, msg); err != nil || string(msg) != "forwarded" {
		t.Errorf("websocket echo through port-forward: %q, %v", msg, err)
	}
	ws.Close()
	pf.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- pf.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("port-forward after Ctrl-C: %v, stderr %s; want exit 0", err, pfErr.String())
		}
	case <-time.After(10 * time.Second):
		t.Error("port-forward did not end within 10s of Ctrl-C")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testutil.Scale(20 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
