package apiserver

import (
	"net/http"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
)

// iamRoutes registers /v1/projects and /v1/tokens. iam authorizes each
// call against the project or token it names (see auth.go).
func (s *Server) iamRoutes(auth func(handler) http.Handler) {
	s.mux.Handle("POST /v1/projects", auth(s.createProject))
	s.mux.Handle("GET /v1/projects", auth(s.listProjects))
	s.mux.Handle("GET /v1/projects/{path...}", auth(s.getProject))
	s.mux.Handle("PATCH /v1/projects/{path...}", auth(s.updateProject))
	s.mux.Handle("DELETE /v1/projects/{path...}", auth(s.deleteProject))
	s.mux.Handle("POST /v1/tokens", auth(s.createToken))
	s.mux.Handle("GET /v1/tokens", auth(s.listTokens))
	s.mux.Handle("DELETE /v1/tokens/{id}", auth(s.revokeToken))
}

func (s *Server) iam() (*iam.IAM, error) {
	if s.cfg.IAM == nil {
		return nil, errdefs.Unavailable("this server has no projects or tokens (it authenticates one static token)")
	}
	return s.cfg.IAM, nil
}

func (s *Server) createProject(w http.ResponseWriter, r *http.Request) error {
	m, err := s.iam()
	if err != nil {
		return err
	}
	var req api.CreateProjectRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	p, err := m.CreateProject(r.Context(), principal(r.Context()), req.Path,
		iam.ProjectSpec{Quota: quotaFromAPI(req.Quota), Description: req.Description, MemoryMerge: req.MemoryMerge})
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/projects/"+p.Path)
	return writeJSON(w, http.StatusCreated, projectToAPI(p, nil))
}

// listProjects: GET /v1/projects[?path=P] answers P's subtree (default:
// the caller's scope), parents before children.
func (s *Server) listProjects(w http.ResponseWriter, r *http.Request) error {
	m, err := s.iam()
	if err != nil {
		return err
	}
	by := principal(r.Context())
	path := by.Project
	if q := r.URL.Query(); q.Has("path") {
		path = q.Get("path")
	}
	list, err := m.ListProjects(r.Context(), by, path)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.ProjectList{Projects: projectsToAPI(list)})
}

// getProject answers one project with its direct children's paths.
func (s *Server) getProject(w http.ResponseWriter, r *http.Request) error {
	m, err := s.iam()
	if err != nil {
		return err
	}
	list, err := m.ListProjects(r.Context(), principal(r.Context()), r.PathValue("path"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, projectsToAPI(list)[0]) // list[0] is the project itself
}

// updateProject: PATCH changes the quota fields and description present
// in the body. It reads, then replaces: two concurrent PATCHes of one
// project may lose one's change (the quota rules hold either way).
func (s *Server) updateProject(w http.ResponseWriter, r *http.Request) error {
	m, err := s.iam()
	if err != nil {
		return err
	}
	var req api.UpdateProjectRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	ctx, by := r.Context(), principal(r.Context())
	path, err := iam.CleanPath(r.PathValue("path"))
	if err != nil {
		return err
	}
	// Authorize first, so a caller without the right cannot probe paths.
	if err := iam.Authorize(by, iam.ActionProjectWrite, path); err != nil {
		return err
	}
	cur, err := m.GetProject(ctx, by, path)
	if err != nil {
		return err
	}
	spec := iam.ProjectSpec{Quota: cur.Quota, Description: cur.Description, MemoryMerge: cur.MemoryMerge}
	if req.Quota != nil {
		spec.Quota = quotaFromAPI(req.Quota.Apply(quotaToAPI(cur.Quota)))
	}
	if req.Description != nil {
		spec.Description = *req.Description
	}
	if req.MemoryMerge != nil {
		spec.MemoryMerge = *req.MemoryMerge
	}
	p, err := m.UpdateProject(ctx, by, path, spec)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, projectToAPI(p, nil))
}

func (s *Server) deleteProject(w http.ResponseWriter, r *http.Request) error {
	m, err := s.iam()
	if err != nil {
		return err
	}
	if err := m.DeleteProject(r.Context(), principal(r.Context()), r.PathValue("path")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// createToken answers 201 with the token and its secret, shown this once.
func (s *Server) createToken(w http.ResponseWriter, r *http.Request) error {
	m, err := s.iam()
	if err != nil {
		return err
	}
	var req api.CreateTokenRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	by := principal(r.Context())
	if req.Project == "" {
		req.Project = by.Project // "/" names the root
	}
	tok, secret, err := m.CreateToken(r.Context(), by, iam.TokenSpec{
		Project: req.Project, Role: iam.Role(req.Role), TTL: req.TTL.D(), Name: req.Name, Description: req.Description,
		Node: req.Node,
	})
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	return writeJSON(w, http.StatusCreated, api.CreatedToken{Token: tokenToAPI(tok), Secret: secret})
}

// listTokens: GET /v1/tokens[?project=P] answers the tokens scoped in P's
// subtree (default: the caller's scope); admins only.
func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) error {
	m, err := s.iam()
	if err != nil {
		return err
	}
	by := principal(r.Context())
	project := by.Project
	if q := r.URL.Query(); q.Has("project") {
		project = q.Get("project")
	}
	list, err := m.ListTokens(r.Context(), by, project)
	if err != nil {
		return err
	}
	out := make([]api.Token, len(list))
	for i, t := range list {
		out[i] = tokenToAPI(t)
	}
	return writeJSON(w, http.StatusOK, api.TokenList{Tokens: out})
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) error {
	m, err := s.iam()
	if err != nil {
		return err
	}
	if err := m.RevokeToken(r.Context(), principal(r.Context()), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func quotaFromAPI(q api.Quota) iam.Quota {
	return iam.Quota{
		Resources: iam.Resources{
			Sandboxes: q.Sandboxes, MilliCPU: iam.MilliCPU(q.CPU),
			Memory: int64(q.Memory), Disk: int64(q.Disk),
		},
		CreatesPerSec: q.CreatesPerSec, CreatesBurst: q.CreatesBurst,
		FnCallsPerSec: q.FnCallsPerSec, FnCallsBurst: q.FnCallsBurst,
	}
}

func quotaToAPI(q iam.Quota) api.Quota {
	return api.Quota{
		Sandboxes: q.Sandboxes, CPU: float64(q.MilliCPU) / 1000,
		Memory: api.Quantity(q.Memory), Disk: api.Quantity(q.Disk),
		CreatesPerSec: q.CreatesPerSec, CreatesBurst: q.CreatesBurst,
		FnCallsPerSec: q.FnCallsPerSec, FnCallsBurst: q.FnCallsBurst,
	}
}

func usageToAPI(r iam.Resources) api.Usage {
	return api.Usage{Sandboxes: r.Sandboxes, CPU: float64(r.MilliCPU) / 1000, Memory: api.Quantity(r.Memory), Disk: api.Quantity(r.Disk)}
}

func projectToAPI(p iam.Project, children []string) api.Project {
	return api.Project{
		Path: p.Path, Description: p.Description, Quota: quotaToAPI(p.Quota), MemoryMerge: p.MemoryMerge,
		Usage: usageToAPI(p.Usage), Reserved: usageToAPI(p.Reserved), Children: children,
		CreatedAt: p.CreatedAt, CreatedBy: p.CreatedBy, UpdatedAt: p.UpdatedAt,
	}
}

// projectsToAPI converts a sorted subtree, filling in each project's
// direct children.
func projectsToAPI(list []iam.Project) []api.Project {
	children := map[string][]string{}
	for _, p := range list {
		if p.Path != "" {
			parent := iam.Parent(p.Path)
			children[parent] = append(children[parent], p.Path)
		}
	}
	out := make([]api.Project, len(list))
	for i, p := range list {
		out[i] = projectToAPI(p, children[p.Path]) // sorted, as list is
	}
	return out
}

func tokenToAPI(t iam.Token) api.Token {
	return api.Token{
		ID: t.ID, Project: t.Project, Role: string(t.Role), Name: t.Name, Description: t.Description,
		CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy, ExpiresAt: t.ExpiresAt, Node: t.Node,
	}
}
