package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

// PauseSandboxesProgress is PauseSandboxes (ResumeSandboxes when resume)
// with progress: the server streams each sandbox as it is done, and
// progress hears how many are done of how many.
func (c *Client) PauseSandboxesProgress(ctx context.Context, sel api.PauseSelector, resume bool, progress func(done, total int)) (*api.BulkPauseResult, error) {
	path := "/v1/sandboxes:pause"
	if resume {
		path = "/v1/sandboxes:resume"
	}
	body, err := json.Marshal(sel)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: path, body: bytes.NewReader(body),
		contentType: contentJSON, accept: contentNDJSON})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if mediaType(resp.Header) == contentJSON { // a server without the stream
		var res api.BulkPauseResult
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
			return nil, fmt.Errorf("warren client: decode bulk result: %w", err)
		}
		return &res, nil
	}
	dec := json.NewDecoder(resp.Body)
	total, done := 0, 0
	for {
		var ev struct {
			api.BulkPauseEvent
			Error *api.Error `json:"error,omitempty"`
		}
		if err := dec.Decode(&ev); err != nil {
			return nil, fmt.Errorf("warren client: bulk stream: %w", err)
		}
		switch {
		case ev.Error != nil:
			return nil, fromAPIError(0, ev.Error)
		case ev.Result != nil:
			return ev.Result, nil
		case ev.Total != nil:
			total = *ev.Total
		case ev.Sandbox != nil:
			done++
		}
		if progress != nil {
			progress(done, total)
		}
	}
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
