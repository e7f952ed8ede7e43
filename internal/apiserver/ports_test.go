package apiserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodetest"
)

// A sandbox's ports take the rights of exec: a reader is refused, a
// sandbox of another project is missing, a bad port is 400 whatever the
// sandbox.
func TestPortsAuthorization(t *testing.T) {
	h := newIAMHarness(t, nil)
	for _, p := range []string{"research", "research/a", "research/b"} {
		h.project(p, iam.Quota{})
	}
	sb := h.create(adminSecret, `{"image":"busybox","project":"research/a"}`)
	theirs := h.create(adminSecret, `{"image":"busybox","project":"research/b"}`)
	nodetest.ServePorts(t, h.fake, sb.ID, 8000, 9000)
	nodetest.ServePorts(t, h.fake, theirs.ID, 8000, 9000)
	reader, runner := h.token("research/a", iam.RoleReader), h.token("research/a", iam.RoleRunner)

	for _, method := range []string{"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
		for _, path := range []string{"/ports/8000/x", "/ports/8000/", "/ports/8000"} {
			if a := h.do(reader, method, "/v1/sandboxes/"+sb.ID+path, ""); a.status != http.StatusForbidden || a.code(t) != api.CodeForbidden {
				t.Errorf("%s %s as a reader: %d %s, want 403", method, path, a.status, a.body)
			}
			a := h.do(runner, method, "/v1/sandboxes/"+sb.ID+path, "")
			if a.status != http.StatusOK || a.header.Get(api.PortResponseHeader) == "" {
				t.Errorf("%s %s as a runner: %d %s, want the app's 200", method, path, a.status, a.body)
			}
			if a := h.do(runner, method, "/v1/sandboxes/"+theirs.ID+path, ""); a.status != http.StatusNotFound || a.code(t) != api.CodeSandboxNotFound {
				t.Errorf("%s %s of another project's sandbox: %d %s, want 404 sandbox_not_found", method, path, a.status, a.body)
			}
		}
	}
	tunnel := "/v1/sandboxes/" + sb.ID + "/portforward/9000"
	if c, _, resp, b := nodetest.DialTunnel(t, h.url, tunnel, reader); c != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("tunnel as a reader: %d %s, want 403", resp.StatusCode, b)
	}
	if c, _, resp, b := nodetest.DialTunnel(t, h.url, "/v1/sandboxes/"+theirs.ID+"/portforward/9000", runner); c != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("tunnel to another project's sandbox: %d %s, want 404", resp.StatusCode, b)
	}
	if c, _, resp, b := nodetest.DialTunnel(t, h.url, tunnel, runner); c == nil {
		t.Errorf("tunnel as a runner: %d %s, want 101", resp.StatusCode, b)
	}
	for _, path := range []string{"/ports/0/", "/ports/70000/x", "/ports/-1", "/ports/08000/", "/portforward/0", "/portforward/65536"} {
		for _, id := range []string{sb.ID, theirs.ID} {
			if a := h.do(runner, "GET", "/v1/sandboxes/"+id+path, ""); a.status != http.StatusBadRequest || a.code(t) != api.CodeInvalid {
				t.Errorf("GET %s: %d %s, want 400 invalid_argument", path, a.status, a.body)
			}
		}
	}
}

// Through the apiserver, on both paths to a node (in-process, and a
// Router over the node API): HTTP, the app's own errors, nothing
// listening, WebSocket and a half-closed tunnel; the caller's token never
// reaches the sandbox.
func TestPortsThroughTheAPI(t *testing.T) {
	t.Run("SingleNode", func(t *testing.T) {
		agent, fb := nodetest.NewFake(t, nil)
		srv := httptest.NewServer(apiserver.New(apiserver.Config{
			Node: agent, Images: imagetest.Busybox, Tokens: apiserver.StaticToken(token), Log: quietLog,
		}))
		t.Cleanup(srv.Close)
		h := &harness{t: t, url: srv.URL}
		checkPorts(t, h, fb)
	})
	t.Run("Router", func(t *testing.T) {
		var fb *fake.Backend
		f := newFleetWith(t, fleetOptions{node: func(id string, c *node.Config) {
			var err error
			if fb, err = fake.New(filepath.Join(t.TempDir(), "fake"), fake.Options{Name: api.BackendContainer}); err != nil {
				t.Fatal(err)
			}
			c.Backends = []backend.Backend{fb}
		}}, "n1")
		checkPorts(t, f.harness, fb)
	})
}

func checkPorts(t *testing.T, h *harness, fb *fake.Backend) {
	sb := h.create(`{"image":"busybox"}`)
	nodetest.ServePorts(t, fb, sb.ID, 8000, 9000)
	ports := "/v1/sandboxes/" + sb.ID + "/ports/8000"

	resp, b := h.do("POST", ports+"/some/path?q=1", "text/plain", strings.NewReader("hi"), "X-Custom", "v")
	var seen nodetest.Seen
	if resp.StatusCode != 200 || json.Unmarshal(b, &seen) != nil {
		t.Fatalf("POST through the API: %d %s", resp.StatusCode, b)
	}
	if seen.Method != "POST" || seen.RequestURI != "/some/path?q=1" || seen.Header.Get("X-Custom") != "v" || seen.Header.Get("Content-Type") != "text/plain" {
		t.Errorf("the app saw %+v", seen)
	}
	if v := seen.Header.Values("Authorization"); len(v) > 0 {
		t.Errorf("the app saw Authorization: %q", v)
	}
	if b, _ := json.Marshal(seen.Header); strings.Contains(string(b), token) {
		t.Errorf("the caller's token reached the app: %s", b)
	}
	if resp, b := h.do("GET", ports+"/status/404", "", nil); resp.StatusCode != 404 || string(b) != "status 404" {
		t.Errorf("the app's 404: %d %q", resp.StatusCode, b)
	}
	if resp, b := h.do("GET", "/v1/sandboxes/"+sb.ID+"/ports/8001/", "", nil); resp.StatusCode != http.StatusBadGateway || errorCode(t, b) != api.CodePortUnreachable {
		t.Errorf("nothing listening: %d %s, want 502 port_unreachable", resp.StatusCode, b)
	}
	const n = 32 << 20
	if resp, b := h.do("POST", ports+"/sum", "", io.LimitReader(nodetest.Pattern(), n)); resp.StatusCode != 200 || string(b) != nodetest.SumOf(n) {
		t.Errorf("POST 32 MiB: %d %q", resp.StatusCode, b)
	}

	ws, err := nodetest.DialWebSocket(t, h.url, ports+"/ws", token)
	if err != nil {
		t.Fatalf("websocket through the API: %v", err)
	}
	ws.Write([]byte("ping"))
	got := make([]byte, 4)
	if _, err := io.ReadFull(ws, got); err != nil || string(got) != "ping" {
		t.Errorf("websocket echo: %q, %v", got, err)
	}

	c, br, resp, b := nodetest.DialTunnel(t, h.url, "/v1/sandboxes/"+sb.ID+"/portforward/9000", token)
	if c == nil {
		t.Fatalf("tunnel through the API: %d %s", resp.StatusCode, b)
	}
	if l, _ := nodetest.ReadLine(br); l != "hello "+sb.ID {
		t.Errorf("greeting: %q", l)
	}
	io.Copy(c, io.LimitReader(nodetest.Pattern(), 1<<20))
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if l, err := nodetest.ReadLine(br); l != "got 1048576" {
		t.Errorf("after a half-close: %q, %v", l, err)
	}
	if c, _, resp, b := nodetest.DialTunnel(t, h.url, "/v1/sandboxes/"+sb.ID+"/portforward/9001", token); c != nil || resp.StatusCode != http.StatusBadGateway || errorCode(t, b) != api.CodePortUnreachable {
		t.Errorf("tunnel with nothing listening: %d %s, want 502 port_unreachable", resp.StatusCode, b)
	}
}

// The Go SDK's ports calls against the real API.
func TestPortsGoClient(t *testing.T) {
	agent, fb := nodetest.NewFake(t, nil)
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: agent, Images: imagetest.Busybox, Tokens: apiserver.StaticToken(token), Log: quietLog,
	}))
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, token)
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	nodetest.ServePorts(t, fb, sb.ID, 8000, 9000)

	if got, want := c.PortURL(sb.ID, 8000, "a/b?x=1"), srv.URL+"/v1/sandboxes/"+sb.ID+"/ports/8000/a/b?x=1"; got != want {
		t.Errorf("PortURL = %s, want %s", got, want)
	}
	resp, err := c.DoPort(ctx, "GET", sb.ID, 8000, "/status/404", nil, nil)
	if err != nil {
		t.Fatalf("DoPort to the app's 404: %v, want its answer", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || string(b) != "status 404" {
		t.Errorf("DoPort: %d %q", resp.StatusCode, b)
	}
	if _, err := c.DoPort(ctx, "GET", sb.ID, 8001, "/", nil, nil); !client.IsPortUnreachable(err) {
		t.Errorf("DoPort with nothing listening: %v, want port_unreachable", err)
	}
	if _, err := c.DialPort(ctx, sb.ID, 9001); !client.IsPortUnreachable(err) {
		t.Errorf("DialPort with nothing listening: %v, want port_unreachable", err)
	}
	if _, err := c.DialPort(ctx, "n1-aaaaaaaaaaaaaaaa", 9000); !client.IsSandboxNotFound(err) {
		t.Errorf("DialPort to a missing sandbox: %v, want sandbox_not_found", err)
	}

	conn, err := c.DialPort(ctx, sb.ID, 9000)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "12345")
	conn.(interface{ CloseWrite() error }).CloseWrite()
	all, err := io.ReadAll(conn)
	conn.Close()
	if want := "hello " + sb.ID + "\ngot 5\n"; err != nil || string(all) != want {
		t.Errorf("DialPort, half-closed: %q, %v; want %q", all, err, want)
	}

	// ForwardPort: a local port per tunnel, until the sandbox is gone.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.ForwardPort(ctx, ln, sb.ID, 8000, func(err error) { t.Logf("tunnel: %v", err) }) }()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for range 3 {
		r, err := hc.Get("http://" + ln.Addr().String() + "/some")
		if err != nil {
			t.Fatal(err)
		}
		var seen nodetest.Seen
		json.NewDecoder(r.Body).Decode(&seen)
		r.Body.Close()
		if seen.RequestURI != "/some" || r.Header.Get("X-App-Sandbox") != sb.ID {
			t.Errorf("through ForwardPort: %+v", seen)
		}
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	hc.Get("http://" + ln.Addr().String() + "/")
	select {
	case err := <-errc:
		if !client.IsSandboxNotFound(err) {
			t.Errorf("ForwardPort after the sandbox went: %v, want sandbox_not_found", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ForwardPort went on after its sandbox was deleted")
	}
	// A canceled context ends it with no error.
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	cctx, cancel := context.WithCancel(ctx)
	go func() { errc <- c.ForwardPort(cctx, ln2, sb.ID, 8000, nil) }()
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("ForwardPort canceled: %v, want nil", err)
	}
}

// The Go SDK opens tunnels over TLS to an API that would speak HTTP/2.
func TestPortsGoClientTLS(t *testing.T) {
	agent, fb := nodetest.NewFake(t, nil)
	srv := httptest.NewUnstartedServer(apiserver.New(apiserver.Config{
		Node: agent, Images: imagetest.Busybox, Tokens: apiserver.StaticToken(token), Log: quietLog,
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ctx := context.Background()
	tc := srv.Client().Transport.(*http.Transport).TLSClientConfig
	for name, c := range map[string]*client.Client{
		"WithTLSConfig":  client.New(srv.URL, token, client.WithTLSConfig(tc)),
		"WithHTTPClient": client.New(srv.URL, token, client.WithHTTPClient(srv.Client())),
	} {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		nodetest.ServePorts(t, fb, sb.ID, 8000, 9000)
		conn, err := c.DialPort(ctx, sb.ID, 9000)
		if err != nil {
			t.Fatalf("%s: DialPort over TLS: %v", name, err)
		}
		io.WriteString(conn, "xy")
		conn.(interface{ CloseWrite() error }).CloseWrite()
		all, _ := io.ReadAll(conn)
		conn.Close()
		if want := "hello " + sb.ID + "\ngot 2\n"; string(all) != want {
			t.Errorf("%s: tunnel over TLS: %q, want %q", name, all, want)
		}
		resp, err := c.DoPort(ctx, "GET", sb.ID, 8000, "/", nil, nil)
		if err != nil {
			t.Fatalf("%s: DoPort over TLS: %v", name, err)
		}
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Logf("%s: DoPort went over %s", name, resp.Proto)
		}
	}
	// Without the CA: a TLS error, not a hang.
	if _, err := client.New(srv.URL, token).DialPort(ctx, "n1-aaaaaaaaaaaaaaaa", 80); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Errorf("DialPort without trusting the server: %v, want a TLS error", err)
	}
}
