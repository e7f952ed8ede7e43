package hostproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/warrenhq/warren/internal/netpolicy"
)

// Bounds of what the HTTP proxy parses.
const (
	MaxHead      = 64 << 10 // one request or response head
	maxLine      = 16 << 10 // one line of it (bufio's buffer)
	maxChunkLine = 4 << 10
	maxPipelined = 32 // requests forwarded ahead of their responses
)

// httpError is a request the proxy refuses, with its status and reason.
type httpError struct {
	status int
	reason string
}

func (e *httpError) Error() string { return e.reason }

func badRequest(format string, args ...any) *httpError {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// refusal is the response to a refused request: short plain text, and the
// connection closes after it.
func refusal(e *httpError) []byte {
	body := "warren: " + e.reason + "\n"
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		e.status, http.StatusText(e.status), len(body), body)
}

// exchange is one request forwarded upstream, for the response side.
type exchange struct {
	method  string
	upgrade bool       // a WebSocket upgrade: the response side says if it switched
	verdict chan bool  // with upgrade
	refuse  *httpError // not a request: answer this once the responses before it are through
}

// httpConn is one client connection of the HTTP proxy.
type httpConn struct {
	p      *Proxy
	sb     *netpolicy.Sandbox
	dst    netip.AddrPort
	client net.Conn
	br     *bufio.Reader
	pr     *pair

	up       net.Conn
	queue    chan *exchange
	respDone chan struct{}
	name     string
	untrack  func()
}

func (p *Proxy) serveHTTP(c net.Conn, sb *netpolicy.Sandbox, dst netip.AddrPort) {
	h := &httpConn{p: p, sb: sb, dst: dst, client: c, br: bufio.NewReaderSize(c, maxLine), pr: &pair{}}
	h.pr.add(c)
	h.run()
	if h.untrack != nil {
		h.untrack()
	}
	if h.up != nil {
		h.up.Close()
	}
}

// run reads, checks and forwards the requests of the connection.
func (h *httpConn) run() {
	for first := true; ; first = false {
		if first {
			h.client.SetReadDeadline(time.Now().Add(h.p.cfg.HandshakeTimeout))
		} else if _, err := h.br.Peek(1); err == nil {
			h.client.SetReadDeadline(time.Now().Add(h.p.cfg.HandshakeTimeout))
		}
		head, err := readHead(h.br, true)
		h.client.SetReadDeadline(time.Time{})
		if err == io.EOF {
			h.finish() // the client is done sending
			return
		}
		if err != nil {
			var he *httpError
			if errors.As(err, &he) {
				h.refuse(he)
			} else {
				h.finish()
			}
			return
		}
		req, he := parseRequest(head)
		if he != nil {
			h.refuse(he)
			return
		}
		name, he := requestHost(req)
		if he != nil {
			h.refuse(he)
			return
		}
		if h.untrack == nil || name != h.name {
			untrack, ok := track(h.sb, h.pr, name, h.dst)
			if !ok {
				shown := name
				if shown == "" {
					shown = "(none)"
				}
				h.refuse(&httpError{http.StatusForbidden,
					fmt.Sprintf("host %q is not in this sandbox's network policy at %s", shown, h.dst)})
				return
			}
			if h.untrack != nil {
				h.untrack()
			}
			h.untrack, h.name = untrack, name
		}
		if h.up == nil && !h.connect() {
			return
		}
		ex := &exchange{method: req.Method, upgrade: isWebSocket(req.Header)}
		if ex.upgrade {
			ex.verdict = make(chan bool, 1)
		}
		if !h.send(ex) {
			return
		}
		if _, err := h.up.Write(head); err != nil {
			h.pr.Close()
			h.finish()
			return
		}
		if err := copyBody(h.up, h.br, req); err != nil {
			h.p.log.Debug("http request body", "sandbox", h.sb.ID, "err", err)
			h.pr.Close()
			h.finish()
			return
		}
		if !ex.upgrade {
			continue
		}
		select {
		case switched := <-ex.verdict:
			if switched {
				// The rest is the upgraded protocol's, as it is.
				pipe(h.pr, h.up, readerConn{h.client, h.br})
				<-h.respDone
				return
			}
		case <-h.respDone:
			return
		}
	}
}

// send hands ex to the response side, unless that has ended.
func (h *httpConn) send(ex *exchange) bool {
	select {
	case h.queue <- ex:
		return true
	case <-h.respDone:
		return false
	}
}

// readerConn reads through the buffered reader that holds what has come
// already.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (rc readerConn) Read(b []byte) (int, error) { return rc.r.Read(b) }

// connect dials the destination and starts the response side; it answers
// 502 itself if it cannot.
func (h *httpConn) connect() bool {
	up, err := h.p.dial(h.pr, h.dst)
	if err != nil {
		h.p.log.Debug("http: destination unreachable", "sandbox", h.sb.ID, "dst", h.dst, "err", err)
		h.client.Write(refusal(&httpError{http.StatusBadGateway, fmt.Sprintf("cannot reach %s", h.dst)}))
		return false
	}
	h.up = up
	h.queue = make(chan *exchange, maxPipelined)
	h.respDone = make(chan struct{})
	go h.responses()
	return true
}

// refuse answers he and ends the connection: at once if nothing went
// upstream yet, else after the responses to the requests before it.
func (h *httpConn) refuse(he *httpError) {
	h.sb.DenyConn()
	h.p.log.Debug("http request refused", "sandbox", h.sb.ID, "dst", h.dst, "status", he.status, "why", he.reason)
	if h.up == nil {
		h.client.Write(refusal(he))
		lingerClose(h.client)
		return
	}
	h.send(&exchange{refuse: he})
	h.finish()
}

// finish tells upstream no more requests come and waits for the response
// side to end.
func (h *httpConn) finish() {
	if h.up == nil {
		return
	}
	close(h.queue)
	closeWrite(h.up)
	<-h.respDone
}

// responses forwards upstream's responses to the client, one exchange at
// a time, until upstream or the client is done.
func (h *httpConn) responses() {
	defer close(h.respDone)
	ubr := bufio.NewReaderSize(h.up, maxLine)
	for {
		_, perr := ubr.Peek(1)
		var ex *exchange
		var ok bool
		select {
		case ex, ok = <-h.queue:
		default:
			if perr != nil {
				h.pr.Close() // upstream closed an idle connection
				return
			}
			ex, ok = <-h.queue
		}
		if !ok {
			h.pr.Close()
			return
		}
		if ex.refuse != nil {
			h.client.Write(refusal(ex.refuse))
			lingerClose(h.client)
			h.pr.Close()
			return
		}
		switched, err := h.response(ubr, ex)
		if ex.upgrade {
			ex.verdict <- switched
		}
		if switched {
			pipe(h.pr, h.client, readerConn{h.up, ubr})
			return
		}
		if err != nil {
			if err != io.EOF {
				h.p.log.Debug("http response", "sandbox", h.sb.ID, "dst", h.dst, "err", err)
			}
			h.pr.Close()
			return
		}
	}
}

// errUntilClose: the response's body runs to the end of the connection.
var errUntilClose = io.EOF

// response forwards the response to ex (after any 1xx) and reports
// whether it switched protocols.
func (h *httpConn) response(ubr *bufio.Reader, ex *exchange) (switched bool, err error) {
	for {
		head, err := readHead(ubr, false)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return false, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(head)), &http.Request{Method: ex.method})
		if err != nil {
			return false, err
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			if !ex.upgrade || !isWebSocket(resp.Header) {
				h.sb.DenyConn()
				return false, errors.New("101 to an upgrade other than WebSocket: closed")
			}
			if _, err := h.client.Write(head); err != nil {
				return false, err
			}
			return true, nil
		}
		if _, err := h.client.Write(head); err != nil {
			return false, err
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			continue // interim: the final response follows
		}
		switch {
		case ex.method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified:
		case len(resp.TransferEncoding) > 0:
			if !isChunked(resp.TransferEncoding) {
				return false, errors.New("response transfer encoding not chunked")
			}
			if err := copyChunked(h.client, ubr); err != nil {
				return false, err
			}
		case resp.ContentLength >= 0:
			if _, err := io.CopyN(h.client, ubr, resp.ContentLength); err != nil {
				return false, err
			}
		default:
			if _, err := ubr.WriteTo(h.client); err != nil {
				return false, err
			}
			return false, errUntilClose
		}
		return false, nil
	}
}

// readHead reads one message head, through its empty line. strict (for
// requests) refuses bare LF line ends, bare CR, NUL and folded lines;
// empty lines before a request are skipped. io.EOF means the connection
// ended cleanly before a head began.
func readHead(br *bufio.Reader, strict bool) ([]byte, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			return nil, &httpError{http.StatusRequestHeaderFieldsTooLarge, "a request line or header is too long"}
		}
		if err != nil {
			if err == io.EOF && len(head) == 0 && len(line) == 0 {
				return nil, io.EOF
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if strict {
			if len(line) < 2 || line[len(line)-2] != '\r' {
				return nil, badRequest("lines must end in CRLF")
			}
			if bytes.IndexByte(line[:len(line)-2], '\r') >= 0 || bytes.IndexByte(line, 0) >= 0 {
				return nil, badRequest("a CR or NUL inside a line")
			}
			if len(head) > 0 && (line[0] == ' ' || line[0] == '\t') {
				return nil, badRequest("folded header lines are not accepted")
			}
		}
		blank := len(bytes.TrimRight(line, "\r\n")) == 0
		if blank && len(head) == 0 && strict {
			continue // RFC 9112 2.2: ignore empty lines before a request
		}
		head = append(head, line...)
		if len(head) > MaxHead {
			return nil, &httpError{http.StatusRequestHeaderFieldsTooLarge, "request head too large"}
		}
		if blank {
			return head, nil
		}
	}
}

// request is a parsed request head.
type request struct {
	*http.Request
	hosts []string // the Host fields as sent (ReadRequest drops them)
}

// parseRequest parses a request head strictly enough that the server
// cannot frame it differently.
func parseRequest(head []byte) (*request, *httpError) {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		return nil, badRequest("malformed request: %v", err)
	}
	if req.ProtoMajor != 1 {
		return nil, &httpError{http.StatusHTTPVersionNotSupported, "only HTTP/1.x"}
	}
	if req.Method == http.MethodConnect {
		return nil, &httpError{http.StatusForbidden, "CONNECT is not allowed"}
	}
	// Go's parser drops Transfer-Encoding on HTTP/1.0 and merges equal
	// Content-Lengths: count the fields as sent.
	var te, cl, hosts []string
	for _, line := range bytes.Split(head, []byte("\r\n"))[1:] {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		switch strings.ToLower(string(k)) {
		case "transfer-encoding":
			te = append(te, strings.TrimSpace(string(v)))
		case "content-length":
			cl = append(cl, strings.TrimSpace(string(v)))
		case "host":
			hosts = append(hosts, strings.TrimSpace(string(v)))
		}
	}
	if len(te) > 0 {
		if len(te) > 1 || !strings.EqualFold(te[0], "chunked") || !req.ProtoAtLeast(1, 1) {
			return nil, &httpError{http.StatusNotImplemented, "only Transfer-Encoding: chunked, once, on HTTP/1.1"}
		}
		if len(cl) > 0 {
			return nil, badRequest("both Transfer-Encoding and Content-Length")
		}
	}
	if len(cl) > 1 {
		return nil, badRequest("more than one Content-Length")
	}
	if len(cl) == 1 {
		if n, err := strconv.ParseUint(cl[0], 10, 63); err != nil || cl[0] == "" || cl[0][0] == '+' || int64(n) != req.ContentLength {
			return nil, badRequest("bad Content-Length")
		}
	}
	return &request{req, hosts}, nil
}

// requestHost is the name a request is for: its Host without the port
// ("" for an HTTP/1.0 request without one).
func requestHost(req *request) (string, *httpError) {
	hosts := req.hosts
	if len(hosts) > 1 {
		return "", badRequest("more than one Host")
	}
	if len(hosts) == 0 && req.ProtoAtLeast(1, 1) {
		return "", badRequest("no Host")
	}
	host := ""
	if len(hosts) == 1 {
		host = hosts[0]
		if !httpguts.ValidHostHeader(host) {
			return "", badRequest("malformed Host")
		}
	}
	if req.URL.Host != "" && !strings.EqualFold(req.URL.Host, host) {
		return "", badRequest("the request target's host is not the Host header's")
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	} else if strings.HasPrefix(host, "[") || strings.Count(host, ":") > 0 {
		return "", badRequest("malformed Host")
	}
	return strings.ToLower(strings.TrimSuffix(name, ".")), nil
}

// isWebSocket reports whether h asks for (or, in a response, agrees to)
// an upgrade to WebSocket and nothing else.
func isWebSocket(h http.Header) bool {
	up := h.Values("Upgrade")
	return len(up) == 1 && strings.EqualFold(strings.TrimSpace(up[0]), "websocket") &&
		httpguts.HeaderValuesContainsToken(h["Connection"], "upgrade")
}

func isChunked(te []string) bool { return len(te) == 1 && strings.EqualFold(te[0], "chunked") }

// copyBody forwards a request's body, as framed by parseRequest.
func copyBody(dst io.Writer, br *bufio.Reader, req *request) error {
	switch {
	case isChunked(req.TransferEncoding):
		return copyChunked(dst, br)
	case req.ContentLength > 0:
		_, err := io.CopyN(dst, br, req.ContentLength)
		return err
	}
	return nil
}

// copyChunked forwards a chunked body as it is, checking its framing:
// hex sizes, extensions without control bytes, CRLF after every chunk,
// trailer fields ended by an empty line.
func copyChunked(dst io.Writer, br *bufio.Reader) error {
	for {
		line, err := readChunkLine(br)
		if err != nil {
			return err
		}
		size, err := chunkSize(line)
		if err != nil {
			return err
		}
		if _, err := dst.Write(line); err != nil {
			return err
		}
		if size == 0 {
			break
		}
		if _, err := io.CopyN(dst, br, size); err != nil {
			return err
		}
		crlf, err := readChunkLine(br)
		if err != nil {
			return err
		}
		if len(crlf) != 2 {
			return errors.New("chunk not followed by CRLF")
		}
		if _, err := dst.Write(crlf); err != nil {
			return err
		}
	}
	for n := 0; ; {
		line, err := readChunkLine(br)
		if err != nil {
			return err
		}
		if n += len(line); n > MaxHead {
			return errors.New("trailer too large")
		}
		if len(line) > 2 && (line[0] == ' ' || line[0] == '\t' || bytes.IndexByte(line, ':') <= 0) {
			return errors.New("malformed trailer field")
		}
		if _, err := dst.Write(line); err != nil {
			return err
		}
		if len(line) == 2 {
			return nil
		}
	}
}

// readChunkLine reads a CRLF-terminated line of a chunked body (the
// bytes are only valid until the next read).
func readChunkLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull || len(line) > maxChunkLine {
		return nil, errors.New("chunk line too long")
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' || bytes.IndexByte(line[:len(line)-2], '\r') >= 0 {
		return nil, errors.New("chunk line not ended by CRLF")
	}
	return line, nil
}

func chunkSize(line []byte) (int64, error) {
	s := line[:len(line)-2]
	hex, ext, _ := bytes.Cut(s, []byte(";"))
	if len(hex) == 0 || len(hex) > 15 {
		return 0, errors.New("bad chunk size")
	}
	n, err := strconv.ParseInt(string(hex), 16, 64)
	if err != nil || hex[0] == '+' || hex[0] == '-' {
		return 0, errors.New("bad chunk size")
	}
	for _, c := range ext {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return 0, errors.New("control byte in a chunk extension")
		}
	}
	return n, nil
}
