// Package dnsproxy is the node's DNS proxy: the only resolver a networked
// sandbox reaches (the firewall redirects its UDP and TCP port 53 here).
// It answers a sandbox, known by the query's source address, only for the
// names its policy resolves, and teaches the sandbox's state (and through
// it the firewall) the addresses those names resolved to.
//
// What it checks, in order, for every query:
//
//   - size (12 to MaxQuery bytes), a query (a response is never answered:
//     no loops, no reflection), opcode QUERY (else NOTIMP), one question
//     (else FORMERR), EDNS version 0 (else BADVERS);
//   - the source: an address no sandbox holds gets REFUSED;
//   - the sandbox's query rate (a token bucket, Config.QueryRate and
//     QueryBurst): over it, REFUSED;
//   - class IN (else REFUSED), then the name: REFUSED, with an Extended
//     DNS Error (RFC 8914, Blocked) when the query has EDNS, unless the
//     policy resolves it (netpolicy.Policy.NamePorts: an allowlist's
//     names, or any name in mode open, but never a netpolicy.DoHNames
//     endpoint unless the allowlist names that exact host), and refused
//     too if its presentation form holds an escape (a dot or a byte no
//     hostname has, inside a label: "x\.allowed.example" is a name under
//     example, not allowed.example). A refused query never leaves the
//     node: a sandbox cannot exfiltrate data in the names it looks up,
//     except under a wildcard its policy allows.
//
// Refusals other than an unknown source count as the sandbox's denied
// queries (netpolicy.Sandbox.DenyQuery). Then, by type:
//
//   - A goes upstream (UDP, over TCP when truncated, with a timeout and
//     retries). Of the answer, only the CNAME chain from the question and
//     the A records at its end are kept; each address is learned under
//     the queried name for the chain's smallest TTL (Sandbox.Learn), and
//     one Learn refuses (an always-denied address: DNS rebinding onto the
//     node's LAN, loopback, metadata) is stripped from the answer. Every
//     TTL in the answer becomes the chain's smallest, so a client never
//     caches an address longer than it was learned for.
//   - AAAA, HTTPS and SVCB get an empty NOERROR answer without asking
//     upstream: egress is IPv4 only, and HTTPS/SVCB address hints would
//     hand out addresses that were never learned.
//   - ANY, zone transfers and other meta types get NOTIMP.
//   - Every other type (TXT, MX, SRV, CAA, CNAME, PTR, ...) for a name
//     the policy resolves goes upstream, and the answer keeps only the
//     CNAME chain and the records of the asked type at its end: no
//     address records anywhere, and no additional section, so an MX or
//     SRV answer names hosts without handing out their (unlearned)
//     addresses. Those types carry no address a sandbox could connect to,
//     and tools need them (TXT for verification, SRV for mongodb+srv and
//     friends); the name is one the policy allows, so nothing is
//     exfiltrated that an A query could not.
//
// The reply keeps the query's ID and its question exactly as sent (0x20
// case included); owner names equal to the question take its case. An
// answer whose upstream records do not survive packing and unpacking is
// replaced by SERVFAIL. A UDP
// reply is truncated (TC) to 512 bytes, or the query's EDNS size up to
// 4096. Upstream answers are cached by name and type for their TTL (at
// most MaxCacheTTL); a cached answer is learned again for every sandbox
// that gets it, with the TTL it has left.
//
// Every upstream query goes out on a new UDP socket (a random source
// port) with a random ID, and an answer counts only if it comes back on
// that socket with that ID and question.
//
// What it cannot see: what a sandbox does with an address it learned, on
// ports the policy allows (the firewall and the Host/SNI proxy check
// that); and names under an allowed wildcard, which reach that domain's
// nameservers like any lookup. The cache is the node's, shared by its
// sandboxes (thousands of them resolving the same package index is what
// it is for), so a sandbox could tell from an answer's speed or TTL that
// another resolved the same allowed name lately.
package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/netpolicy"
)

// Defaults of Config's zero fields.
const (
	DefaultTimeout    = 2 * time.Second
	DefaultAttempts   = 2
	DefaultQueryRate  = 100 // queries per second per sandbox
	DefaultQueryBurst = 200
	DefaultCacheSize  = 4096
)

// Bounds of what the proxy reads and holds.
const (
	MaxQuery    = 4096 // bytes of one query; larger ones are dropped
	MaxCacheTTL = time.Hour
	maxUDPReply = 4096
	maxInFlight = 1024 // UDP queries being answered; past that, dropped
	maxTCPConns = 512
	tcpIdle     = 10 * time.Second
	tcpQueries  = 64 // queries on one TCP connection
	upstreamUDP = 1232
)

// Config configures a Proxy.
type Config struct {
	// Upstream is the resolver's host:port (SystemUpstream, or the
	// operator's --dns-upstream).
	Upstream string
	// Lookup finds the sandbox that sent a query by its source address
	// (netpolicy.Table.Lookup); nil means no sandbox has it.
	Lookup func(netip.Addr) *netpolicy.Sandbox
	Log    *slog.Logger
	// Timeout bounds one upstream attempt; Attempts is how many UDP
	// attempts a query gets (a truncated answer is asked again over TCP
	// within the same attempt).
	Timeout  time.Duration
	Attempts int
	// QueryRate and QueryBurst bound each sandbox's queries per second.
	QueryRate  float64
	QueryBurst int
	// CacheSize is how many answers are cached; negative turns the cache
	// off.
	CacheSize int
}

// Proxy answers sandboxes' DNS queries. Its methods are safe for
// concurrent use.
type Proxy struct {
	cfg      Config
	log      *slog.Logger
	exchange func(ctx context.Context, q *dns.Msg) (*dns.Msg, error)
	cache    *cache
	limits   limiter
	inflight chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc
	warned   atomic.Int64 // unix nanos of the last upstream warning

	mu      sync.Mutex
	closed  bool
	closers map[io.Closer]struct{}
	wg      sync.WaitGroup
}

// New makes a proxy. It sends nothing until it serves. Errors are
// ErrInvalid (no upstream, no Lookup).
func New(cfg Config) (*Proxy, error) {
	if cfg.Lookup == nil {
		return nil, errdefs.Invalid("dnsproxy: no Lookup")
	}
	if _, _, err := net.SplitHostPort(cfg.Upstream); err != nil {
		return nil, errdefs.Invalid("dnsproxy: upstream %q: want host:port", cfg.Upstream)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = DefaultAttempts
	}
	if cfg.QueryRate <= 0 {
		cfg.QueryRate = DefaultQueryRate
	}
	if cfg.QueryBurst <= 0 {
		cfg.QueryBurst = DefaultQueryBurst
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	p := &Proxy{cfg: cfg, log: cfg.Log, inflight: make(chan struct{}, maxInFlight),
		closers: map[io.Closer]struct{}{}}
	p.limits = limiter{rate: cfg.QueryRate, burst: float64(cfg.QueryBurst)}
	if cfg.CacheSize > 0 {
		p.cache = newCache(cfg.CacheSize)
	}
	p.exchange = newUpstream(cfg.Upstream, cfg.Timeout, cfg.Attempts).exchange
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// ErrClosed is what Serve methods return for a closed proxy.
var ErrClosed = errors.New("dnsproxy: closed")

// track registers c to be closed by Close, or reports false if the proxy
// is closed already.
func (p *Proxy) track(c io.Closer) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.closers[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c io.Closer) {
	p.mu.Lock()
	delete(p.closers, c)
	p.mu.Unlock()
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// ServeUDP answers the queries that reach pc until pc fails or Close is
// called (then it returns nil). Replies go back from pc to each query's
// source.
func (p *Proxy) ServeUDP(pc net.PacketConn) error {
	if !p.track(pc) {
		return ErrClosed
	}
	defer p.untrack(pc)
	buf := make([]byte, MaxQuery+1)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if p.isClosed() {
				return nil
			}
			return err
		}
		if n < headerLen || n > MaxQuery {
			continue
		}
		src := addrOf(from)
		if !src.IsValid() {
			continue
		}
		select {
		case p.inflight <- struct{}{}:
		default:
			continue // overloaded: the client retries
		}
		pkt := append([]byte(nil), buf[:n]...)
		p.wg.Add(1)
		go func() {
			defer func() { <-p.inflight; p.wg.Done() }()
			if reply := p.answer(p.ctx, src, pkt, false); reply != nil {
				pc.WriteTo(reply, from)
			}
		}()
	}
}

// ServeTCP answers queries on the connections ln accepts until ln fails
// or Close is called (then it returns nil).
func (p *Proxy) ServeTCP(ln net.Listener) error {
	if !p.track(ln) {
		return ErrClosed
	}
	defer p.untrack(ln)
	var conns atomic.Int64
	delay := time.Duration(0)
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.isClosed() {
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
		if conns.Add(1) > maxTCPConns || !p.track(c) {
			conns.Add(-1)
			c.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer func() { p.untrack(c); c.Close(); conns.Add(-1); p.wg.Done() }()
			p.serveConn(c)
		}()
	}
}

// serveConn answers length-prefixed queries on one TCP connection, one at
// a time, until it idles, errs, or has asked tcpQueries.
func (p *Proxy) serveConn(c net.Conn) {
	src := addrOf(c.RemoteAddr())
	if !src.IsValid() {
		return
	}
	var lenBuf [2]byte
	buf := make([]byte, MaxQuery)
	for range tcpQueries {
		c.SetReadDeadline(time.Now().Add(tcpIdle))
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lenBuf[:]))
		if n < headerLen || n > MaxQuery {
			return
		}
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return
		}
		reply := p.answer(p.ctx, src, buf[:n], true)
		if reply == nil {
			return
		}
		out := make([]byte, 2+len(reply))
		binary.BigEndian.PutUint16(out, uint16(len(reply)))
		copy(out[2:], reply)
		c.SetWriteDeadline(time.Now().Add(tcpIdle))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// Close stops serving: it closes the connections given to ServeUDP and
// ServeTCP and those accepted, and waits for the queries in flight.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	cs := make([]io.Closer, 0, len(p.closers))
	for c := range p.closers {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	p.cancel()
	for _, c := range cs {
		c.Close()
	}
	p.wg.Wait()
	return nil
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	if a == nil {
		return netip.Addr{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// SystemUpstream is the host's resolver: the first nameserver of
// /etc/resolv.conf, on port 53. Errors are ErrUnavailable (none there:
// give --dns-upstream).
func SystemUpstream() (string, error) { return systemUpstream("/etc/resolv.conf") }

func systemUpstream(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", errdefs.Unavailable("dnsproxy: no system resolver (give --dns-upstream): %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil {
			continue
		}
		return netip.AddrPortFrom(a, 53).String(), nil
	}
	return "", errdefs.Unavailable("dnsproxy: no nameserver in %s (give --dns-upstream)", path)
}
