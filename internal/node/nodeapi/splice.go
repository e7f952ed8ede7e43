package nodeapi

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
)

// splice copies a to b and b to a until both directions ended, then
// closes both. A direction that reaches EOF half-closes its destination
// (a TCP FIN, a TLS close_notify), so the other goes on: a client that
// sent all it had still gets the whole answer. An error in either
// direction ends both. ar and br are what to read a and b from (a bufio
// reader holding bytes read ahead, or the conn itself). It returns the
// first error, nil when both ended cleanly.
func splice(a net.Conn, ar io.Reader, b net.Conn, br io.Reader) error {
	errc := make(chan error, 2)
	cp := func(dst net.Conn, src io.Reader) {
		_, err := io.Copy(dst, src)
		if err == nil {
			err = closeWrite(dst)
		}
		errc <- err
	}
	go cp(b, ar)
	go cp(a, br)
	var first error
	for range 2 {
		if err := <-errc; err != nil && first == nil {
			first = err
			a.Close() // unblocks the other direction
			b.Close()
		}
	}
	a.Close()
	b.Close()
	if errors.Is(first, net.ErrClosed) {
		first = nil
	}
	return first
}

// closeWrite half-closes c, or closes it if it cannot.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// hijacked is what to read a hijacked connection from: the bytes its
// server read ahead, then the connection itself. Not brw itself: reading
// on through it reaches the server's own reader, whose EOF (the caller's
// half-close) cancels the request's context.
func hijacked(c net.Conn, brw *bufio.ReadWriter) io.Reader {
	n := brw.Reader.Buffered()
	if n == 0 {
		return c
	}
	b, _ := brw.Reader.Peek(n)
	return io.MultiReader(bytes.NewReader(bytes.Clone(b)), c)
}
