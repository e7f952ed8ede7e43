package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/testutil"
)

func TestPortForward(t *testing.T) {
	agent, fb := nodetest.NewFake(t, nil)
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: agent, Images: imagetest.Busybox, Tokens: apiserver.StaticToken("tok"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	t.Cleanup(srv.Close)
	sb, err := agent.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	nodetest.ServePorts(t, fb, sb.ID, 8000, 9000)
	vars := map[string]string{"WARREN_ADDR": srv.URL, "WARREN_TOKEN": "tok", "WARREN_DATA_DIR": t.TempDir()}
	start := func(args ...string) (stdout, stderr *testutil.SyncBuffer, stop func() int) {
		stdout, stderr = &testutil.SyncBuffer{}, &testutil.SyncBuffer{}
		a := &app{stdin: strings.NewReader(""), stdout: stdout, stderr: stderr, getenv: func(k string) string { return vars[k] }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() { done <- run(ctx, append([]string{"port-forward"}, args...), a) }()
		return stdout, stderr, func() int { cancel(); return <-done }
	}

	stdout, stderr, stop := start(sb.ID, ":8000", "0:9000")
	re := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) -> (\d+)`)
	var m [][]string
	deadline := time.Now().Add(10 * time.Second)
	for m = re.FindAllStringSubmatch(stdout.String(), -1); len(m) < 2; m = re.FindAllStringSubmatch(stdout.String(), -1) {
		if time.Now().After(deadline) {
			t.Fatalf("port-forward printed %q, stderr %q", stdout, stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m[0][2] != "8000" || m[1][2] != "9000" {
		t.Fatalf("forwards: %q", stdout)
	}
	// HTTP, over one kept connection: one tunnel for many requests.
	for range 3 {
		resp, err := http.Get("http://" + m[0][1] + "/hello?x=1")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `"request_uri":"/hello?x=1"`) || resp.Header.Get("X-App-Sandbox") != sb.ID {
			t.Errorf("GET through port-forward: %d %s", resp.StatusCode, b)
		}
	}
	// TCP, half-closed.
	c, err := net.Dial("tcp", m[1][1])
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "abcd")
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, _ := io.ReadAll(c)
	c.Close()
	if want := "hello " + sb.ID + "\ngot 4\n"; string(all) != want {
		t.Errorf("TCP through port-forward: %q, want %q", all, want)
	}
	if code := stop(); code != 0 {
		t.Errorf("Ctrl-C: exit %d, stderr %q; want 0", code, stderr)
	}
	if _, err := net.Dial("tcp", m[0][1]); err == nil {
		t.Error("still listening after Ctrl-C")
	}

	// Nothing listening inside: that connection fails, forwarding goes on.
	stdout, stderr, stop = start(sb.ID, ":8001")
	for !strings.Contains(stdout.String(), "Forwarding from") {
		time.Sleep(10 * time.Millisecond)
	}
	addr := re.FindStringSubmatch(stdout.String())[1]
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.ReadAll(c)
	c.Close()
	if !strings.Contains(stderr.String(), "port_unreachable") {
		t.Errorf("stderr %q, want the port_unreachable of that connection", stderr)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit %d after a failed connection, want 0", code)
	}

	// Usage errors, and a sandbox that does not exist.
	for _, args := range [][]string{{sb.ID}, {sb.ID, "abc"}, {sb.ID, "0"}, {sb.ID, "8080:70000"}, {sb.ID, "1:2:3"}, {sb.ID, "-1:80"}} {
		_, stderr, stop := start(args...)
		if code := stop(); code != 2 {
			t.Errorf("port-forward %q: exit %d (%s), want 2", args, code, stderr)
		}
	}
	_, stderr, stop = start("n1-aaaaaaaaaaaaaaaa", "8000")
	time.Sleep(500 * time.Millisecond) // it ends on its own
	if code := stop(); code != 1 || !strings.Contains(stderr.String(), "sandbox_not_found") {
		t.Errorf("port-forward to a missing sandbox: exit %d, %q", code, stderr)
	}
}
