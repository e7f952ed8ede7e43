package nodeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/node"
)

// NewTransport returns an HTTP transport sized for an apiserver that
// talks to many nodes at a high rate: connections are kept and reused,
// dials give up after a few seconds, dead peers are found by TCP
// keepalives, and nothing else is timed (exec and file streams last as long
// as their context).
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy: nil, // node addresses are never proxied
		// Probes find a peer that vanished without a reset (a cut link)
		// within about 20 s, so a stream to it does not hang for good.
		DialContext: (&net.Dialer{Timeout: 3 * time.Second, KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: 5 * time.Second, Interval: 5 * time.Second, Count: 3,
		}}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
}

// Client calls the node API of one node. It implements the apiserver's
// Node interface. It is safe for concurrent use.
type Client struct {
	id    string
	base  string // http://host:port
	token string
	hc    *http.Client
	// apiserver: the peer is an apiserver (Registrations), whose 401
	// means what it says.
	apiserver bool
}

// NewClient returns a client of node id at addr ("host:port" or an
// http(s) URL), presenting token: the node's secret. A nil hc uses a
// client over NewTransport.
func NewClient(id, addr, token string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Transport: NewTransport()}
	}
	return &Client{id: id, base: baseURL(addr), token: token, hc: hc}
}

func baseURL(addr string) string {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return strings.TrimRight(addr, "/")
}

// ID returns the node's id.
func (c *Client) ID() string { return c.id }

// Addr returns the node API's base URL.
func (c *Client) Addr() string { return c.base }

// do sends one call and returns the response if its status is 2xx; any
// other answer is read into its classified error.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, contentType string, body io.Reader) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.transportErr(ctx, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized && !c.apiserver {
			return nil, c.refused(httperr.Read(resp))
		}
		return nil, httperr.Read(resp)
	}
	return resp, nil
}

// refused classifies a node's 401: the node does not take the secret this
// apiserver has for it, most likely because it restarted with a new one
// that the fleet view has not caught up with yet. That is the node being
// unreachable for now, not the caller's credentials failing, and the node
// did nothing: a create may go to another node.
func (c *Client) refused(err error) error {
	return notSentError{&errdefs.Error{
		Kind: errdefs.ErrUnavailable, Code: api.CodeNodeUnreachable, RetryAfter: time.Second,
		Msg: fmt.Sprintf("node %s at %s refused its node secret (restarted, and not registered again yet?): %v", c.id, c.base, err),
	}}
}

// transportErr classifies a call that got no answer. The caller's own
// cancellation stays what it is.
func (c *Client) transportErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	e := &errdefs.Error{
		Kind: errdefs.ErrUnavailable, Code: api.CodeNodeUnreachable, RetryAfter: time.Second,
		Msg: fmt.Sprintf("node %s at %s did not answer: %v", c.id, c.base, unwrapURL(err)),
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return notSentError{e}
	}
	return e
}

// notSentError is a call that never reached its node: the connection was
// not made, so nothing happened there.
type notSentError struct{ err *errdefs.Error }

func (e notSentError) Error() string { return e.err.Error() }
func (e notSentError) Unwrap() error { return e.err }

// NotSent reports whether err is a call that never reached its node (the
// connection could not be made) or that the node refused unread (a stale
// node secret), so that a create may safely be tried on another node: the
// node cannot have created anything.
func NotSent(err error) bool {
	var ns notSentError
	return errors.As(err, &ns)
}

func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// doJSON sends in (if not nil) as JSON and decodes a 2xx answer into out
// (if not nil).
func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, q, ct, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	// Read whole, then decode: json.Unmarshal over the bytes costs about
	// half of a json.Decoder over the body (which grows its own buffer
	// and scans twice) on a create's answer.
	buf := answerBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledAnswer {
			answerBufs.Put(buf)
		}
	}()
	buf.Reset()
	if resp.ContentLength > 0 && resp.ContentLength <= maxPooledAnswer {
		buf.Grow(int(resp.ContentLength))
	}
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return c.transportErr(ctx, fmt.Errorf("read answer: %w", err))
	}
	if err := json.Unmarshal(buf.Bytes(), out); err != nil {
		return c.transportErr(ctx, fmt.Errorf("decode answer: %w", err))
	}
	return nil
}

// answerBufs holds buffers for answers; ones grown past maxPooledAnswer
// (a long list) are left to the GC.
var answerBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledAnswer = 64 << 10

func sandboxPath(id, suffix string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + suffix
}

// Status asks the node for its status.
func (c *Client) Status(ctx context.Context) (api.Node, error) {
	var n api.Node
	err := c.doJSON(ctx, http.MethodGet, "/v1/status", nil, nil, &n)
	return n, err
}

// Create asks the node to create a sandbox, resolving its image itself.
func (c *Client) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes", nil, CreateRequest{Request: req}, &sb)
	return sb, err
}

// CreateFrom asks the node to create a sandbox from img, which the caller
// resolved from req's image or layers.
func (c *Client) CreateFrom(ctx context.Context, req api.CreateSandboxRequest, img api.Image) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes", nil, CreateRequest{Request: req, Image: &img}, &sb)
	return sb, err
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, ""), nil, nil, &sb)
	return sb, err
}

// FilterQuery encodes f as ParseFilter reads it.
func FilterQuery(f node.Filter) url.Values {
	q := url.Values{}
	if f.State != "" {
		q.Set("state", f.State)
	}
	for k, v := range f.Labels {
		q.Add("label", k+"="+v)
	}
	return q
}

// List returns the node's sandboxes that match f.
func (c *Client) List(ctx context.Context, f node.Filter) ([]api.Sandbox, error) {
	var list api.SandboxList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", FilterQuery(f), nil, &list); err != nil {
		return nil, err
	}
	if list.Sandboxes == nil {
		list.Sandboxes = []api.Sandbox{}
	}
	return list.Sandboxes, nil
}

// Delete destroys a sandbox; deleting one that is gone succeeds.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id, ""), nil, nil, nil)
}

// Forward sends r, a call on one of the node's sandboxes as REST v1
// spells it (the node API's sandbox routes are REST v1's), to the node:
// its method, path, query and body, and the headers that shape them, with
// the node's secret instead of the caller's token. A 2xx answer is copied
// to w as it streams (flushed as it comes for an NDJSON exec stream); any
// other answer comes back as its classified error with nothing written,
// for the caller to answer with. A failure after the answer started is a
// *CutShort.
//
// Calls to a sandbox's ports (IsPortsPath) keep every end-to-end header
// but credentials, and the answers of the sandbox's server (marked
// api.PortResponseHeader) are copied whatever their status. An Upgrade
// request (WebSocket, a port-forward tunnel) is sent on a connection of
// its own and, once the node switched protocols, spliced to the caller's
// (ports.go): Forward returns when both ends closed.
func (c *Client) Forward(w http.ResponseWriter, r *http.Request) error {
	if isUpgrade(r.Header) {
		return c.forwardUpgrade(w, r)
	}
	ctx := r.Context()
	u := c.base + r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	body := io.Reader(http.NoBody)
	if r.ContentLength != 0 {
		// NopCloser: the transport closes what it sends, and r.Body is
		// the server's to close.
		body = io.NopCloser(r.Body)
	}
	out, err := http.NewRequestWithContext(ctx, r.Method, u, body)
	if err != nil {
		return err
	}
	out.ContentLength = r.ContentLength
	copyRequestHeaders(out.Header, r)
	out.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(out)
	if err != nil {
		return c.transportErr(ctx, err)
	}
	defer resp.Body.Close()
	passed := resp.Header.Get(api.PortResponseHeader) != ""
	if resp.StatusCode/100 != 2 && !passed {
		if resp.StatusCode == http.StatusUnauthorized {
			return c.refused(httperr.Read(resp))
		}
		return httperr.Read(resp)
	}
	h := w.Header()
	for k, v := range resp.Header {
		if !hopByHop[k] {
			h[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	flush := func() {}
	if f, ok := w.(http.Flusher); ok && (passed || strings.HasPrefix(resp.Header.Get("Content-Type"), ndjsonType)) {
		flush = f.Flush
	}
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	for {
		n, rerr := resp.Body.Read(*buf)
		if n > 0 {
			if _, werr := w.Write((*buf)[:n]); werr != nil {
				return &CutShort{Err: werr}
			}
			flush()
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			if ctx.Err() != nil {
				rerr = ctx.Err()
			}
			return &CutShort{Err: fmt.Errorf("node %s: answer cut short: %w", c.id, rerr)}
		}
	}
}

// CutShort is a forwarded answer that failed after it had started: its
// caller can only end it (an exec stream gets a last error event; any
// other body is aborted, which its reader sees as a short body).
type CutShort struct{ Err error }

func (e *CutShort) Error() string { return e.Err.Error() }
func (e *CutShort) Unwrap() error { return e.Err }

// copyRequestHeaders copies to h what a forwarded call r keeps of its
// caller's headers: what shapes its body and answer, never the caller's
// credentials; for a sandbox's port, every end-to-end header but those.
func copyRequestHeaders(h http.Header, r *http.Request) {
	if !IsPortsPath(r.URL.Path) {
		for _, k := range forwardedRequestHeaders {
			if v := r.Header.Values(k); len(v) > 0 {
				h[k] = v
			}
		}
		return
	}
	for k, v := range r.Header {
		if !hopByHop[k] && !credentials[k] {
			h[k] = v
		}
	}
	for _, f := range r.Header["Connection"] { // and what Connection names
		for _, k := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(k))
		}
	}
}

var (
	// forwardedRequestHeaders are what a forwarded call keeps of its
	// caller's headers: what shapes its body and answer, never the
	// caller's credentials.
	forwardedRequestHeaders = []string{"Content-Type", "Accept", "Idempotency-Key"}
	credentials             = map[string]bool{"Authorization": true, "Proxy-Authorization": true}
	hopByHop                = map[string]bool{
		"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
		"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Proxy-Connection": true,
	}
	copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
)

// Clients keeps one Client per node over a shared transport, each
// presenting its own node's secret (fleet.Registration), and polls them for
// the fleet watcher. It is safe for concurrent use.
type Clients struct {
	hc *http.Client

	mu sync.Mutex
	m  map[string]*Client
}

// NewClients returns an empty set of clients. A nil hc uses a client over
// NewTransport.
func NewClients(hc *http.Client) *Clients {
	if hc == nil {
		hc = &http.Client{Transport: NewTransport()}
	}
	return &Clients{hc: hc, m: map[string]*Client{}}
}

// Node returns the client of node id at addr presenting secret, made on
// first use and remade when the node's address or secret changes (it
// registered again).
func (cs *Clients) Node(id, addr, secret string) *Client {
	base := baseURL(addr)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.m[id]
	if c == nil || c.base != base || c.token != secret {
		c = &Client{id: id, base: base, token: secret, hc: cs.hc}
		cs.m[id] = c
	}
	return c
}

// Forget drops the client of a node that left.
func (cs *Clients) Forget(id string) {
	cs.mu.Lock()
	delete(cs.m, id)
	cs.mu.Unlock()
}

// Status implements fleet.StatusSource: it polls the node at n.Address
// with n.Secret.
func (cs *Clients) Status(ctx context.Context, n fleet.Registration) (api.Node, error) {
	if n.Address == "" {
		return api.Node{}, errdefs.Unavailable("node %s registered no address", n.ID)
	}
	return cs.Node(n.ID, n.Address, n.Secret).Status(ctx)
}

var _ fleet.StatusSource = (*Clients)(nil)
