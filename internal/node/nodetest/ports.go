package nodetest

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/websocket"

	"github.com/warrenhq/warren/internal/backend/fake"
)

// Seen is what the HTTP test app saw of a request (its answer at "/").
type Seen struct {
	Method     string      `json:"method"`
	RequestURI string      `json:"request_uri"`
	Host       string      `json:"host"`
	Header     http.Header `json:"header"`
}

// PortApp is a test server "inside" a fake sandbox, on ports a test
// chooses (fake.Backend.Listen): an HTTP app and a TCP server.
//
// HTTP: every answer carries X-App-Sandbox: <id>; "/status/N" answers status N; "/big?n=N" streams N bytes;
// POST "/sum" answers "<length> <sha256>" of its body; "/stream" sends
// "first\n", flushes, then waits for Release before "second\n"; "/ws" is a
// WebSocket echo; anything else answers Seen as JSON.
//
// TCP: each connection gets "hello <id>\n" at once, then, once the client
// half-closed, "got <n>\n" for the n bytes it sent, and is closed.
type PortApp struct {
	Release chan struct{} // closed: /stream goes on
}

// ServePorts starts PortApp for sandbox id of b: HTTP on httpPort, TCP on
// tcpPort (0: none). Both stop when t ends.
func ServePorts(t testing.TB, b *fake.Backend, id string, httpPort, tcpPort int) *PortApp {
	t.Helper()
	app := &PortApp{Release: make(chan struct{})}
	ln, err := b.Listen(id, httpPort)
	if err != nil {
		t.Fatal(err)
	}
	h := app.handler()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-App-Sandbox", id)
		h.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	if tcpPort != 0 {
		tl, err := b.Listen(id, tcpPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tl.Close() })
		go serveCount(tl, id)
	}
	return app
}

func (app *PortApp) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.PathValue("code"))
		w.WriteHeader(code)
		fmt.Fprintf(w, "status %d", code)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Type", "application/octet-stream")
		io.Copy(w, io.LimitReader(Pattern(), n))
	})
	mux.HandleFunc("POST /sum", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-app.Release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "second\n")
	})
	mux.Handle("/ws", websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(Seen{Method: r.Method, RequestURI: r.RequestURI, Host: r.Host, Header: r.Header})
	})
	return mux
}

// SumOf is what the app's /sum answers for n bytes of Pattern.
func SumOf(n int64) string {
	h := sha256.New()
	io.Copy(h, io.LimitReader(Pattern(), n))
	return fmt.Sprintf("%d %s", n, hex.EncodeToString(h.Sum(nil)))
}

// Pattern is an endless reader of the bytes /big sends.
func Pattern() io.Reader { return &pattern{} }

type pattern struct{ off int }

func (r *pattern) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte('a' + (r.off+i)%26)
	}
	r.off = (r.off + len(p)) % 26
	return len(p), nil
}

func serveCount(ln net.Listener, id string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			fmt.Fprintf(c, "hello %s\n", id)
			n, _ := io.Copy(io.Discard, c)
			fmt.Fprintf(c, "got %d\n", n)
		}()
	}
}

// ReadLine reads one line from r, without its newline.
func ReadLine(r *bufio.Reader) (string, error) {
	s, err := r.ReadString('\n')
	return strings.TrimSuffix(s, "\n"), err
}

// DialTunnel opens a port-forward tunnel at base+path (an http:// URL)
// with token. On a 101 it returns the connection and a reader of what
// follows; on any other answer, that answer (its body read into the
// returned bytes) and a nil connection.
func DialTunnel(t testing.TB, base, path, token string) (net.Conn, *bufio.Reader, *http.Response, []byte) {
	t.Helper()
	host := strings.TrimPrefix(base, "http://")
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nAuthorization: Bearer %s\r\n\r\n", path, host, token)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		t.Fatalf("tunnel %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		return nil, nil, resp, b
	}
	t.Cleanup(func() { c.Close() })
	return c, br, resp, nil
}

// DialWebSocket opens a WebSocket at base+path (an http:// URL) with
// token as its bearer.
func DialWebSocket(t testing.TB, base, path, token string) (*websocket.Conn, error) {
	t.Helper()
	cfg, err := websocket.NewConfig("ws://"+strings.TrimPrefix(base, "http://")+path, "http://localhost/")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Header = http.Header{"Authorization": {"Bearer " + token}}
	ws, err := websocket.DialConfig(cfg)
	if err == nil {
		t.Cleanup(func() { ws.Close() })
	}
	return ws, err
}
