package hostproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/netpolicy"
)

// The tests' servers listen on 127.0.0.1; the proxy is told (OrigDst)
// that its connections were going to documentation addresses, which the
// test's Dial maps to those servers. Nothing dials anything else.
var (
	cdnAddr   = netip.MustParseAddr("203.0.113.10") // where allowed.example resolved
	otherAddr = netip.MustParseAddr("203.0.113.11")
	cidrAddr  = netip.MustParseAddr("198.51.100.7") // allowed by address, on 443
)

type env struct {
	t        *testing.T
	p        *Proxy
	sb       *netpolicy.Sandbox
	tlsAddr  string
	httpAddr string
	dials    atomic.Int32

	mu     sync.Mutex
	dst    netip.AddrPort
	routes map[netip.AddrPort]string
}

func policy(t testing.TB, p api.NetworkPolicy) *netpolicy.Policy {
	t.Helper()
	pol, err := netpolicy.Parse(p)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

var allowlist = api.NetworkPolicy{Allow: []string{"allowed.example", "*.allowed.example", "198.51.100.7:443"}}

func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	e := &env{t: t, routes: map[netip.AddrPort]string{}}
	e.sb = netpolicy.NewSandbox("sb1", netip.MustParseAddr("127.0.0.1"), policy(t, allowlist), nil, nil)
	if !e.sb.Learn("allowed.example", cdnAddr, time.Hour) {
		t.Fatal("Learn refused")
	}
	var tb netpolicy.Table
	tb.Add(e.sb)
	cfg.Lookup = tb.Lookup
	cfg.OrigDst = func(net.Conn) (netip.AddrPort, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.dst, nil
	}
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		e.mu.Lock()
		to, ok := e.routes[netip.MustParseAddrPort(addr)]
		e.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("test: no route to %s", addr)
		}
		e.dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp4", to)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.p = p
	l1, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.tlsAddr, e.httpAddr = l1.Addr().String(), l2.Addr().String()
	go p.ServeTLS(l1)
	go p.ServeHTTP(l2)
	t.Cleanup(func() { p.Close() })
	return e
}

// route makes dst lead to the server at addr; to sets what the next
// connections' original destination is.
func (e *env) route(dst netip.AddrPort, addr string) {
	e.mu.Lock()
	e.routes[dst] = addr
	e.mu.Unlock()
}

func (e *env) to(dst netip.AddrPort) {
	e.mu.Lock()
	e.dst = dst
	e.mu.Unlock()
}

func (e *env) denied() uint64 {
	c, _ := e.sb.Denied()
	return c
}

func serverAddr(s *httptest.Server) string {
	return strings.TrimPrefix(strings.TrimPrefix(s.URL, "https://"), "http://")
}

// hostEcho answers with the Host it saw and whether any forwarding
// header came along; /big sends n bytes; /sum reads the body and
// answers its SHA-256.
func hostEcho(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/big":
		w.Header().Set("Content-Length", fmt.Sprint(bigSize))
		io.Copy(w, io.LimitReader(&pattern{}, bigSize))
	case "/sum":
		h := sha256.New()
		io.Copy(h, r.Body)
		fmt.Fprintf(w, "%x", h.Sum(nil))
	default:
		fwd := r.Header.Get("X-Forwarded-For") + r.Header.Get("Forwarded") + r.Header.Get("Via")
		fmt.Fprintf(w, "host=%s fwd=%s", r.Host, fwd)
	}
}

const bigSize = 32 << 20

// pattern is an endless byte stream that depends only on the offset,
// not on how it is read.
type pattern struct{ off int }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		o := p.off + i
		b[i] = byte(o*7 + o>>11)
	}
	p.off += len(b)
	return len(b), nil
}

func patternSum() string {
	h := sha256.New()
	io.Copy(h, io.LimitReader(&pattern{}, bigSize))
	return fmt.Sprintf("%x", h.Sum(nil))
}

// tlsClient is an HTTPS client whose connections all go to the proxy's
// TLS port, with SNI sni (none if "").
func (e *env) tlsClient(sni string) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp4", e.tlsAddr)
		},
		TLSClientConfig:   &tls.Config{ServerName: sni, InsecureSkipVerify: true},
		ForceAttemptHTTP2: false,
	}}
}

func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestTLSAllowed(t *testing.T) {
	e := newEnv(t, Config{})
	srv := httptest.NewTLSServer(http.HandlerFunc(hostEcho))
	defer srv.Close()
	dst := netip.AddrPortFrom(cdnAddr, 443)
	e.route(dst, serverAddr(srv))
	e.to(dst)
	got, err := get(e.tlsClient("allowed.example"), "https://allowed.example/")
	if err != nil || got != "host=allowed.example fwd=" {
		t.Fatalf("got %q, %v", got, err)
	}
	if e.denied() != 0 {
		t.Errorf("denied %d", e.denied())
	}
}

func TestTLSRefused(t *testing.T) {
	e := newEnv(t, Config{})
	srv := httptest.NewTLSServer(http.HandlerFunc(hostEcho))
	defer srv.Close()
	for _, a := range []netip.Addr{cdnAddr, otherAddr, cidrAddr} {
		e.route(netip.AddrPortFrom(a, 443), serverAddr(srv))
	}
	cases := []struct {
		why string
		sni string
		dst netip.Addr
	}{
		{"fronting: another name at an allowed name's address", "evil.example", cdnAddr},
		{"an allowed name at an address it did not resolve to", "www.allowed.example", otherAddr},
		{"an allowed name at another allowed name's address", "www.allowed.example", cdnAddr},
		{"no SNI at an address allowed only through a name", "", cdnAddr},
		{"a DoH name at an address allowed by itself", "dns.google", cidrAddr},
	}
	for i, c := range cases {
		e.to(netip.AddrPortFrom(c.dst, 443))
		_, err := get(e.tlsClient(c.sni), "https://"+cdnAddr.String()+"/")
		if err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Errorf("%s: %v, want a TLS access_denied alert", c.why, err)
		}
		if e.denied() != uint64(i+1) {
			t.Errorf("%s: denied count %d, want %d", c.why, e.denied(), i+1)
		}
	}
	if n := e.dials.Load(); n != 0 {
		t.Errorf("%d refused connections dialled their destination", n)
	}
	// No SNI where the address is allowed by itself: through.
	e.to(netip.AddrPortFrom(cidrAddr, 443))
	if got, err := get(e.tlsClient(""), "https://"+cidrAddr.String()+"/"); err != nil || !strings.HasPrefix(got, "host=") {
		t.Errorf("no SNI at a CIDR-allowed address: %q, %v", got, err)
	}
}

// slowConn writes its first write (the ClientHello) one byte at a time.
type slowConn struct {
	net.Conn
	gap  time.Duration
	done bool
}

func (s *slowConn) Write(b []byte) (int, error) {
	if s.done {
		return s.Conn.Write(b)
	}
	s.done = true
	for i := range b {
		if _, err := s.Conn.Write(b[i : i+1]); err != nil {
			return i, err
		}
		time.Sleep(s.gap)
	}
	return len(b), nil
}

func TestTLSTrickledHello(t *testing.T) {
	e := newEnv(t, Config{HandshakeTimeout: 10 * time.Second})
	srv := httptest.NewTLSServer(http.HandlerFunc(hostEcho))
	defer srv.Close()
	dst := netip.AddrPortFrom(cdnAddr, 443)
	e.route(dst, serverAddr(srv))
	e.to(dst)
	c, err := net.Dial("tcp4", e.tlsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slow := &slowConn{Conn: c, gap: 200 * time.Microsecond}
	tc := tls.Client(slow, &tls.Config{ServerName: "allowed.example", InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake through a byte-by-byte ClientHello: %v", err)
	}
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: allowed.example\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("response %v, %v", resp, err)
	}
}

func TestTLSHelloTimeout(t *testing.T) {
	e := newEnv(t, Config{HandshakeTimeout: 300 * time.Millisecond})
	e.to(netip.AddrPortFrom(cdnAddr, 443))
	c, err := net.Dial("tcp4", e.tlsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{22, 3, 1, 2, 0, 1, 0, 1}) // a record header promising 512 bytes, and 3 of them
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("an unfinished ClientHello held the connection %v", d)
	}
	if !bytes.Equal(b, alertAccessDenied) {
		t.Errorf("got %x, want an access_denied alert", b)
	}
	if e.denied() != 1 {
		t.Errorf("denied %d, want 1", e.denied())
	}
	// Not TLS at all.
	c2, _ := net.Dial("tcp4", e.tlsAddr)
	defer c2.Close()
	fmt.Fprintf(c2, "GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(c2); !bytes.Equal(b, alertAccessDenied) {
		t.Errorf("plain HTTP on the TLS port: got %q", b)
	}
}

func TestTLSLargeTransfer(t *testing.T) {
	e := newEnv(t, Config{})
	srv := httptest.NewTLSServer(http.HandlerFunc(hostEcho))
	defer srv.Close()
	dst := netip.AddrPortFrom(cdnAddr, 443)
	e.route(dst, serverAddr(srv))
	e.to(dst)
	c := e.tlsClient("allowed.example")
	resp, err := c.Get("https://allowed.example/big")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	if err != nil || n != bigSize || fmt.Sprintf("%x", h.Sum(nil)) != patternSum() {
		t.Fatalf("download: %d bytes, %v, sum differs", n, err)
	}
	resp, err = c.Post("https://allowed.example/sum", "application/octet-stream", io.LimitReader(&pattern{}, bigSize))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != patternSum() {
		t.Fatalf("upload: server's sum %q", b)
	}
}

func TestTLSPolicyChange(t *testing.T) {
	e := newEnv(t, Config{})
	srv := httptest.NewTLSServer(http.HandlerFunc(hostEcho))
	defer srv.Close()
	dst := netip.AddrPortFrom(cdnAddr, 443)
	e.route(dst, serverAddr(srv))
	e.to(dst)
	c, err := net.Dial("tcp4", e.tlsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := tls.Client(c, &tls.Config{ServerName: "allowed.example", InsecureSkipVerify: true})
	br := bufio.NewReader(tc)
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	// Still allowed after a change that keeps it: stays open.
	e.sb.SetPolicy(policy(t, api.NetworkPolicy{Allow: []string{"allowed.example:443"}}))
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
	if resp, err = http.ReadResponse(br, nil); err != nil {
		t.Fatalf("a connection the new policy still allows was closed: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	e.sb.SetPolicy(policy(t, api.NetworkPolicy{Allow: []string{"pypi.org"}}))
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = br.ReadByte()
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("read after the policy change: %v, want the connection closed", err)
	}
}

// rawServer answers every request it reads on a connection with a fixed
// 200 and records the raw bytes it got.
type rawServer struct {
	ln   net.Listener
	mu   sync.Mutex
	got  bytes.Buffer
	reqs int
}

func startRaw(t *testing.T) *rawServer {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(io.TeeReader(c, s))
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					s.mu.Lock()
					s.reqs++
					s.mu.Unlock()
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					if req.Close {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

func (s *rawServer) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got.Write(b)
}

func (s *rawServer) seen() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got.String(), s.reqs
}

// exchangeRaw sends req on a new connection to the HTTP port and returns
// all that comes back until the proxy closes it (or timeout).
func (e *env) exchangeRaw(req string) string {
	c, err := net.Dial("tcp4", e.httpAddr)
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, req)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

func TestHTTPForwardedAsIs(t *testing.T) {
	e := newEnv(t, Config{})
	s := startRaw(t)
	dst := netip.AddrPortFrom(cdnAddr, 80)
	e.route(dst, s.ln.Addr().String())
	e.to(dst)
	req := "GET /x?y HTTP/1.1\r\nhost: Allowed.Example:80\r\nx-odd-CASE: 1\r\nUser-Agent: t\r\nConnection: close\r\n\r\n"
	body := "abc\r\n"
	post := "POST /p HTTP/1.1\r\nHost: allowed.example\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5;ext=1\r\n" + body + "\r\n0\r\nX-Trailer: t\r\n\r\n" +
		"PUT /q HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: 3\r\nConnection: close\r\n\r\nxyz"
	for _, r := range []string{req, post} {
		got := e.exchangeRaw(r)
		if !strings.HasPrefix(got, "HTTP/1.1 200 OK") {
			t.Fatalf("response %q", got)
		}
	}
	seen, n := s.seen()
	if seen != req+post || n != 3 {
		t.Errorf("server got %q (%d requests), want the requests byte for byte", seen, n)
	}
}

func TestHTTPHostSwitchRefused(t *testing.T) {
	e := newEnv(t, Config{})
	s := startRaw(t)
	dst := netip.AddrPortFrom(cdnAddr, 80)
	e.route(dst, s.ln.Addr().String())
	e.to(dst)
	// Keep-alive, one request after the other.
	c, err := net.Dial("tcp4", e.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /1 HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	io.WriteString(c, "GET /2 HTTP/1.1\r\nHost: evil.example\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("second request, another host: %v %v", resp, err)
	}
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), "evil.example") || !strings.Contains(string(b), "network policy") {
		t.Errorf("403 body %q", b)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("connection after a 403: %v, want closed", err)
	}
	// Pipelined: both at once; the first is answered, the second refused.
	got := e.exchangeRaw("GET /3 HTTP/1.1\r\nHost: allowed.example\r\n\r\nGET /4 HTTP/1.1\r\nHost: evil.example\r\n\r\nGET /5 HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 403 Forbidden") {
		t.Errorf("pipelined: %q", got)
	}
	seen, n := s.seen()
	if strings.Contains(seen, "evil") || strings.Contains(seen, "/5") || n != 2 {
		t.Errorf("server saw %q", seen)
	}
	if e.denied() != 2 {
		t.Errorf("denied %d, want 2", e.denied())
	}
}

func TestHTTPRefused(t *testing.T) {
	e := newEnv(t, Config{})
	s := startRaw(t)
	for _, a := range []netip.Addr{cdnAddr, otherAddr} {
		e.route(netip.AddrPortFrom(a, 80), s.ln.Addr().String())
	}
	e.to(netip.AddrPortFrom(cdnAddr, 80))
	cases := []struct {
		why, req string
		status   int
	}{
		{"fronting", "GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n", 403},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", 400},
		{"HTTP/1.0 without Host at a name's address", "GET / HTTP/1.0\r\n\r\n", 403},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: allowed.example\r\nHost: evil.example\r\n\r\n", 400},
		{"absolute target to another host", "GET http://evil.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n", 400},
		{"folded header", "GET / HTTP/1.1\r\nHost: allowed.example\r\nX: a\r\n Host: evil.example\r\n\r\n", 400},
		{"bare LF", "GET / HTTP/1.1\nHost: allowed.example\n\n", 400},
		{"TE and CL", "POST / HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"TE not chunked", "POST / HTTP/1.1\r\nHost: allowed.example\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 400},
		{"TE on HTTP/1.0", "POST / HTTP/1.0\r\nHost: allowed.example\r\nTransfer-Encoding: chunked\r\n\r\n", 501},
		{"two CL", "POST / HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nab", 400},
		{"CONNECT", "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n", 403},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505},
	}
	for _, c := range cases {
		got := e.exchangeRaw(c.req)
		if want := fmt.Sprintf("HTTP/1.1 %d ", c.status); !strings.HasPrefix(got, want) {
			t.Errorf("%s: got %q, want %s", c.why, got, want)
		}
	}
	if seen, _ := s.seen(); seen != "" {
		t.Errorf("server got %q", seen)
	}
	// A bad chunk after a good start: the connection is cut.
	got := e.exchangeRaw("POST / HTTP/1.1\r\nHost: allowed.example\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\nGET /smuggled HTTP/1.1\r\nHost: evil.example\r\n\r\n")
	if strings.Contains(got, "200") {
		t.Errorf("bad chunk framing answered %q", got)
	}
	if seen, _ := s.seen(); strings.Contains(seen, "smuggled") && strings.Contains(seen, "evil") && !strings.Contains(seen, "abcX") {
		t.Errorf("smuggled: %q", seen)
	}
}

func TestHTTPWebSocket(t *testing.T) {
	e := newEnv(t, Config{})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				proto := req.Header.Get("Upgrade")
				fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", proto)
				io.Copy(c, br) // echo
			}()
		}
	}()
	dst := netip.AddrPortFrom(cdnAddr, 80)
	e.route(dst, ln.Addr().String())
	e.to(dst)
	c, err := net.Dial("tcp4", e.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: allowed.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: x\r\nSec-WebSocket-Version: 13\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	// After the switch anything goes, even what looks like a request.
	msg := "\x81\x05hello GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n"
	io.WriteString(c, msg)
	got := make([]byte, len(msg))
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
		t.Fatalf("echo %q, %v", got, err)
	}
	c.(*net.TCPConn).CloseWrite()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after a half-close: %v, want EOF", err)
	}
	// An upgrade to h2c: the 101 closes the connection.
	got2 := e.exchangeRaw("GET / HTTP/1.1\r\nHost: allowed.example\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")
	if got2 != "" {
		t.Errorf("h2c upgrade: got %q, want the connection closed", got2)
	}
}

func TestHTTPLargeAndPolicyChange(t *testing.T) {
	e := newEnv(t, Config{})
	srv := httptest.NewServer(http.HandlerFunc(hostEcho))
	defer srv.Close()
	dst := netip.AddrPortFrom(cdnAddr, 80)
	e.route(dst, serverAddr(srv))
	e.to(dst)
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp4", e.httpAddr)
		}}}
	resp, err := c.Post("http://allowed.example/sum", "application/octet-stream", io.LimitReader(&pattern{}, bigSize))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != patternSum() {
		t.Fatalf("upload (chunked): server's sum %q", b)
	}
	resp, err = c.Get("http://allowed.example/big")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	if err != nil || n != bigSize || fmt.Sprintf("%x", h.Sum(nil)) != patternSum() {
		t.Fatalf("download: %d bytes, %v", n, err)
	}
	if got, _ := get(c, "http://allowed.example/"); got != "host=allowed.example fwd=" {
		t.Errorf("got %q", got)
	}

	// A download in progress is cut by a policy change.
	conn, err := net.Dial("tcp4", e.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /big HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
	if _, err := io.ReadFull(conn, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	e.sb.SetPolicy(policy(t, api.NetworkPolicy{Mode: api.NetworkNone}))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err = io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || n >= bigSize-1<<20 {
		t.Errorf("after the policy change: %d more bytes, %v; want the connection cut", n, err)
	}
}

func TestUnknownSource(t *testing.T) {
	e := newEnv(t, Config{})
	e.to(netip.AddrPortFrom(cdnAddr, 80))
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	c, err := d.Dial("tcp4", e.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if b, _ := io.ReadAll(c); len(b) != 0 || e.dials.Load() != 0 {
		t.Errorf("an unknown source got %q", b)
	}
}

func TestNotRedirected(t *testing.T) {
	e := newEnv(t, Config{})
	e.to(netip.MustParseAddrPort(e.httpAddr)) // the proxy's own address
	if got := e.exchangeRaw("GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n"); got != "" || e.denied() != 1 {
		t.Errorf("a connection to the proxy itself: %q, denied %d", got, e.denied())
	}
}

func TestTLSHalfClose(t *testing.T) {
	e := newEnv(t, Config{})
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS() // for its certificate
	cfg := srv.TLS.Clone()
	srv.Close()
	ln, err := tls.Listen("tcp4", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		h := sha256.New()
		n, _ := io.Copy(h, c) // to the client's end of input
		fmt.Fprintf(c, "%d %x", n, h.Sum(nil))
	}()
	dst := netip.AddrPortFrom(cdnAddr, 443)
	e.route(dst, ln.Addr().String())
	e.to(dst)
	raw, err := net.Dial("tcp4", e.tlsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	tc := tls.Client(raw, &tls.Config{ServerName: "allowed.example", InsecureSkipVerify: true})
	if _, err := io.CopyN(tc, &pattern{}, 1<<20); err != nil {
		t.Fatal(err)
	}
	tc.CloseWrite()                 // close_notify
	raw.(*net.TCPConn).CloseWrite() // and the FIN, which the proxy passes on
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(tc)
	h := sha256.New()
	io.CopyN(h, &pattern{}, 1<<20)
	if want := fmt.Sprintf("%d %x", 1<<20, h.Sum(nil)); string(b) != want {
		t.Errorf("after a half-close: %q, %v; want %q", b, err, want)
	}
}
