package lazy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// Layers is what a node needs of its lazy layers, served in its own
// process (FS) or by a layer server (Client).
type Layers interface {
	// Add makes a layer appear as a file and returns its path (see FS.Add).
	Add(l Layer) (string, error)
	// Stats are the chunk cache's totals and the layers' shares.
	Stats() (Stats, error)
}

var (
	_ Layers = (*Client)(nil)
	_ Layers = localLayers{}
)

// Local serves layers from f, in this process.
func Local(f *FS) Layers { return localLayers{f} }

type localLayers struct{ *FS }

func (l localLayers) Stats() (Stats, error) { return l.FS.Stats(), nil }

// Client talks to the layer server in a directory (Serve). Errors: a
// layer the server refuses is ErrInvalid; a server that does not answer
// is a plain error.
type Client struct {
	dir  string
	http *http.Client
}

// Dial returns a client of the server in dir and what the server says
// about itself; an error if none answers there.
func Dial(ctx context.Context, dir string) (*Client, Info, error) {
	sock := Socket(dir)
	c := &Client{dir: dir, http: &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}},
	}}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, Info{}, err
	}
	return c, info, nil
}

// Close lets go of the client's idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Info asks the server about itself: a liveness probe.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var info Info
	return info, c.call(ctx, http.MethodGet, "/v1/info", nil, &info)
}

// Add asks the server to serve a layer.
func (c *Client) Add(l Layer) (string, error) {
	var out struct{ Path string }
	if err := c.call(context.Background(), http.MethodPut, "/v1/layers", l, &out); err != nil {
		return "", err
	}
	return out.Path, nil
}

// Remove asks the server to stop serving a layer (mounts of it read on).
func (c *Client) Remove(digest string) error {
	return c.call(context.Background(), http.MethodDelete, "/v1/layers/"+digest, nil, nil)
}

// Stats asks the server for its totals, waiting up to 5 s.
func (c *Client) Stats() (Stats, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.StatsContext(ctx)
}

// StatsContext is Stats bounded by ctx.
func (c *Client) StatsContext(ctx context.Context) (Stats, error) {
	var st Stats
	return st, c.call(ctx, http.MethodGet, "/v1/stats", nil, &st)
}

// Traces asks the server for the prefetch traces it recorded that are
// not acknowledged yet (FS.Traces).
func (c *Client) Traces(ctx context.Context) ([]Trace, error) {
	var out struct{ Traces []Trace }
	return out.Traces, c.call(ctx, http.MethodGet, "/v1/traces", nil, &out)
}

// AckTrace tells the server that the trace of layer digest is stored: it
// forgets it (FS.AckTrace).
func (c *Client) AckTrace(ctx context.Context, digest string) error {
	return c.call(ctx, http.MethodDelete, "/v1/traces/"+digest, nil, nil)
}

// Stop asks the server to unmount its filesystem and exit. Layers still
// mounted on its files fail reads from then on.
func (c *Client) Stop(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, "/v1/stop", nil, nil)
}

// StopUnused is Stop if no layer is mounted on the server's files; an
// ErrConflict, and the server serves on, if any is.
func (c *Client) StopUnused(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, "/v1/stop?unused=1", nil, nil)
}

func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://lazyd"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("lazy layer server %s: %w", c.dir, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		msg := strings.TrimSpace(string(b))
		switch resp.StatusCode {
		case http.StatusBadRequest: // the request's fault: a bad layer
			return errdefs.Invalid("%s", msg)
		case http.StatusConflict:
			return errdefs.New(errdefs.ErrConflict, "", "lazy layer server %s: %s", c.dir, msg)
		}
		return fmt.Errorf("lazy layer server %s: %s %s: %s", c.dir, method, path, msg)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
