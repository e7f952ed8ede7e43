package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// portDialTimeout bounds one connect inside a sandbox: on loopback a
// connect is answered at once, unless the server's accept queue is full
// (then SYNs are dropped and retried for minutes).
const portDialTimeout = 10 * time.Second

// PortDial connects to a port of the sandbox a Ports call is on.
type PortDial func(ctx context.Context, port int) (net.Conn, error)

// Ports begins a call on sandbox id's ports: it finds the sandbox running
// and its backend a backend.PortDialer, and keeps the sandbox alive until
// done (an HTTP request to one of its ports). dial connects to its ports
// from the node, whatever its network policy; the connections it makes
// hold nothing of the call, so an HTTP transport may keep them between
// calls. Errors: as every call's (404, 409, 400 not_supported); dial's, 400
// for a port outside 1-65535 and 502 port_unreachable when nothing
// accepts. A gVisor sandbox's ports are out of the node's reach: 400
// not_supported, before a paused one is resumed for nothing.
func (a *Agent) Ports(ctx context.Context, id string) (dial PortDial, done func(error) error, err error) {
	if s, err := a.lookup(id); err == nil {
		if err := s.ownNetwork("ports"); err != nil { // runtime.go
			return nil, nil, err
		}
	}
	pd, _, done, err := call[backend.PortDialer](ctx, a, id, "ports")
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, port int) (net.Conn, error) { return dialPort(ctx, pd, id, port) }, done, nil
}

// DialPort connects to 127.0.0.1:port inside sandbox id from the node (a
// port-forward tunnel). The connection is a call on the sandbox until it
// is closed: while it is open the sandbox's idle timeout does not run.
// Errors as Ports'.
func (a *Agent) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	dial, done, err := a.Ports(ctx, id)
	if err != nil {
		return nil, err
	}
	c, err := dial(ctx, port)
	if err != nil {
		if gone := done(nil); gone != nil {
			return nil, gone
		}
		return nil, err
	}
	return &callConn{Conn: c, done: done}, nil
}

func dialPort(ctx context.Context, pd backend.PortDialer, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Invalid("port %d: want 1 to 65535", port)
	}
	ctx, cancel := context.WithTimeout(ctx, portDialTimeout)
	defer cancel()
	c, err := pd.DialPort(ctx, id, port)
	if err == nil {
		return c, nil
	}
	var classified *errdefs.Error
	if errors.As(err, &classified) {
		return nil, err // not found, not running, a bad port
	}
	return nil, &errdefs.Error{Kind: errdefs.ErrUnreachable, Code: api.CodePortUnreachable,
		Msg: fmt.Sprintf("nothing in sandbox %s accepted a connection on port %d: %v", id, port, unwrapOp(err))}
}

// unwrapOp shortens a *net.OpError to its cause ("connection refused"),
// the rest being addresses inside the sandbox the caller did not give.
func unwrapOp(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// callConn is a connection that is a call on its sandbox until closed.
type callConn struct {
	net.Conn
	once sync.Once
	done func(error) error
}

func (c *callConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.done(nil) })
	return err
}

// CloseWrite half-closes the connection, so a tunnel passes a FIN on.
func (c *callConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}
