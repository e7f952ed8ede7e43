package apiserver

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
)

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	sb, err := s.admitCreate(w, r, req, s.cluster.Create) // quota.go
	if err != nil {
		return err
	}
	s.metrics.created.Inc()
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	return writeJSON(w, http.StatusCreated, sb)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	scope, err := listScope(r) // auth.go
	if err != nil {
		return err
	}
	q := r.URL.Query()
	f := node.Filter{State: q.Get("state")}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return errdefs.Invalid("label filter %q: want key=value", l)
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	list, err := s.cluster.List(r.Context(), f)
	if err != nil {
		return err
	}
	list = inScope(list, scope, builder(r.Context()))
	return writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: list})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	sb, err := n.Get(r.Context(), id)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

// deleteSandbox is idempotent: deleting a sandbox that is already gone
// answers 204 too, so callers can retry after a network error.
func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if isHidden(err) { // gone, or outside the caller's scope: the same answer
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err != nil {
		return err
	}
	if err := n.Delete(r.Context(), id); err != nil {
		return err
	}
	s.deleted(id) // quota.go
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// sandboxVerbPattern is the one route of every call on a sandbox but its
// GET and DELETE: the method and verb pick the call's rule (routeRules).
const sandboxVerbPattern = "/v1/sandboxes/{id}/{verb}"

// sandboxCall is the one path of the calls on one sandbox: resolve its
// node (lost nodes answer there, Cluster.Route), check the caller may see
// the sandbox, and forward the call to the node as it came.
// forwardSandbox forwards a call on the sandbox itself (PATCH) to its
// node, as is.
func (s *Server) forwardSandbox(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	return n.Forward(w, r, id)
}

func (s *Server) sandboxCall(w http.ResponseWriter, r *http.Request) error {
	id, n, err := s.sandboxNode(r)
	if err != nil {
		return err
	}
	if r.PathValue("verb") == "exec" {
		s.metrics.execs.Inc()
	}
	err = n.Forward(w, r, id)
	var cut *nodeapi.CutShort
	if !errors.As(err, &cut) {
		return err
	}
	s.log.Warn("sandbox call cut short", "sandbox", id, "verb", r.PathValue("verb"), "err", cut.Err)
	if mt, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type")); mt == ndjsonType {
		// An exec stream ends with its error, as the node would have:
		// the platform's fault (its node or agent went away mid-call).
		status, e := apiError(errdefs.AsInfra(cut.Err, "the node's connection broke during the call"))
		json.NewEncoder(w).Encode(api.ExecEvent{Error: &e, Status: status})
		return nil
	}
	panic(http.ErrAbortHandler)
}

const ndjsonType = "application/x-ndjson"

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) error {
	imgs, err := s.cfg.Images.List(r.Context())
	if err != nil {
		return err
	}
	shown := make([]api.Image, 0, len(imgs))
	for _, img := range imgs {
		if !img.Unpublished || builder(r.Context()) { // publish.go
			shown = append(shown, img)
		}
	}
	return writeJSON(w, http.StatusOK, api.ImageList{Images: shown})
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) error {
	if err := s.checkPublished(r.Context(), r.PathValue("name")); err != nil { // publish.go
		return err
	}
	img, err := s.cfg.Images.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, img)
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	nodes, err := s.cluster.Nodes(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.NodeList{Nodes: nodes})
}
