package nodeapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/node/nodetest"
)

// portsNode is a node API server over a fake sandbox running the port
// test app on 8000 (HTTP) and 9000 (TCP), and a forwarder in front of
// it: a server whose every call goes through Client.Forward, as an
// apiserver's do.
type portsNode struct {
	node, fwd string // base URLs
	id        string
	app       *nodetest.PortApp
}

func newPortsNode(t *testing.T) *portsNode {
	t.Helper()
	agent, b := nodetest.NewFake(t, nil)
	srv := httptest.NewServer(nodeapi.NewServer(agent, nodeapi.Secret(token), quiet))
	t.Cleanup(srv.Close)
	c := nodeapi.NewClient(agent.ID(), srv.URL, token, nil)
	sb := mustCreate(t, c, api.CreateSandboxRequest{})
	app := nodetest.ServePorts(t, b, sb.ID, 8000, 9000)
	fwd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := c.Forward(w, r)
		var cut *nodeapi.CutShort
		if errors.As(err, &cut) {
			panic(http.ErrAbortHandler)
		}
		if err != nil {
			httperr.Write(w, err)
		}
	}))
	t.Cleanup(fwd.Close)
	return &portsNode{node: srv.URL, fwd: fwd.URL, id: sb.ID, app: app}
}

// bases are the two ways in: the node itself, and through Forward with
// the caller's own token (which the forwarder replaces by the node's).
func (p *portsNode) bases() map[string][2]string {
	return map[string][2]string{"node": {p.node, token}, "forwarded": {p.fwd, "caller-token"}}
}

func doReq(t *testing.T, method, url, tok string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func errCode(t *testing.T, b []byte) string {
	t.Helper()
	var e api.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	return e.Error.Code
}

func TestPortsHTTP(t *testing.T) {
	p := newPortsNode(t)
	for name, bt := range p.bases() {
		base, tok := bt[0], bt[1]
		ports := base + "/v1/sandboxes/" + p.id + "/ports/8000"

		// Method, path (escapes kept), query and headers reach the app;
		// credentials never do; its Host is its own.
		resp, b := doReq(t, "PATCH", ports+"/echo/a%2Fb/?x=1&y=%20", tok, strings.NewReader("body"),
			"X-Custom", "v", "Cookie", "c=1", "Proxy-Authorization", "Basic eA==")
		var seen nodetest.Seen
		if resp.StatusCode != 200 || json.Unmarshal(b, &seen) != nil {
			t.Fatalf("%s: %d %s", name, resp.StatusCode, b)
		}
		if seen.Method != "PATCH" || seen.RequestURI != "/echo/a%2Fb/?x=1&y=%20" || seen.Host != "localhost:8000" {
			t.Errorf("%s: the app saw %s %s (Host %s); want PATCH /echo/a%%2Fb/?x=1&y=%%20, localhost:8000", name, seen.Method, seen.RequestURI, seen.Host)
		}
		if seen.Header.Get("X-Custom") != "v" || seen.Header.Get("Cookie") != "c=1" {
			t.Errorf("%s: the app saw headers %v; want X-Custom and Cookie", name, seen.Header)
		}
		for _, h := range []string{"Authorization", "Proxy-Authorization"} {
			if v := seen.Header.Values(h); len(v) > 0 {
				t.Errorf("%s: the app saw %s: %q", name, h, v)
			}
		}
		if resp.Header.Get(api.PortResponseHeader) == "" {
			t.Errorf("%s: the app's answer is not marked %s", name, api.PortResponseHeader)
		}
		// No path: the server's root.
		if _, b := doReq(t, "GET", ports, tok, nil); json.Unmarshal(b, &seen) != nil || seen.RequestURI != "/" {
			t.Errorf("%s: %s: the app saw %q, want /", name, ports, seen.RequestURI)
		}
		// The app's own errors pass as they are.
		if resp, b := doReq(t, "GET", ports+"/status/418", tok, nil); resp.StatusCode != 418 || string(b) != "status 418" || resp.Header.Get(api.PortResponseHeader) == "" {
			t.Errorf("%s: app's 418: %d %q", name, resp.StatusCode, b)
		}
		if resp, b := doReq(t, "GET", ports+"/status/502", tok, nil); resp.StatusCode != 502 || string(b) != "status 502" {
			t.Errorf("%s: app's 502: %d %q", name, resp.StatusCode, b)
		}

		// warren's errors are warren's.
		for _, tc := range []struct {
			path   string
			status int
			code   string
		}{
			{"/v1/sandboxes/" + p.id + "/ports/0/", 400, api.CodeInvalid},
			{"/v1/sandboxes/" + p.id + "/ports/70000/x", 400, api.CodeInvalid},
			{"/v1/sandboxes/" + p.id + "/ports/http/x", 400, api.CodeInvalid},
			{"/v1/sandboxes/" + p.id + "/ports/8001/", 502, api.CodePortUnreachable},
			{"/v1/sandboxes/n1-aaaaaaaaaaaaaaaa/ports/8000/", 404, api.CodeSandboxNotFound},
		} {
			resp, b := doReq(t, "GET", base+tc.path, tok, nil)
			if resp.StatusCode != tc.status || errCode(t, b) != tc.code || resp.Header.Get(api.PortResponseHeader) != "" {
				t.Errorf("%s: GET %s: %d %s, want %d %s", name, tc.path, resp.StatusCode, b, tc.status, tc.code)
			}
		}
	}
	// The node API takes only its secret there too.
	if resp, _ := doReq(t, "GET", p.node+"/v1/sandboxes/"+p.id+"/ports/8000/", "caller-token", nil); resp.StatusCode != 401 {
		t.Errorf("node API with another token: %d, want 401", resp.StatusCode)
	}
}

// Bodies stream both ways, and an answer's first bytes arrive before its
// server is done.
func TestPortsStreaming(t *testing.T) {
	p := newPortsNode(t)
	for name, bt := range p.bases() {
		base, tok := bt[0], bt[1]
		ports := base + "/v1/sandboxes/" + p.id + "/ports/8000"
		const n = 64 << 20
		resp, b := doReq(t, "POST", ports+"/sum", tok, io.LimitReader(nodetest.Pattern(), n))
		if resp.StatusCode != 200 || string(b) != nodetest.SumOf(n) {
			t.Errorf("%s: POST 64 MiB: %d %q, want %q", name, resp.StatusCode, b, nodetest.SumOf(n))
		}
		req, _ := http.NewRequest("GET", ports+"/big?n=67108864", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		big, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.Copy(io.Discard, big.Body)
		big.Body.Close()
		if err != nil || got != n {
			t.Errorf("%s: GET 64 MiB: %d bytes, %v", name, got, err)
		}
	}
	req, _ := http.NewRequest("GET", p.fwd+"/v1/sandboxes/"+p.id+"/ports/8000/stream", nil)
	req.Header.Set("Authorization", "Bearer x")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first := make(chan string, 1)
	go func() { l, _ := nodetest.ReadLine(br); first <- l }()
	select {
	case l := <-first:
		if l != "first" {
			t.Errorf("stream: %q, want first", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream's first line did not come through before its server finished")
	}
	close(p.app.Release)
	if l, _ := nodetest.ReadLine(br); l != "second" {
		t.Errorf("stream: %q, want second", l)
	}
}

func TestPortsWebSocket(t *testing.T) {
	p := newPortsNode(t)
	for name, bt := range p.bases() {
		ws, err := nodetest.DialWebSocket(t, bt[0], "/v1/sandboxes/"+p.id+"/ports/8000/ws", bt[1])
		if err != nil {
			t.Fatalf("%s: websocket: %v", name, err)
		}
		for _, msg := range []string{"hello", strings.Repeat("x", 1<<20)} {
			if _, err := ws.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(ws, got); err != nil || string(got) != msg {
				t.Errorf("%s: websocket echo of %d bytes: %d back, %v", name, len(msg), len(got), err)
			}
		}
	}
}

func TestPortForward(t *testing.T) {
	p := newPortsNode(t)
	for name, bt := range p.bases() {
		base, tok := bt[0], bt[1]
		c, br, resp, b := nodetest.DialTunnel(t, base, "/v1/sandboxes/"+p.id+"/portforward/9000", tok)
		if c == nil {
			t.Fatalf("%s: tunnel: %d %s", name, resp.StatusCode, b)
		}
		if l, _ := nodetest.ReadLine(br); l != "hello "+p.id {
			t.Errorf("%s: the server's greeting: %q", name, l)
		}
		// Half-close: all sent, then the whole answer still comes back.
		const n = 1 << 20
		if _, err := io.Copy(c, io.LimitReader(nodetest.Pattern(), n)); err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if l, err := nodetest.ReadLine(br); l != "got 1048576" {
			t.Errorf("%s: after a half-close: %q, %v; want got 1048576", name, l, err)
		}
		if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
			t.Errorf("%s: after the answer: %q, %v; want EOF", name, rest, err)
		}

		// A client that sends before the switch, and half-closes at once.
		host := strings.TrimPrefix(base, "http://")
		eager, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(eager, "GET /v1/sandboxes/"+p.id+"/portforward/9000 HTTP/1.1\r\nHost: "+host+
			"\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nAuthorization: Bearer "+tok+"\r\n\r\nabc")
		eager.(*net.TCPConn).CloseWrite()
		eager.SetReadDeadline(time.Now().Add(10 * time.Second))
		all, _ := io.ReadAll(eager)
		eager.Close()
		if !strings.HasPrefix(string(all), "HTTP/1.1 101 ") || !strings.HasSuffix(string(all), "\r\n\r\nhello "+p.id+"\ngot 3\n") {
			t.Errorf("%s: eager tunnel: %q", name, all)
		}

		// Errors come before any switch, as ordinary answers.
		for _, tc := range []struct {
			path   string
			status int
			code   string
		}{
			{"/v1/sandboxes/" + p.id + "/portforward/9001", 502, api.CodePortUnreachable},
			{"/v1/sandboxes/" + p.id + "/portforward/0", 400, api.CodeInvalid},
			{"/v1/sandboxes/n1-aaaaaaaaaaaaaaaa/portforward/9000", 404, api.CodeSandboxNotFound},
		} {
			c, _, resp, b := nodetest.DialTunnel(t, base, tc.path, tok)
			if c != nil || resp.StatusCode != tc.status || errCode(t, b) != tc.code {
				t.Errorf("%s: tunnel %s: %d %s, want %d %s", name, tc.path, resp.StatusCode, b, tc.status, tc.code)
			}
		}
		// Without the upgrade it is not a tunnel.
		if resp, b := doReq(t, "GET", base+"/v1/sandboxes/"+p.id+"/portforward/9000", tok, nil); resp.StatusCode != 400 {
			t.Errorf("%s: portforward without Upgrade: %d %s, want 400", name, resp.StatusCode, b)
		}
	}
}

// A tunnel is a call: the sandbox's idle timeout waits for it.
func TestPortForwardHoldsSandbox(t *testing.T) {
	agent, b := nodetest.NewFake(t, nil)
	srv := httptest.NewServer(nodeapi.NewServer(agent, nodeapi.Secret(token), quiet))
	t.Cleanup(srv.Close)
	c := nodeapi.NewClient(agent.ID(), srv.URL, token, nil)
	sb := mustCreate(t, c, api.CreateSandboxRequest{IdleTimeout: api.Duration(time.Second)})
	nodetest.ServePorts(t, b, sb.ID, 8000, 9000)
	conn, br, resp, body := nodetest.DialTunnel(t, srv.URL, "/v1/sandboxes/"+sb.ID+"/portforward/9000", token)
	if conn == nil {
		t.Fatalf("tunnel: %d %s", resp.StatusCode, body)
	}
	nodetest.ReadLine(br)
	time.Sleep(2 * time.Second)
	if got, err := c.Get(context.Background(), sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("with a tunnel open 2s past a 1s idle timeout: %v, %v", got.State, err)
	}
	conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := c.Get(context.Background(), sb.ID); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not reaped after the tunnel closed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Connections kept to one sandbox's port never serve another's requests.
func TestPortsKeepSandboxesApart(t *testing.T) {
	agent, b := nodetest.NewFake(t, nil)
	srv := httptest.NewServer(nodeapi.NewServer(agent, nodeapi.Secret(token), quiet))
	t.Cleanup(srv.Close)
	c := nodeapi.NewClient(agent.ID(), srv.URL, token, nil)
	var ids []string
	for range 2 {
		sb := mustCreate(t, c, api.CreateSandboxRequest{})
		nodetest.ServePorts(t, b, sb.ID, 8000, 0)
		ids = append(ids, sb.ID)
	}
	for i := range 20 {
		id := ids[i%2]
		resp, body := doReq(t, "GET", srv.URL+"/v1/sandboxes/"+id+"/ports/8000/", token, nil)
		if got := resp.Header.Get("X-App-Sandbox"); resp.StatusCode != 200 || got != id {
			t.Fatalf("request %d to %s: %d, answered by %q (%s)", i, id, resp.StatusCode, got, body)
		}
	}
}

// Over TLS to a node that would speak HTTP/2, upgrades still go through:
// they are sent on an HTTP/1.1 connection of their own.
func TestPortsUpgradeOverTLS(t *testing.T) {
	agent, b := nodetest.NewFake(t, nil)
	srv := httptest.NewUnstartedServer(nodeapi.NewServer(agent, nodeapi.Secret(token), quiet))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := nodeapi.NewClient(agent.ID(), srv.URL, token, srv.Client())
	sb := mustCreate(t, c, api.CreateSandboxRequest{})
	nodetest.ServePorts(t, b, sb.ID, 8000, 9000)
	fwd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := c.Forward(w, r); err != nil {
			httperr.Write(w, err)
		}
	}))
	t.Cleanup(fwd.Close)

	if resp, _ := doReq(t, "GET", fwd.URL+"/v1/sandboxes/"+sb.ID+"/ports/8000/", "x", nil); resp.StatusCode != 200 {
		t.Errorf("HTTP over TLS: %d", resp.StatusCode)
	}
	ws, err := nodetest.DialWebSocket(t, fwd.URL, "/v1/sandboxes/"+sb.ID+"/ports/8000/ws", "x")
	if err != nil {
		t.Fatalf("websocket over TLS: %v", err)
	}
	ws.Write([]byte("tls"))
	got := make([]byte, 3)
	if _, err := io.ReadFull(ws, got); err != nil || string(got) != "tls" {
		t.Errorf("websocket echo over TLS: %q, %v", got, err)
	}
	conn, br, resp, body := nodetest.DialTunnel(t, fwd.URL, "/v1/sandboxes/"+sb.ID+"/portforward/9000", "x")
	if conn == nil {
		t.Fatalf("tunnel over TLS: %d %s", resp.StatusCode, body)
	}
	io.WriteString(conn, "abc")
	conn.(*net.TCPConn).CloseWrite() // a close_notify on the TLS hop
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, _ := io.ReadAll(br)
	if want := "hello " + sb.ID + "\ngot 3\n"; string(all) != want {
		t.Errorf("tunnel over TLS, half-closed: %q, want %q", all, want)
	}
}
