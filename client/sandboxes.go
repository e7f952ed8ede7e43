package client

import (
	"context"
	"net/http"
	"net/url"
	"sort"

	"github.com/warrenhq/warren/api"
)

// CreateSandbox creates a sandbox and returns it as the server sees it.
// Refusals with 429 or 503 are retried per the client's RetryPolicy,
// honouring Retry-After; the last refusal is returned (IsRetryable, with
// RetryAfter set) when the policy gives up.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.postRetrying(ctx, "/v1/sandboxes", req, &sb, nil); err != nil {
		return nil, err
	}
	return &sb, nil
}

// CreateSandboxes creates a gang of req.Count sandboxes from req.Template
// (POST /v1/sandboxes:batch), each labelled api.LabelGang and
// api.LabelGangIndex. With req.AllOrNone it creates all or none and
// returns the failure otherwise; without it, the response lists the
// members created and an error per member that was not (err is set only
// when none was created). A refusal (429) with AllOrNone created nothing,
// so it is retried as CreateSandbox retries; other batches are not.
func (c *Client) CreateSandboxes(ctx context.Context, req api.BatchCreateRequest) (*api.BatchCreateResponse, error) {
	var out api.BatchCreateResponse
	retry := func(err error) bool { return req.AllOrNone && IsExhausted(err) }
	if err := c.postRetrying(ctx, "/v1/sandboxes:batch", req, &out, retry); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetSandbox returns one sandbox (ErrNotFound if it does not exist).
func (c *Client) GetSandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	p, err := sandboxPath(id, "")
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.doJSON(ctx, http.MethodGet, p, nil, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filters ListSandboxes. All labels must match; an empty State
// matches every state; an empty Project means the token's whole scope.
type ListOptions struct {
	Labels map[string]string
	State  string
	// Project narrows the list to that project's subtree, which must lie
	// within the token's scope (ErrForbidden otherwise).
	Project string
}

// ListSandboxes returns the sandboxes the token may see that match opts.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) ([]api.Sandbox, error) {
	q := url.Values{}
	keys := make([]string, 0, len(opts.Labels))
	for k := range opts.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+opts.Labels[k])
	}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	if opts.Project != "" {
		q.Set("project", opts.Project)
	}
	var list api.SandboxList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &list); err != nil {
		return nil, err
	}
	return list.Sandboxes, nil
}

// DeleteSandbox destroys a sandbox. It is idempotent on the server: deleting
// a sandbox that is already gone succeeds.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	p, err := sandboxPath(id, "")
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, nil)
}

// ListImages returns the images sandboxes can start from.
func (c *Client) ListImages(ctx context.Context) ([]api.Image, error) {
	var list api.ImageList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/images", nil, nil, &list); err != nil {
		return nil, err
	}
	return list.Images, nil
}

// GetImage returns one image; a missing one is a *Error with code
// "image_not_found".
func (c *Client) GetImage(ctx context.Context, name string) (*api.Image, error) {
	var img api.Image
	if err := c.doJSON(ctx, http.MethodGet, "/v1/images/"+url.PathEscape(name), nil, nil, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// ListNodes returns the node agents and their capacity, usage and health.
func (c *Client) ListNodes(ctx context.Context) ([]api.Node, error) {
	var list api.NodeList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/nodes", nil, nil, &list); err != nil {
		return nil, err
	}
	return list.Nodes, nil
}

// Health checks GET /healthz; nil means the server answered 2xx.
func (c *Client) Health(ctx context.Context) error {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/healthz"})
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Stats reports a running sandbox's resource use now (GET
// /v1/sandboxes/{id}/stats).
func (c *Client) Stats(ctx context.Context, id string) (*api.SandboxStats, error) {
	p, err := sandboxPath(id, "/stats")
	if err != nil {
		return nil, err
	}
	var st api.SandboxStats
	if err := c.doJSON(ctx, http.MethodGet, p, nil, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// UpdateNetwork changes a running sandbox's egress policy (PATCH
// /v1/sandboxes/{id}/network) and returns the policy now in force. It
// applies within a second, also to connections already open.
func (c *Client) UpdateNetwork(ctx context.Context, id string, u api.NetworkUpdate) (*api.SandboxNetwork, error) {
	p, err := sandboxPath(id, "/network")
	if err != nil {
		return nil, err
	}
	var n api.SandboxNetwork
	if err := c.doJSON(ctx, http.MethodPatch, p, nil, u, &n); err != nil {
		return nil, err
	}
	return &n, nil
}
