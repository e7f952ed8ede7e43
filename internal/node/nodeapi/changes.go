package nodeapi

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/node"
)

// Changer is an Agent that can tell what changed since an earlier list
// (node.Agent.Changes); GET /v1/changes serves it, and answers a full list
// for an agent that cannot.
type Changer interface {
	Changes(ctx context.Context, epoch string, since uint64) (node.Changes, error)
}

var _ Changer = (*node.Agent)(nil)

// changes serves GET /v1/changes?epoch=E&since=N.
func (s *Server) changes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var since uint64
	if v := q.Get("since"); v != "" {
		var err error
		if since, err = strconv.ParseUint(v, 10, 64); err != nil {
			return errdefs.Invalid("since %q: want a revision", v)
		}
	}
	var ch node.Changes
	if c, ok := s.agent.(Changer); ok {
		var err error
		if ch, err = c.Changes(r.Context(), q.Get("epoch"), since); err != nil {
			return err
		}
	} else {
		list, err := s.agent.List(r.Context(), node.Filter{})
		if err != nil {
			return err
		}
		ch = node.Changes{Full: true, Sandboxes: list}
	}
	return httperr.WriteJSON(w, http.StatusOK, ch)
}

// Changes returns what changed on the node since the revision since of
// epoch (from an earlier answer; "" and 0 the first time): see
// node.Changes. A node that predates GET /v1/changes is listed whole.
func (c *Client) Changes(ctx context.Context, epoch string, since uint64) (node.Changes, error) {
	var ch node.Changes
	q := url.Values{"epoch": {epoch}, "since": {strconv.FormatUint(since, 10)}}
	err := c.doJSON(ctx, http.MethodGet, "/v1/changes", q, nil, &ch)
	var e *errdefs.Error
	if err != nil && errors.As(err, &e) && errors.Is(err, errdefs.ErrNotFound) && e.Code == api.CodeNotFound {
		list, lerr := c.List(ctx, node.Filter{})
		return node.Changes{Full: true, Sandboxes: list}, lerr
	}
	if err != nil {
		return node.Changes{}, err
	}
	if ch.Sandboxes == nil {
		ch.Sandboxes = []api.Sandbox{}
	}
	return ch, nil
}
