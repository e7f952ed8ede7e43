package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// upstream asks the node's resolver.
type upstream struct {
	addr     string
	ap       netip.AddrPort // addr, if it is an IP literal: no resolving per query
	timeout  time.Duration
	attempts int
}

func newUpstream(addr string, timeout time.Duration, attempts int) *upstream {
	ap, _ := netip.ParseAddrPort(addr)
	return &upstream{addr: addr, ap: ap, timeout: timeout, attempts: attempts}
}

var errMismatch = errors.New("answer does not match the query")

// bufs are UDP read buffers: an answer may be larger than the size the
// query advertised.
var bufs = sync.Pool{New: func() any { b := make([]byte, dns.MaxMsgSize); return &b }}

// exchange asks q over UDP, again over TCP if the answer is truncated,
// up to attempts times with a fresh ID and socket each time.
func (u *upstream) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	var err error
	for range u.attempts {
		var r *dns.Msg
		r, err = u.ask(ctx, "udp", q)
		if err == nil && r.Truncated {
			r, err = u.ask(ctx, "tcp", q)
		}
		if err == nil {
			return r, nil
		}
		if ctx.Err() != nil {
			break
		}
		q.Id = dns.Id()
	}
	return nil, fmt.Errorf("dnsproxy: upstream %s: %w", u.addr, err)
}

// ask sends q once on a new connection and reads its answer, skipping
// UDP datagrams that do not answer it (a late answer to an earlier
// attempt, or a spoof).
func (u *upstream) ask(ctx context.Context, network string, q *dns.Msg) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	var c net.Conn
	var err error
	if network == "udp" && u.ap.IsValid() {
		// A new socket, so a new random source port, for every query.
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(u.ap))
	} else {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, u.addr)
	}
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	out, err := q.Pack()
	if err != nil {
		return nil, err
	}
	if network == "tcp" {
		framed := make([]byte, 2+len(out))
		binary.BigEndian.PutUint16(framed, uint16(len(out)))
		copy(framed[2:], out)
		if _, err := c.Write(framed); err != nil {
			return nil, err
		}
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return nil, err
		}
		buf := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, err
		}
		return parseAnswer(buf, q)
	}
	if _, err := c.Write(out); err != nil {
		return nil, err
	}
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	buf := *bp
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		// A copy: the answer must not alias the pooled buffer.
		if r, err := parseAnswer(append([]byte(nil), buf[:n]...), q); err == nil {
			return r, nil
		}
	}
}

// parseAnswer unpacks b and checks it answers q: its ID, a response, the
// same question.
func parseAnswer(b []byte, q *dns.Msg) (*dns.Msg, error) {
	r := new(dns.Msg)
	if err := r.Unpack(b); err != nil {
		return nil, err
	}
	if r.Id != q.Id || !r.Response || len(r.Question) != 1 ||
		r.Question[0].Qtype != q.Question[0].Qtype || r.Question[0].Qclass != q.Question[0].Qclass ||
		!strings.EqualFold(r.Question[0].Name, q.Question[0].Name) {
		return nil, errMismatch
	}
	return r, nil
}
