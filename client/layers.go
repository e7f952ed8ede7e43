package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/warrenhq/warren/api"
)

// LayerSpec names a layer to build.
type LayerSpec struct {
	Name    string
	Version string
	Kind    string // api.LayerBase, LayerWorkspace, LayerToolkit or LayerDiff
	Parent  string // the "name@version" a diff layer applies on
}

func (s LayerSpec) query() url.Values {
	q := url.Values{"name": {s.Name}, "version": {s.Version}, "kind": {s.Kind}}
	if s.Parent != "" {
		q.Set("parent", s.Parent)
	}
	return q
}

// BuildLayer builds a layer on the server from r, a tar or gzip-compressed
// tar stream of its files, and returns it. The server refuses an
// existing name@version (ErrConflict, code "layer_exists") and a corrupt
// or empty archive (ErrInvalid).
func (c *Client) BuildLayer(ctx context.Context, spec LayerSpec, r io.Reader) (*api.Layer, error) {
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/layers", query: spec.query(), body: r, contentType: contentTar})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var l api.Layer
	if err := decodeBody(resp, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// BuildLayerFromPath builds a layer from a local directory (sent as a tar
// stream with numeric owners, modes and mtimes) or a .tar or .tar.gz file
// (sent as is).
func (c *Client) BuildLayerFromPath(ctx context.Context, spec LayerSpec, path string) (*api.Layer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return c.BuildLayer(ctx, spec, f)
	}
	pr, pw := io.Pipe()
	packErr := make(chan error, 1)
	go func() {
		err := packDir(pw, path, true)
		pw.CloseWithError(err)
		packErr <- err
	}()
	l, err := c.BuildLayer(ctx, spec, pr)
	pr.CloseWithError(errUploadEnded)
	if perr := <-packErr; perr != nil && !errors.Is(perr, errUploadEnded) {
		return nil, perr
	}
	return l, err
}

// ListLayers returns every layer (or every version of one name, if name is
// not empty), with the environments using each.
func (c *Client) ListLayers(ctx context.Context, name string) ([]api.Layer, error) {
	var q url.Values
	if name != "" {
		q = url.Values{"name": {name}}
	}
	var list api.LayerList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/layers", q, nil, &list); err != nil {
		return nil, err
	}
	return list.Layers, nil
}

// GetLayer returns a layer by "name@version" (or "name": the latest);
// code "layer_not_found" if there is none.
func (c *Client) GetLayer(ctx context.Context, ref string) (*api.Layer, error) {
	p, err := refPath("/v1/layers/", ref)
	if err != nil {
		return nil, err
	}
	var l api.Layer
	if err := c.doJSON(ctx, http.MethodGet, p, nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// DeleteLayer deletes the layer "name@version". Refused with code
// "layer_in_use" while an environment or a live sandbox uses it.
func (c *Client) DeleteLayer(ctx context.Context, ref string) error {
	p, err := refPath("/v1/layers/", ref)
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}

// CreateEnvironment creates an environment version, or derives one from
// req.From (see api.CreateEnvironmentRequest). Code "env_exists" if the
// name@version is taken.
func (c *Client) CreateEnvironment(ctx context.Context, req api.CreateEnvironmentRequest) (*api.Environment, error) {
	var env api.Environment
	if err := c.doJSON(ctx, http.MethodPost, "/v1/environments", nil, req, &env); err != nil {
		return nil, err
	}
	return &env, nil
}

// ListEnvironments returns every environment (or every version of one
// name, if name is not empty).
func (c *Client) ListEnvironments(ctx context.Context, name string) ([]api.Environment, error) {
	var q url.Values
	if name != "" {
		q = url.Values{"name": {name}}
	}
	var list api.EnvironmentList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/environments", q, nil, &list); err != nil {
		return nil, err
	}
	return list.Environments, nil
}

// GetEnvironment returns an environment by "name@version" (or "name": the
// latest); code "env_not_found" if there is none.
func (c *Client) GetEnvironment(ctx context.Context, ref string) (*api.Environment, error) {
	p, err := refPath("/v1/environments/", ref)
	if err != nil {
		return nil, err
	}
	var env api.Environment
	if err := c.doJSON(ctx, http.MethodGet, p, nil, nil, &env); err != nil {
		return nil, err
	}
	return &env, nil
}

// DeleteEnvironment deletes the environment "name@version". Sandboxes
// started from it keep running.
func (c *Client) DeleteEnvironment(ctx context.Context, ref string) error {
	p, err := refPath("/v1/environments/", ref)
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}

// CollectGarbage deletes the blobs no layer, environment or live sandbox
// references any more, and reports what it did.
func (c *Client) CollectGarbage(ctx context.Context) (*api.GCResult, error) {
	var res api.GCResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/gc", nil, nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// refPath escapes each "/"-separated segment of a ref under prefix.
func refPath(prefix, ref string) (string, error) {
	if ref == "" {
		return "", errors.New("warren client: empty ref")
	}
	segs := strings.Split(ref, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return prefix + strings.Join(segs, "/"), nil
}

func decodeBody(resp *http.Response, v any) error {
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("warren client: decode %s answer: %w", resp.Request.URL.Path, err)
	}
	return nil
}
