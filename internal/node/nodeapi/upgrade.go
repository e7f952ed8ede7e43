package nodeapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/httperr"
)

// forwardUpgrade forwards an Upgrade request (a WebSocket to a sandbox's
// port, a port-forward tunnel) on a connection of its own to the node,
// over HTTP/1.1 whatever the transport would negotiate. A 101 is passed
// to the caller, whose connection is then hijacked and spliced to the
// node's until both ends closed; half-closes pass. Any other answer is
// copied if the sandbox's server gave it, and is the node's classified
// error otherwise.
//
// r's context does not end it: net/http ends it when the caller
// half-closes, which a tunnel's caller may do as soon as it sent its
// request. Until the switch, upgradeTimeout bounds the call; after it, the
// connections' own ends do (a lost node's by TCP keepalive).
func (c *Client) forwardUpgrade(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), upgradeTimeout)
	defer cancel()
	u, err := url.Parse(c.base + r.URL.EscapedPath())
	if err != nil {
		return err
	}
	u.RawQuery = r.URL.RawQuery
	out := (&http.Request{Method: r.Method, URL: u, Host: u.Host, Header: http.Header{}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}).WithContext(ctx)
	copyRequestHeaders(out.Header, r)
	out.Header.Set("Connection", "Upgrade")
	out.Header.Set("Upgrade", r.Header.Get("Upgrade"))
	out.Header.Set("Authorization", "Bearer "+c.token)
	if r.ContentLength != 0 {
		out.Body, out.ContentLength = io.NopCloser(r.Body), r.ContentLength
	}
	conn, err := c.dialRaw(ctx)
	if err != nil {
		return c.transportErr(ctx, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := out.Write(conn); err != nil {
		conn.Close()
		return c.transportErr(ctx, err)
	}
	nr := bufio.NewReader(conn)
	resp, err := http.ReadResponse(nr, out)
	if err != nil {
		conn.Close()
		return c.transportErr(ctx, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		defer resp.Body.Close()
		if resp.Header.Get(api.PortResponseHeader) == "" {
			if resp.StatusCode == http.StatusUnauthorized {
				return c.refused(httperr.Read(resp))
			}
			if resp.StatusCode/100 != 2 {
				return httperr.Read(resp)
			}
		}
		h := w.Header()
		for k, v := range resp.Header {
			if !hopByHop[k] {
				h[k] = v
			}
		}
		w.WriteHeader(resp.StatusCode)
		if _, err := io.Copy(w, resp.Body); err != nil {
			return &CutShort{Err: fmt.Errorf("node %s: answer cut short: %w", c.id, err)}
		}
		return nil
	}
	if !stop() { // the timeout closed conn
		return c.transportErr(ctx, context.DeadlineExceeded)
	}
	cc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		conn.Close()
		return fmt.Errorf("switch protocols on %s: %w", r.URL.Path, err)
	}
	defer cc.Close()
	cc.SetDeadline(time.Time{})
	bw := bufio.NewWriter(cc)
	fmt.Fprintf(bw, "HTTP/1.1 %s\r\n", resp.Status)
	resp.Header.Write(bw)
	bw.WriteString("\r\n")
	if err := bw.Flush(); err != nil {
		conn.Close()
		return nil // the caller left; nothing more to answer
	}
	splice(cc, hijacked(cc, brw), conn, nr)
	return nil
}

// upgradeTimeout bounds an Upgrade call until the node switched
// protocols (or answered otherwise).
const upgradeTimeout = 30 * time.Second

// dialRaw opens a connection to the node as c's transport would (its
// dialer and TLS configuration), speaking HTTP/1.1 only: an Upgrade
// cannot ride HTTP/2.
func (c *Client) dialRaw(ctx context.Context) (net.Conn, error) {
	u, err := url.Parse(c.base)
	if err != nil {
		return nil, err
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443"}[u.Scheme]
		if port == "" {
			port = "80"
		}
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	dial := (&net.Dialer{Timeout: 3 * time.Second}).DialContext
	var tc *tls.Config
	t, _ := c.hc.Transport.(*http.Transport)
	if c.hc.Transport == nil {
		t, _ = http.DefaultTransport.(*http.Transport)
	}
	if t != nil {
		if t.DialContext != nil {
			dial = t.DialContext
		}
		tc = t.TLSClientConfig
	}
	conn, err := dial(ctx, "tcp", addr)
	if err != nil || u.Scheme != "https" {
		return conn, err
	}
	cfg := &tls.Config{}
	if tc != nil {
		cfg = tc.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname()
	}
	cfg.NextProtos = []string{"http/1.1"}
	tlsConn := tls.Client(conn, cfg)
	if err := tlsConn.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return tlsConn, nil
}
