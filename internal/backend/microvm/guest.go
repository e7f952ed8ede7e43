package microvm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"

	"github.com/warrenhq/warren/guest/proto"
	"github.com/warrenhq/warren/internal/errdefs"
)

// guest is the node's side of one sandbox's agent channel: one session
// on the virtio-serial port's socket at a time, dialled on first use and
// again after it broke (an agent restart, a resume).
type guest struct {
	sock, secret string
	alive        func() bool // whether QEMU still runs

	mu sync.Mutex
	cc *http2.ClientConn
}

// errGone is returned when QEMU has exited.
var errGone = errors.New("the machine is not running")

// handshakeAttempt bounds one connection's handshake: past it, the
// connection is dropped and another made, which QEMU tells the guest as
// a session ending and a new one beginning (a guest agent stuck in a
// session of before a restore starts over).
const handshakeAttempt = 15 * time.Second

// sessionIdle and sessionPing: how long a session may be silent before
// it is pinged, and how long the ping may go unanswered.
const (
	sessionIdle = 30 * time.Second
	sessionPing = 20 * time.Second
)

// client returns the current session, dialling one if needed.
func (g *guest) client(ctx context.Context) (*http2.ClientConn, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cc != nil && g.cc.CanTakeNewRequest() {
		return g.cc, nil
	}
	if g.cc != nil {
		g.cc.Close()
		g.cc = nil
	}
	for {
		conn, r, err := g.session(ctx)
		if err == nil {
			// A session that hears nothing for a while is pinged, and
			// dropped when the ping goes unanswered: a guest agent that
			// died under a request (a vm's, restarted by its init) must not
			// leave the request waiting forever, as nothing else tells.
			t := &http2.Transport{AllowHTTP: true, ReadIdleTimeout: sessionIdle, PingTimeout: sessionPing}
			cc, err := t.NewClientConn(&bufConn{Conn: conn, r: r})
			if err != nil {
				conn.Close()
				return nil, err
			}
			g.cc = cc
			return cc, nil
		}
		switch {
		case g.alive != nil && !g.alive():
			return nil, errGone
		case ctx.Err() != nil:
			return nil, fmt.Errorf("guest agent: %w", ctx.Err())
		case errors.Is(err, proto.ErrVersion):
			return nil, errdefs.Unavailable("guest agent: %v", err)
		case !errors.Is(err, context.DeadlineExceeded):
			return nil, fmt.Errorf("guest agent: %w", err)
		}
	}
}

// session dials the port's socket and runs the handshake on it, for at
// most handshakeAttempt.
func (g *guest) session(ctx context.Context) (net.Conn, *bufio.Reader, error) {
	var d net.Dialer
	var conn net.Conn
	var err error
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		if conn, err = d.DialContext(ctx, "unix", g.sock); err == nil {
			break
		}
		if g.alive != nil && !g.alive() {
			return nil, nil, errGone
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
	}
	// The handshake waits for the guest agent: it answers once the
	// guest has booted. QEMU ending meanwhile ends the wait.
	hctx, cancel := context.WithTimeout(ctx, handshakeAttempt)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if g.alive != nil && !g.alive() {
					cancel()
					return
				}
			}
		}
	}()
	r := bufio.NewReaderSize(conn, 64<<10)
	if err := proto.HostHandshake(hctx, conn, r, g.secret); err != nil {
		conn.Close()
		if hctx.Err() != nil {
			return nil, nil, hctx.Err()
		}
		return nil, nil, err
	}
	return conn, r, nil
}

// close ends the session.
func (g *guest) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cc != nil {
		g.cc.Close()
		g.cc = nil
	}
}

// bufConn reads through the handshake's buffered reader.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// do sends one request; a non-2xx answer is returned as its error.
func (g *guest) do(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Response, error) {
	cc, err := g.client(ctx)
	if err != nil {
		return nil, err
	}
	u := "http://guest" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	resp, err := cc.RoundTrip(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("guest agent: %w", ctx.Err())
		}
		return nil, fmt.Errorf("guest agent: %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// call sends a request with a JSON (or no) body and decodes a JSON answer
// into out (if not nil).
func (g *guest) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := g.do(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("guest agent: %s %s: %w", method, path, err)
	}
	return nil
}

// decodeError turns an error answer into an errdefs error.
func decodeError(resp *http.Response) error {
	var e proto.Error
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		return fmt.Errorf("guest agent: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return protoError(&e)
}

func protoError(e *proto.Error) error {
	switch e.Code {
	case proto.CodeNotFound:
		return fmt.Errorf("%w: %s", errdefs.ErrNotFound, e.Message)
	case proto.CodeInvalid:
		return errdefs.Invalid("%s", e.Message)
	case proto.CodeConflict:
		return errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "%s", e.Message)
	case proto.CodeUnavailable:
		return errdefs.Unavailable("%s", e.Message)
	case proto.CodeRefused:
		return fmt.Errorf("%s: %w", e.Message, syscall.ECONNREFUSED)
	}
	return fmt.Errorf("guest agent: %s", e.Message)
}

// trailerError is the error a stream's trailer reports, if any.
func trailerError(resp *http.Response) error {
	if msg := resp.Trailer.Get("Warren-Error"); msg != "" {
		return fmt.Errorf("guest agent: %s", msg)
	}
	return nil
}

// send sends a request whose body is r and wants an empty success.
func (g *guest) send(ctx context.Context, method, path string, q url.Values, r io.Reader) error {
	resp, err := g.do(ctx, method, path, q, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return nil
}
