// Package hostproxy is the node's transparent proxy for a networked
// sandbox's TCP 80 and 443 to addresses it learned from DNS: the firewall
// redirects those connections here (keeping their source, the sandbox's
// address, and recording their original destination, which OrigDst reads
// back), and the proxy lets one through only when the name it carries is
// one the policy allows at that destination (netpolicy.Sandbox.AllowsConn:
// the name resolved to that very address for this sandbox, or the address
// is allowed by itself). An allowed connection always goes to its original
// destination, never to where its name would lead: the check is about
// what the connection says it is for.
//
// TLS (ServeTLS): the ClientHello is read (at most MaxHello bytes, within
// HandshakeTimeout) and its SNI checked; no SNI is allowed only where the
// address is allowed by itself. A refusal is a TLS access_denied alert
// and a close. An allowed connection gets the bytes read replayed to the
// destination and then both directions spliced as they are, half-closes
// included. So a ClientHello naming another host at an allowed address
// (domain fronting onto a shared CDN address) is refused; what cannot be
// checked is anything inside the encryption: the HTTP Host header (or
// HTTP/2 :authority) a client sends after the handshake is invisible
// without intercepting TLS, which the proxy does not do, so a client that
// names an allowed host in its SNI and another in its Host header reaches
// whatever the server behind that address routes the Host to (CDNs that
// refuse a mismatch, as most now do, stop it there). With Encrypted
// Client Hello the proxy sees the outer, public name, which is what it
// checks.
//
// HTTP (ServeHTTP): every request on a connection is parsed and its Host
// checked, so a keep-alive request naming another host is refused (403
// with a short plain-text reason, and the connection closed once the
// responses before it are through). Requests are forwarded byte for byte,
// with no header added or removed (no X-Forwarded-For), and responses
// come back as they are. Because a request the proxy and the server
// parsed differently would smuggle a second, unchecked one, the parse is
// strict: CRLF line ends only, no folded header lines, one Host (and for
// absolute-form targets the same host as the Host header), at most one
// Content-Length, Transfer-Encoding only as exactly "chunked" on HTTP/1.1
// and never with a Content-Length, strict chunk framing; anything else is
// a 400. CONNECT is refused. A WebSocket upgrade (Upgrade: websocket)
// passes: once the server answers 101 the connection is spliced as it
// is; a 101 to any other upgrade (h2c, which would multiplex unchecked
// requests) closes the connection.
//
// Every proxied connection is registered with Sandbox.Track under the
// name it was let through for, so a policy change that no longer allows
// it closes it. Refusals count with Sandbox.DenyConn. A connection from an
// address no sandbox holds is closed without a word. Connections have no
// idle timeout once through: like a NAT, the proxy keeps them as long as
// both ends do.
package hostproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/netpolicy"
)

// Defaults of Config's zero fields.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultDialTimeout      = 10 * time.Second
	DefaultMaxConns         = 8192
)

// Config configures a Proxy.
type Config struct {
	// Lookup finds a connection's sandbox by its source address
	// (netpolicy.Table.Lookup); nil means no sandbox has it.
	Lookup func(netip.Addr) *netpolicy.Sandbox
	// Dial connects to a connection's original destination; the default
	// is a net.Dialer bounded by DialTimeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OrigDst is where a redirected connection was going; the default
	// reads SO_ORIGINAL_DST (the nat table's redirect or DNAT).
	OrigDst func(net.Conn) (netip.AddrPort, error)
	Log     *slog.Logger
	// HandshakeTimeout bounds the reading of a ClientHello, of a
	// connection's first request head, and of each later head once its
	// first byte has come.
	HandshakeTimeout time.Duration
	DialTimeout      time.Duration
	// MaxConns bounds the connections held at once, both protocols.
	MaxConns int
}

// Proxy is the Host/SNI proxy. Its methods are safe for concurrent use.
type Proxy struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	closed bool
	lns    map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// New makes a proxy. Errors are ErrInvalid (no Lookup).
func New(cfg Config) (*Proxy, error) {
	if cfg.Lookup == nil {
		return nil, errdefs.Invalid("hostproxy: no Lookup")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	if cfg.OrigDst == nil {
		cfg.OrigDst = OrigDst
	}
	return &Proxy{cfg: cfg, log: cfg.Log, lns: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}}, nil
}

// ErrClosed is what Serve methods return for a closed proxy.
var ErrClosed = errors.New("hostproxy: closed")

// ServeTLS proxies the TLS connections ln accepts (the firewall's port
// 443 redirect) until ln fails or Close is called (then it returns nil).
func (p *Proxy) ServeTLS(ln net.Listener) error { return p.serve(ln, p.serveTLS) }

// ServeHTTP proxies the HTTP connections ln accepts (the firewall's port
// 80 redirect) until ln fails or Close is called (then it returns nil).
func (p *Proxy) ServeHTTP(ln net.Listener) error { return p.serve(ln, p.serveHTTP) }

func (p *Proxy) serve(ln net.Listener, handle func(c net.Conn, sb *netpolicy.Sandbox, dst netip.AddrPort)) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.lns[ln] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.lns, ln)
		p.mu.Unlock()
	}()
	delay := time.Duration(0)
	for {
		c, err := ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if !p.add(c) {
			c.Close()
			continue
		}
		go func() {
			defer p.done(c)
			sb, dst, ok := p.prelude(c)
			if ok {
				handle(c, sb, dst)
			}
		}()
	}
}

func (p *Proxy) add(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.conns) >= p.cfg.MaxConns {
		return false
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *Proxy) done(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	p.wg.Done()
}

// prelude finds c's sandbox and original destination.
func (p *Proxy) prelude(c net.Conn) (*netpolicy.Sandbox, netip.AddrPort, bool) {
	src := addrOf(c.RemoteAddr())
	sb := p.cfg.Lookup(src.Addr())
	if sb == nil {
		p.log.Debug("connection from an unknown source closed", "src", src)
		return nil, netip.AddrPort{}, false
	}
	dst, err := p.cfg.OrigDst(c)
	if err != nil {
		p.log.Warn("no original destination", "sandbox", sb.ID, "src", src, "err", err)
		return nil, netip.AddrPort{}, false
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	if dst == addrOf(c.LocalAddr()) {
		// Not redirected: someone dialled the proxy itself.
		sb.DenyConn()
		p.log.Debug("connection to the proxy itself refused", "sandbox", sb.ID, "dst", dst)
		return nil, netip.AddrPort{}, false
	}
	return sb, dst, true
}

// dial connects to dst and registers the connection with pr, or returns
// nil if it cannot (pr closed meanwhile: a policy change).
func (p *Proxy) dial(pr *pair, dst netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
	defer cancel()
	up, err := p.cfg.Dial(ctx, "tcp4", dst.String())
	if err != nil {
		return nil, err
	}
	if !pr.add(up) {
		return nil, errors.New("closed by a policy change")
	}
	return up, nil
}

// Close stops serving: it closes the listeners and every connection, and
// waits for their goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var cs []io.Closer
	for ln := range p.lns {
		cs = append(cs, ln)
	}
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	p.wg.Wait()
	return nil
}

// pair is a proxied connection's two ends, closed together: what
// Sandbox.Track closes on a policy change.
type pair struct {
	mu     sync.Mutex
	closed bool
	conns  []net.Conn
}

func (pr *pair) add(c net.Conn) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.closed {
		c.Close()
		return false
	}
	pr.conns = append(pr.conns, c)
	return true
}

// Close ends both ends abortively (a reset, as the firewall answers a
// connection a policy change refuses): an error on one side is passed on
// as an error, and no TIME_WAIT is left on the node's ports, which a
// sandbox opening connections fast would otherwise use up (each
// destination's ephemeral ports last a minute in TIME_WAIT).
func (pr *pair) Close() error {
	pr.mu.Lock()
	pr.closed = true
	cs := pr.conns
	pr.mu.Unlock()
	for _, c := range cs {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
	return nil
}

// track registers pr under name and then checks that the policy allows
// it: in that order, so that a policy change between the two either sees
// the registration or is seen by the check.
func track(sb *netpolicy.Sandbox, pr *pair, name string, dst netip.AddrPort) (untrack func(), ok bool) {
	untrack = sb.Track(pr, name, dst)
	if !sb.AllowsConn(name, dst) {
		untrack()
		return nil, false
	}
	return untrack, true
}

// splice copies both ways until both are done. A clean end of one
// direction half-closes the other side; an error closes both.
func splice(pr *pair, a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		pipe(pr, b, a)
	}()
	pipe(pr, a, b)
	<-done
}

// pipe copies src to dst, then half-closes dst.
func pipe(pr *pair, dst, src net.Conn) {
	if _, err := io.Copy(dst, src); err != nil {
		pr.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	pr.Close()
}

// lingerClose ends c after a refusal: closing a socket with unread input
// resets it, and the reset can overtake the refusal on its way, so the
// write side closes first and what the client still sends is read and
// dropped for a moment (lingerTime, lingerBytes at most).
func lingerClose(c net.Conn) {
	closeWrite(c)
	c.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, c, lingerBytes)
	c.Close()
}

const (
	lingerTime  = time.Second
	lingerBytes = 256 << 10
)

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

func addrOf(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	default:
		if a != nil {
			ap, _ = netip.ParseAddrPort(a.String())
		}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func errorf(format string, args ...any) error { return fmt.Errorf("hostproxy: "+format, args...) }
