package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/warrenhq/warren/api"
)

// projectPath returns /v1/projects/{path} with each segment escaped. "" and
// "/" name the root project.
func projectPath(path string) string {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "/v1/projects/" + strings.Join(segs, "/")
}

// CreateProject creates a sub-project with a quota carved out of its
// parent's. It needs an admin token scoped to a proper ancestor. Refusals:
// ErrConflict with code "project_exists", "quota_exceeds_parent" (the
// parent has not that much left to hand down) or "too_many_projects";
// ErrNotFound ("project_not_found") when the parent is missing;
// ErrForbidden; ErrInvalid ("invalid_project") for a malformed path.
func (c *Client) CreateProject(ctx context.Context, req api.CreateProjectRequest) (*api.Project, error) {
	var p api.Project
	if err := c.doJSON(ctx, http.MethodPost, "/v1/projects", nil, req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// GetProject returns one project with its quota, its subtree's usage and
// its direct children.
func (c *Client) GetProject(ctx context.Context, path string) (*api.Project, error) {
	var p api.Project
	if err := c.doJSON(ctx, http.MethodGet, projectPath(path), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ListProjects returns the project at path and every project under it,
// sorted by path (parents first). An empty path lists the token's own
// project's subtree; "/" is the root.
func (c *Client) ListProjects(ctx context.Context, path string) ([]api.Project, error) {
	var q url.Values
	if path != "" {
		q = url.Values{"path": {path}}
	}
	var list api.ProjectList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/projects", q, nil, &list); err != nil {
		return nil, err
	}
	return list.Projects, nil
}

// UpdateProject changes the quota fields and the description req carries
// and keeps the rest. Refusals as CreateProject, plus code
// "quota_below_children" when a quota would drop below what the project
// handed down to its sub-projects. A quota may drop below current usage:
// creates then wait until usage drains.
func (c *Client) UpdateProject(ctx context.Context, path string, req api.UpdateProjectRequest) (*api.Project, error) {
	var p api.Project
	if err := c.doJSON(ctx, http.MethodPatch, projectPath(path), nil, req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// DeleteProject deletes a project without sub-projects or sandboxes
// (ErrConflict with "project_has_children" or "project_in_use"
// otherwise). Its tokens stop working.
func (c *Client) DeleteProject(ctx context.Context, path string) error {
	if strings.Trim(path, "/") == "" {
		return errors.New("warren client: the root project cannot be deleted")
	}
	return c.doJSON(ctx, http.MethodDelete, projectPath(path), nil, nil, nil)
}

// CreateToken mints a token and returns it with its secret, which the
// server shows this once. The caller must be an admin whose scope holds
// req.Project; the role may not rank above the caller's, nor the token
// outlive it (ErrForbidden).
func (c *Client) CreateToken(ctx context.Context, req api.CreateTokenRequest) (*api.CreatedToken, error) {
	var t api.CreatedToken
	if err := c.doJSON(ctx, http.MethodPost, "/v1/tokens", nil, req, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTokens returns the tokens scoped anywhere in project's subtree
// (empty: the caller's own project), oldest first, expired ones included.
// It needs an admin token.
func (c *Client) ListTokens(ctx context.Context, project string) ([]api.Token, error) {
	var q url.Values
	if project != "" {
		q = url.Values{"project": {project}}
	}
	var list api.TokenList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/tokens", q, nil, &list); err != nil {
		return nil, err
	}
	return list.Tokens, nil
}

// RevokeToken deletes a token; it stops working at once on the apiserver
// that answers and within seconds on the others. An unknown id, or one
// outside the caller's scope, is ErrNotFound ("token_not_found").
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("warren client: empty token id")
	}
	return c.doJSON(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(id), nil, nil, nil)
}
