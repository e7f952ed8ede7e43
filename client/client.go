// Package client is warren's Go SDK: a thin, typed wrapper over REST v1 for
// trainers, verifiers and tools. It depends on api/ and the standard library
// only, so it is cheap to vendor into any program.
//
// Every call takes a context first; cancelling it aborts the request (and,
// for exec, asks the server to stop the command). Server refusals come back
// as *Error; classify them with errors.Is (ErrNotFound, ErrExhausted, ...) or
// the Is* helpers.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
)

// DefaultAddr is where `warren up` listens by default.
const DefaultAddr = "http://127.0.0.1:7443"

const (
	contentJSON   = "application/json"
	contentNDJSON = "application/x-ndjson"
	contentTar    = "application/x-tar"
	contentOctet  = "application/octet-stream"

	// errBodyLimit bounds how much of an error body is read.
	errBodyLimit = 64 << 10
)

// Client talks to one warren API endpoint. It is safe for concurrent use.
type Client struct {
	base      string // scheme://host[:port][/prefix], no trailing slash
	token     string
	hc        *http.Client
	userAgent string
	retry     RetryPolicy
	tls       *tls.Config // WithCAFile, WithTLSConfig
	err       error       // an option that failed: every call answers it

	// sleep waits d or until ctx ends; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// RetryPolicy says how CreateSandbox retries when the server refuses with 429
// (quota, rate limit, node admission) or 503 (no node can take it). Only such
// explicit refusals are retried: they guarantee nothing was created. A
// transport error is never retried, since the create may have happened.
type RetryPolicy struct {
	// MaxAttempts counts tries including the first; 1 or less disables retry.
	MaxAttempts int
	// MaxWait is the longest single wait; when the server asks for longer,
	// the refusal is returned at once so the caller can decide.
	MaxWait time.Duration
	// DefaultWait is used when the server gives no Retry-After.
	DefaultWait time.Duration
}

// DefaultRetry is the create retry policy of a new Client: a burst that hits
// a momentarily full node is smoothed over, a long refusal is not hidden.
var DefaultRetry = RetryPolicy{MaxAttempts: 3, MaxWait: 10 * time.Second, DefaultWait: time.Second}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the http.Client used for every request. It should have
// no overall Timeout: exec streams and file copies can run for long; bound
// calls with their context instead.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// WithCreateRetry sets how CreateSandbox retries 429 and 503 refusals,
// and RunFn 429 ones. WithCreateRetry(RetryPolicy{}) turns retry off.
func WithCreateRetry(p RetryPolicy) Option { return func(c *Client) { c.retry = p } }

// New returns a client for the API at addr ("http://host:port",
// "https://host", or a bare "host:port", read as http) that sends token as
// a bearer token (none when empty). New does not contact the server.
func New(addr, token string, opts ...Option) *Client {
	c := &Client{
		base:      normalizeAddr(addr),
		token:     token,
		hc:        defaultHTTPClient(),
		userAgent: "warren-go-client",
		retry:     DefaultRetry,
		sleep:     sleepCtx,
	}
	hc := c.hc
	for _, o := range opts {
		o(c)
	}
	if c.hc == hc && c.tls != nil { // no WithHTTPClient: TLS options apply
		c.hc = httpClientTLS(c.tls)
	}
	if c.hc == nil {
		c.hc = defaultHTTPClient()
	}
	return c
}

// defaultHTTPClient keeps enough idle connections to one server for a
// trainer's many concurrent calls: net/http's default of 2 per host makes
// every other request open a new connection and leave one in TIME_WAIT.
func defaultHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	return &http.Client{Transport: t}
}

// Addr returns the base URL the client sends requests to.
func (c *Client) Addr() string { return c.base }

func normalizeAddr(addr string) string {
	a := strings.TrimSpace(addr)
	if a == "" {
		a = DefaultAddr
	}
	if !strings.Contains(a, "://") {
		a = "http://" + a
	}
	return strings.TrimRight(a, "/")
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// request describes one API call.
type request struct {
	method      string
	path        string // already escaped
	query       url.Values
	body        io.Reader
	contentType string
	accept      string
}

func (c *Client) newRequest(ctx context.Context, r request) (*http.Request, error) {
	u := c.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, r.body)
	if err != nil {
		return nil, fmt.Errorf("warren client: %w", err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.accept != "" {
		req.Header.Set("Accept", r.accept)
	} else {
		req.Header.Set("Accept", contentJSON)
	}
	return req, nil
}

// do sends r and returns the response when its status is 2xx; otherwise it
// consumes the body and returns it decoded as *Error. The caller closes the
// body of a returned response.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	if c.err != nil {
		return nil, c.err
	}
	req, err := c.newRequest(ctx, r)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, c.tlsErr(err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// doJSON sends in (if not nil) as JSON and decodes a 2xx body into out (if
// not nil).
func (c *Client) doJSON(ctx context.Context, method, path string, query url.Values, in, out any) error {
	r := request{method: method, path: path, query: query}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("warren client: encode request: %w", err)
		}
		r.body = bytes.NewReader(b)
		r.contentType = contentJSON
	}
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errBodyLimit))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("warren client: decode %s %s answer: %w", method, path, err)
	}
	return nil
}

// decodeError turns a non-2xx answer into *Error. A body that is not the
// documented {"error": {...}} (a proxy's HTML page, say) still yields an
// Error with a code derived from the status and the body's text as message.
func decodeError(resp *http.Response) *Error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
	e := &Error{StatusCode: resp.StatusCode}
	var body api.ErrorBody
	if json.Unmarshal(raw, &body) == nil && (body.Error.Code != "" || body.Error.Message != "") {
		e = fromAPIError(resp.StatusCode, &body.Error)
	} else {
		e.Message = strings.TrimSpace(string(raw))
		if len(e.Message) > 512 {
			e.Message = e.Message[:512] + "..."
		}
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	if e.Code == "" {
		e.Code = codeForStatus(resp.StatusCode)
	}
	if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		e.RetryAfter = d
	}
	return e
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		if n > 24*3600 {
			n = 24 * 3600
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		d := t.Sub(now)
		if d < 0 {
			d = 0
		}
		return d, true
	}
	return 0, false
}

func mediaType(h http.Header) string {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil {
		return ""
	}
	return mt
}

// sandboxPath returns /v1/sandboxes/{id}{suffix} with id escaped.
func sandboxPath(id, suffix string) (string, error) {
	if id == "" {
		return "", errors.New("warren client: empty sandbox id")
	}
	return "/v1/sandboxes/" + url.PathEscape(id) + suffix, nil
}

// postRetrying POSTs body to path into out, retrying a refusal that retry
// accepts (nil: any) per the client's RetryPolicy (retryWait). When the
// policy gives up, the last refusal is returned.
func (c *Client) postRetrying(ctx context.Context, path string, body, out any, retry func(error) bool) error {
	for attempt := 1; ; attempt++ {
		err := c.doJSON(ctx, http.MethodPost, path, nil, body, out)
		if err == nil || retry != nil && !retry(err) {
			return err
		}
		d, ok := c.retryWait(err, attempt)
		if !ok {
			return err
		}
		if serr := c.sleep(ctx, d); serr != nil {
			return err
		}
	}
}

// retryWait decides whether and how long to wait before retrying err on
// attempt n (1-based). Waits get up to 20% jitter so that a burst of
// refused creates does not come back in lockstep.
func (c *Client) retryWait(err error, attempt int) (time.Duration, bool) {
	p := c.retry
	if attempt >= p.MaxAttempts || !IsRetryable(err) {
		return 0, false
	}
	var e *Error
	if !errors.As(err, &e) {
		return 0, false
	}
	d := e.RetryAfter
	if d <= 0 {
		d = p.DefaultWait
		if d <= 0 {
			d = time.Second
		}
	}
	if p.MaxWait > 0 && d > p.MaxWait {
		return 0, false
	}
	d += time.Duration(rand.Int64N(int64(d)/5 + 1))
	return d, true
}
