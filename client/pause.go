package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/warrenhq/warren/api"
)

// PauseSandbox pauses a running sandbox: its processes frozen, its memory
// pushed out where the node can; its TTL and idle clocks stand still.
// Any later call on it resumes it first (transparently); a paused one
// answers as it is. 409 sandbox_busy while calls on it are in flight.
func (c *Client) PauseSandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.sandboxVerb(ctx, id, "/pause")
}

// ResumeSandbox resumes a paused sandbox; a running one answers as it is.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.sandboxVerb(ctx, id, "/resume")
}

func (c *Client) sandboxVerb(ctx context.Context, id, verb string) (*api.Sandbox, error) {
	p, err := sandboxPath(id, verb)
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.doJSON(ctx, http.MethodPost, p, nil, struct{}{}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// PauseSandboxes pauses every running sandbox sel matches, across nodes
// (a project's subtree, labels, or both), and says how each went.
func (c *Client) PauseSandboxes(ctx context.Context, sel api.PauseSelector) (*api.BulkPauseResult, error) {
	return c.bulk(ctx, "/v1/sandboxes:pause", sel)
}

// ResumeSandboxes resumes every paused sandbox sel matches.
func (c *Client) ResumeSandboxes(ctx context.Context, sel api.PauseSelector) (*api.BulkPauseResult, error) {
	return c.bulk(ctx, "/v1/sandboxes:resume", sel)
}

func (c *Client) bulk(ctx context.Context, path string, sel api.PauseSelector) (*api.BulkPauseResult, error) {
	var res api.BulkPauseResult
	if err := c.doJSON(ctx, http.MethodPost, path, nil, sel, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// UpdateSandbox changes a live sandbox's TTL (counted from now), idle
// timeout, auto-pause and labels (api.SandboxUpdate), paused or not.
func (c *Client) UpdateSandbox(ctx context.Context, id string, u api.SandboxUpdate) (*api.Sandbox, error) {
	p, err := sandboxPath(id, "")
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.doJSON(ctx, http.MethodPatch, p, nil, u, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Journal returns the calls on a sandbox its node recorded after entry
// since (0: all it keeps), oldest first: each exec and file call, pause
// and resume, with its timing, its end and a bounded head and tail of its
// output.
func (c *Client) Journal(ctx context.Context, id string, since int64) (*api.Journal, error) {
	p, err := sandboxPath(id, "/journal")
	if err != nil {
		return nil, err
	}
	var q url.Values
	if since > 0 {
		q = url.Values{"since": {strconv.FormatInt(since, 10)}}
	}
	var j api.Journal
	if err := c.doJSON(ctx, http.MethodGet, p, q, nil, &j); err != nil {
		return nil, err
	}
	return &j, nil
}
