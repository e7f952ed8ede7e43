package hostproxy

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/warrenhq/warren/internal/netpolicy"
)

// MaxHello bounds the bytes read for a ClientHello (a large one, with
// post-quantum key shares, is about 2 KiB).
const MaxHello = 64 << 10

// alertAccessDenied is a fatal TLS access_denied alert record.
var alertAccessDenied = []byte{21, 3, 3, 0, 2, 2, 49}

func (p *Proxy) serveTLS(c net.Conn, sb *netpolicy.Sandbox, dst netip.AddrPort) {
	c.SetReadDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
	hello, sni, err := readClientHello(c)
	if err != nil {
		sb.DenyConn()
		p.log.Debug("tls connection refused: no ClientHello", "sandbox", sb.ID, "dst", dst, "err", err)
		c.Write(alertAccessDenied)
		lingerClose(c)
		return
	}
	c.SetReadDeadline(time.Time{})
	pr := &pair{}
	pr.add(c)
	untrack, ok := track(sb, pr, sni, dst)
	if !ok {
		sb.DenyConn()
		p.log.Debug("tls connection refused", "sandbox", sb.ID, "sni", sni, "dst", dst)
		c.Write(alertAccessDenied)
		lingerClose(c)
		return
	}
	defer untrack()
	up, err := p.dial(pr, dst)
	if err != nil {
		p.log.Debug("tls connection: destination unreachable", "sandbox", sb.ID, "sni", sni, "dst", dst, "err", err)
		return
	}
	defer up.Close()
	if _, err := up.Write(hello); err != nil {
		return
	}
	splice(pr, c, up)
}

var errHelloRead = errors.New("ClientHello read")

// readClientHello reads c up to the end of a ClientHello and returns every
// byte it read (the hello and anything sent with it) and the hello's SNI
// ("" if none). crypto/tls parses the hello: a server handshake on a
// connection that records what is read, writes nothing, and stops in
// GetConfigForClient.
func readClientHello(c net.Conn) (read []byte, sni string, err error) {
	rc := &recordingConn{Conn: c, r: io.LimitReader(c, MaxHello)}
	got := false
	cfg := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni, got = h.ServerName, true
		return nil, errHelloRead
	}}
	err = tls.Server(rc, cfg).Handshake()
	if !got {
		if err == nil {
			err = errors.New("handshake ended without a ClientHello")
		}
		return nil, "", err
	}
	return rc.buf.Bytes(), sni, nil
}

// recordingConn keeps what is read and refuses writes (the alert
// crypto/tls would send).
type recordingConn struct {
	net.Conn
	r   io.Reader
	buf bytes.Buffer
}

func (rc *recordingConn) Read(b []byte) (int, error) {
	n, err := rc.r.Read(b)
	rc.buf.Write(b[:n])
	return n, err
}

func (rc *recordingConn) Write(b []byte) (int, error) { return 0, errors.New("read only") }
