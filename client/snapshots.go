package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/warrenhq/warren/api"
)

// Snapshot takes a snapshot of a running sandbox (POST
// /v1/sandboxes/{id}/snapshot): what it wrote becomes an environment,
// req.Name@req.Version, that sandboxes anywhere can be created from. The
// sandbox runs on; it is held still only while its writes are copied
// (the result's Stats.FreezeMS).
func (c *Client) Snapshot(ctx context.Context, id string, req api.SnapshotRequest) (*api.Snapshot, error) {
	p, err := sandboxPath(id, "/snapshot")
	if err != nil {
		return nil, err
	}
	var snap api.Snapshot
	if err := c.doJSON(ctx, http.MethodPost, p, nil, req, &snap); err != nil {
		return nil, err
	}
	return &snap, nil
}

// ListSnapshots lists the snapshots in the caller's scope, oldest first;
// source, if set, keeps only those taken of that sandbox.
func (c *Client) ListSnapshots(ctx context.Context, source string) ([]api.Snapshot, error) {
	var q url.Values
	if source != "" {
		q = url.Values{"source": {source}}
	}
	var list api.SnapshotList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots", q, nil, &list); err != nil {
		return nil, err
	}
	return list.Snapshots, nil
}

// GetSnapshot returns a snapshot by id or by its environment's
// "name@version".
func (c *Client) GetSnapshot(ctx context.Context, ref string) (*api.Snapshot, error) {
	p, err := refPath("/v1/snapshots/", ref)
	if err != nil {
		return nil, err
	}
	var snap api.Snapshot
	if err := c.doJSON(ctx, http.MethodGet, p, nil, nil, &snap); err != nil {
		return nil, err
	}
	return &snap, nil
}

// Fork makes req.Count new sandboxes from a running sandbox's state now
// (POST /v1/sandboxes/{id}/fork), each isolated from its siblings and
// the parent, which runs on. Like CreateBatch, a partly made gang (when
// not all or none) answers with the members made and the errors of the
// others.
func (c *Client) Fork(ctx context.Context, id string, req api.ForkRequest) (*api.ForkResponse, error) {
	p, err := sandboxPath(id, "/fork")
	if err != nil {
		return nil, err
	}
	var out api.ForkResponse
	if err := c.doJSON(ctx, http.MethodPost, p, nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSnapshot deletes a snapshot (by id or name@version) with its
// environment, and its diff layer unless something builds on it. A
// snapshot that live sandboxes or other snapshots build on is refused
// (409 snapshot_in_use) unless force.
func (c *Client) DeleteSnapshot(ctx context.Context, ref string, force bool) error {
	p, err := refPath("/v1/snapshots/", ref)
	if err != nil {
		return err
	}
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	return c.doJSON(ctx, http.MethodDelete, p, q, nil, nil)
}

// Lineage returns where a snapshot, or a sandbox (by id), comes from and
// the tree of what was made from it.
func (c *Client) Lineage(ctx context.Context, ref string) (*api.Lineage, error) {
	p, err := refPath("/v1/snapshots/", ref)
	if err != nil {
		return nil, err
	}
	var l api.Lineage
	if err := c.doJSON(ctx, http.MethodGet, p+"/lineage", nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// SquashEnvironment squashes the diff layers on top of environment ref
// into one (a builder's call); Squashed is false when there were fewer
// than two. 409 squash_running while one runs.
func (c *Client) SquashEnvironment(ctx context.Context, ref string) (*api.SquashResult, error) {
	p, err := refPath("/v1/environments/", ref)
	if err != nil {
		return nil, err
	}
	var res api.SquashResult
	if err := c.doJSON(ctx, http.MethodPost, p+"/squash", nil, struct{}{}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// PublishEnvironment publishes environment ref (a builder's snapshot) so
// that runners see it and create from it: only if req.Check, when given,
// passes in a fresh sandbox made from it (409 check_failed otherwise;
// its outcome is kept on the environment either way).
func (c *Client) PublishEnvironment(ctx context.Context, ref string, req api.PublishRequest) (*api.Environment, error) {
	p, err := refPath("/v1/environments/", ref)
	if err != nil {
		return nil, err
	}
	var env api.Environment
	if err := c.doJSON(ctx, http.MethodPost, p+"/publish", nil, req, &env); err != nil {
		return nil, err
	}
	return &env, nil
}
