package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
)

// A sandbox's TCP ports, reached through the API whatever the sandbox's
// network (none too): HTTP to one (PortURL, DoPort) and raw tunnels
// (DialPort, ForwardPort). They need a token with the rights of exec.

// PortURL is the URL through the API of path (with its query, if any) on
// port of sandbox id: send it requests with the client's token in
// Authorization (DoPort does); the sandbox's server gets them without it.
func (c *Client) PortURL(id string, port int, path string) string {
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port) + path
}

// DoPort sends an HTTP request to path on port of sandbox id and returns
// the answer of the sandbox's server, whatever its status (the caller
// closes its body). warren's own refusals are *Error: an unknown sandbox,
// a bad port, nothing listening (IsPortUnreachable). header may be nil.
func (c *Client) DoPort(ctx context.Context, method, id string, port int, path string, body io.Reader, header http.Header) (*http.Response, error) {
	if c.err != nil {
		return nil, c.err
	}
	if id == "" {
		return nil, errors.New("warren client: empty sandbox id")
	}
	req, err := http.NewRequestWithContext(ctx, method, c.PortURL(id, port, path), body)
	if err != nil {
		return nil, fmt.Errorf("warren client: %w", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.userAgent != "" && req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, c.tlsErr(err)
	}
	if resp.Header.Get(api.PortResponseHeader) == "" && (resp.StatusCode < 200 || resp.StatusCode > 299) {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// DialPort opens a tunnel to port of sandbox id (GET
// /v1/sandboxes/{id}/portforward/{port}, an HTTP/1.1 Upgrade to
// "tcp"): the connection carries one TCP connection's bytes to and from
// 127.0.0.1:port inside the sandbox. CloseWrite (on the returned
// connection, which has one) half-closes it: the sandbox's server reads
// EOF and may still answer. ctx bounds the opening only. The tunnel is a
// call on the sandbox while it is open (its idle timeout waits). Errors:
// *Error for warren's refusals (IsPortUnreachable when nothing listens).
func (c *Client) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if c.err != nil {
		return nil, c.err
	}
	p, err := sandboxPath(id, "/portforward/"+strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(c.base + p)
	if err != nil {
		return nil, fmt.Errorf("warren client: %w", err)
	}
	conn, err := c.dialAPI(ctx, u)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, c.tlsErr(err)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	req := &http.Request{Method: http.MethodGet, URL: u, Host: u.Host, Header: http.Header{}}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.TunnelUpgrade)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	br := bufio.NewReader(conn)
	err = req.Write(conn)
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(br, req)
	}
	if !stop() || err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("warren client: open tunnel: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	conn.SetDeadline(time.Time{})
	return &tunnelConn{Conn: conn, r: br}, nil
}

// dialAPI connects to the API server of u as the client's transport
// would (its dialer and TLS configuration), offering HTTP/1.1 only: an
// Upgrade cannot ride HTTP/2. Proxies are not used.
func (c *Client) dialAPI(ctx context.Context, u *url.URL) (net.Conn, error) {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	dial := (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	cfg := c.tls
	if t, ok := c.hc.Transport.(*http.Transport); ok {
		if t.DialContext != nil {
			dial = t.DialContext
		}
		if t.TLSClientConfig != nil {
			cfg = t.TLSClientConfig
		}
	}
	conn, err := dial(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil || u.Scheme != "https" {
		return conn, err
	}
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname()
	}
	cfg.NextProtos = []string{"http/1.1"}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return tc, nil
}

// tunnelConn reads what the server sent after its 101 before the
// connection itself.
type tunnelConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *tunnelConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the tunnel: the sandbox's server reads EOF.
func (c *tunnelConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("warren client: this connection cannot half-close")
}

// ForwardPort serves ln until ctx ends, like `kubectl port-forward`:
// every connection it accepts gets a tunnel of its own to port of sandbox
// id (DialPort), spliced to it both ways with half-closes passed on. A
// connection whose tunnel cannot be opened (nothing listens there yet) is
// closed and reported to onError, if not nil, and the rest go on; a
// refusal that no later connection can overcome (the sandbox is gone, the
// token is refused) ends ForwardPort with that error. It closes ln when
// it returns, and ends the tunnels it opened.
func (c *Client) ForwardPort(ctx context.Context, ln net.Listener, id string, port int, onError func(error)) error {
	var tunnels sync.WaitGroup
	defer tunnels.Wait()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer ln.Close()
	for {
		local, err := ln.Accept()
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				if errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded) {
					return nil // asked to stop
				}
				return cause
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		tunnels.Add(1)
		go func() {
			defer tunnels.Done()
			defer local.Close()
			remote, err := c.DialPort(ctx, id, port)
			if err != nil {
				if fatalTunnelError(err) {
					cancel(err)
				} else if onError != nil && ctx.Err() == nil {
					onError(err)
				}
				return
			}
			defer remote.Close()
			done := context.AfterFunc(ctx, func() { local.Close(); remote.Close() })
			defer done()
			if err := splice(local, remote); err != nil && onError != nil && ctx.Err() == nil {
				onError(err)
			}
		}()
	}
}

// fatalTunnelError reports whether err will refuse every later tunnel
// too: the sandbox is gone or not running, or the caller may not open one.
func fatalTunnelError(err error) bool {
	return IsNotFound(err) || IsForbidden(err) || IsUnauthenticated(err) || IsInvalid(err) || IsConflict(err)
}

// splice copies a to b and b to a until both directions ended; a
// direction that reached EOF half-closes its destination. An error in
// either ends both.
func splice(a, b net.Conn) error {
	errc := make(chan error, 2)
	cp := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err == nil {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				err = cw.CloseWrite()
			} else {
				err = dst.Close()
			}
		}
		errc <- err
	}
	go cp(b, a)
	go cp(a, b)
	var first error
	for range 2 {
		if err := <-errc; err != nil && first == nil {
			first = err
			a.Close()
			b.Close()
		}
	}
	if errors.Is(first, net.ErrClosed) {
		return nil
	}
	return first
}

// IsPortUnreachable reports whether err says nothing in the sandbox
// accepted a connection on the port (502 port_unreachable): its server is
// not listening (yet), or failed to answer.
func IsPortUnreachable(err error) bool { return hasCode(err, api.CodePortUnreachable) }
