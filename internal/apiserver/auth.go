package apiserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
)

// Authorization, in three steps:
//
//  1. authenticated resolves the bearer secret to an iam.Principal (Tokens)
//     and puts it in the request context (iam.WithPrincipal).
//  2. It checks the route's rule (routeRules, by the mux pattern): the
//     role must hold the rule's action, within the caller's own scope, or at
//     the root for cluster-wide writes. A reader cannot exec, a runner
//     cannot build layers, a node token reaches no user route.
//  3. Handlers narrow to the object: a create goes to the caller's project
//     or one under it; list keeps the sandboxes of the caller's subtree;
//     calls on one sandbox (get, exec, files, delete) check the sandbox's
//     project. A sandbox outside the caller's scope answers exactly as a
//     missing one does (404 sandbox_not_found, and 204 for a delete, which
//     is idempotent), so sandbox ids leak nothing across projects. Project
//     and token routes are authorized by iam itself: an out-of-scope
//     project path is 403 (paths are names the caller chose, not secrets),
//     an out-of-scope token id is 404.

// Tokens authenticates bearer secrets. *iam.IAM implements it; StaticToken
// stands in for one root admin secret (tests, embedded setups without IAM).
type Tokens interface {
	// Authenticate returns the principal secret stands for, or an
	// ErrUnauthenticated (ErrUnavailable when the token store is away).
	Authenticate(ctx context.Context, secret string) (iam.Principal, error)
}

// StaticToken accepts one secret, compared in constant time, as a root
// admin.
type StaticToken string

// Authenticate implements Tokens.
func (t StaticToken) Authenticate(_ context.Context, secret string) (iam.Principal, error) {
	want, got := sha256.Sum256([]byte(t)), sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
		return iam.Principal{}, errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, "invalid token")
	}
	return iam.Principal{TokenID: "static", Name: "static", Role: iam.RoleAdmin}, nil
}

// rule is what a route asks of its caller before its handler runs.
type rule struct {
	// action the caller's role must hold; "" lets any authenticated caller
	// through (the handler, or iam, authorizes).
	action iam.Action
	// root checks the action at the root project, for writes to objects
	// every project shares; otherwise at the caller's own scope.
	root bool
	// node also lets node tokens in: an agent that joined through an
	// apiserver resolves its FnCall runtimes' environments this way.
	node bool
}

// routeRules maps each mux pattern to its rule, and each call on a sandbox
// (method, path with its verb) to its rule: a verb is served once it is
// here, by the one path that forwards calls on a sandbox to its node. A
// pattern missing here needs a root admin: register new routes here.
//
// Layers and environments belong to no project yet: any builder may add
// them, any reader read them, but deleting them (and GC) takes a
// root-scoped builder, since other projects may depend on them.
var routeRules = map[string]rule{
	"POST /v1/sandboxes":           {action: iam.ActionSandboxCreate},
	"POST /v1/sandboxes:batch":     {action: iam.ActionSandboxCreate},
	"POST /v1/sandboxes:pause":     {action: iam.ActionSandboxLifecycle},
	"POST /v1/sandboxes:resume":    {action: iam.ActionSandboxLifecycle},
	"GET /v1/sandboxes":            {action: iam.ActionRead},
	"GET /v1/sandboxes/{id}":       {action: iam.ActionRead},
	"DELETE /v1/sandboxes/{id}":    {action: iam.ActionSandboxDelete},
	"PATCH /v1/sandboxes/{id}":     {action: iam.ActionSandboxLifecycle},
	"POST /v1/sandboxes/{id}/exec": {action: iam.ActionSandboxExec},
	"GET /v1/sandboxes/{id}/stat":  {action: iam.ActionSandboxFiles},
	"GET /v1/sandboxes/{id}/files": {action: iam.ActionSandboxFiles},
	"PUT /v1/sandboxes/{id}/files": {action: iam.ActionSandboxFiles},
	"GET /v1/sandboxes/{id}/stats": {action: iam.ActionRead},
	// Pause and resume: a runner's, like start and stop.
	"POST /v1/sandboxes/{id}/pause": {action: iam.ActionSandboxLifecycle},
	// The journal holds what execs printed: the rights of reading files.
	"GET /v1/sandboxes/{id}/journal": {action: iam.ActionSandboxFiles},
	"POST /v1/sandboxes/{id}/resume": {action: iam.ActionSandboxLifecycle},
	// A vm's screen shows what its files would: the rights of reading
	// them; typing at it runs commands: the rights of exec.
	"GET /v1/sandboxes/{id}/screen": {action: iam.ActionSandboxFiles},
	"POST /v1/sandboxes/{id}/input": {action: iam.ActionSandboxExec},
	// A snapshot publishes an environment: a builder's. (The node API's
	// pack, its node half, is not listed: a root admin's, like any
	// unlisted verb.)
	"POST /v1/sandboxes/{id}/snapshot": {action: iam.ActionEnvironmentWrite},
	// A fork is a create (of sandboxes only its maker and its project
	// see): a runner's.
	"POST /v1/sandboxes/{id}/fork": {action: iam.ActionSandboxCreate},
	"GET /v1/snapshots":            {action: iam.ActionRead},
	"GET /v1/snapshots/{ref...}":   {action: iam.ActionRead},
	// Builders delete snapshots in their scope (deleteSnapshot checks it).
	"DELETE /v1/snapshots/{ref...}":     {action: iam.ActionEnvironmentWrite},
	"PATCH /v1/sandboxes/{id}/network":  {action: iam.ActionSandboxNetwork},
	"GET /v1/images":                    {action: iam.ActionRead},
	"GET /v1/images/{name...}":          {action: iam.ActionRead, node: true},
	"GET /v1/nodes":                     {action: iam.ActionRead},
	"POST /v1/layers":                   {action: iam.ActionLayerWrite},
	"GET /v1/layers":                    {action: iam.ActionRead},
	"GET /v1/layers/{ref...}":           {action: iam.ActionRead},
	"DELETE /v1/layers/{ref...}":        {action: iam.ActionLayerWrite, root: true},
	"POST /v1/environments":             {action: iam.ActionEnvironmentWrite},
	"POST /v1/environments/{ref...}":    {action: iam.ActionEnvironmentWrite}, // publish
	"GET /v1/environments":              {action: iam.ActionRead},
	"GET /v1/environments/{ref...}":     {action: iam.ActionRead},
	"DELETE /v1/environments/{ref...}":  {action: iam.ActionEnvironmentWrite, root: true},
	"POST /v1/gc":                       {action: iam.ActionLayerWrite, root: true},
	"POST /v1/images:import":            {action: iam.ActionEnvironmentWrite},
	"GET /v1/environments/{ref}/export": {action: iam.ActionRead},
	"POST /v1/fn/run":                   {action: iam.ActionSandboxExec},
	"POST /v1/fn/batch":                 {action: iam.ActionSandboxExec},
	"GET /v1/fn/runtimes":               {action: iam.ActionRead},

	// A sandbox's ports, any method (ports.go): the rights of exec.
	"/v1/sandboxes/{id}/ports/{port}/{path...}": {action: iam.ActionSandboxExec},
	"/v1/sandboxes/{id}/ports/{port}":           {action: iam.ActionSandboxExec},
	"GET /v1/sandboxes/{id}/portforward/{port}": {action: iam.ActionSandboxExec},

	// iam authorizes these against the project or token they name.
	"POST /v1/projects":             {},
	"GET /v1/projects":              {},
	"GET /v1/projects/{path...}":    {},
	"PATCH /v1/projects/{path...}":  {},
	"DELETE /v1/projects/{path...}": {},
	"POST /v1/tokens":               {},
	"GET /v1/tokens":                {},
	"DELETE /v1/tokens/{id}":        {},
	"/v1/":                          {}, // no such route: 404 to anyone authenticated
}

// sandboxVerbPrefix starts every routeRules key of a call on a sandbox
// forwarded through sandboxVerbPattern, after its method.
const sandboxVerbPrefix = "/v1/sandboxes/{id}/"

// unknownRoute is the rule of a pattern missing from routeRules.
var unknownRoute = rule{action: iam.ActionProjectWrite, root: true}

// authenticated authenticates and authorizes the caller by the route's
// rule, runs h with the principal in the context and renders its error.
func (s *Server) authenticated(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.checkAuth(r)
		if err == nil {
			err = authorizeRoute(p, routeKey(r))
		}
		if err == nil {
			err = h(w, r.WithContext(iam.WithPrincipal(r.Context(), p)))
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	})
}

func (s *Server) checkAuth(r *http.Request) (iam.Principal, error) {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return iam.Principal{}, errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, "missing bearer token")
	}
	return s.cfg.Tokens.Authenticate(r.Context(), tok)
}

// routeKey is the routeRules key of r: its mux pattern, or for a call on
// a sandbox (sandboxVerbPattern) its method and verb, as in
// "POST /v1/sandboxes/{id}/exec".
func routeKey(r *http.Request) string {
	if r.Pattern != sandboxVerbPattern {
		return r.Pattern
	}
	return r.Method + " /v1/sandboxes/{id}/" + r.PathValue("verb")
}

func authorizeRoute(p iam.Principal, key string) error {
	ru, ok := routeRules[key]
	if method, path, _ := strings.Cut(key, " "); !ok && strings.HasPrefix(path, sandboxVerbPrefix) {
		// No such verb: the same answer to anyone authenticated.
		return errdefs.New(errdefs.ErrNotFound, api.CodeNotFound, "no sandbox call %s %s", method, strings.TrimPrefix(path, sandboxVerbPrefix))
	}
	if !ok {
		ru = unknownRoute
	}
	if ru.action == "" || ru.node && p.Role == iam.RoleNode {
		return nil
	}
	project := p.Project
	if ru.root {
		project = ""
	}
	return iam.Authorize(p, ru.action, project)
}

// projectFor is the project a request acts in: the one it names, else the
// caller's; the caller must be allowed action there.
func projectFor(p iam.Principal, named string, action iam.Action) (string, error) {
	project := p.Project
	if named != "" {
		var err error
		if project, err = iam.CleanPath(named); err != nil {
			return "", err
		}
	}
	if err := iam.Authorize(p, action, project); err != nil {
		return "", err
	}
	return project, nil
}

// principal returns the caller authenticated sets in ctx. Without one (a
// handler reached some other way) it is a principal with no role, which
// every check refuses.
func principal(ctx context.Context) iam.Principal {
	p, _ := iam.PrincipalFrom(ctx)
	return p
}

// errSandboxHidden is how a sandbox outside the caller's scope answers: the
// same code and message as a missing one.
func errSandboxHidden(id string) error {
	return errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "sandbox %s not found", id)
}

type hiddenError struct{ error }

func (e hiddenError) Unwrap() error { return e.error }

// checkSandboxScope returns nil when the caller may reach the sandbox id
// on n: its scope holds the sandbox's project, and it is a builder if the
// sandbox is a build sandbox. Otherwise a 404 as for a missing sandbox.
// Root-scoped builders skip the lookup; the others cost one Get the first
// time an id is seen (a sandbox's project and kind never change and ids
// are never reused, so the answer is cached).
func (s *Server) checkSandboxScope(ctx context.Context, id string, n Node) error {
	p, ok := iam.PrincipalFrom(ctx)
	b := builder(ctx)
	if ok && p.Project == "" && b {
		return nil
	}
	sc, known := s.projects.get(id)
	if !known {
		sb, err := n.Get(ctx, id)
		if errors.Is(err, errdefs.ErrNotFound) {
			return hiddenError{err}
		}
		if err != nil {
			return err
		}
		sc = scopeOf(sb)
		s.projects.put(id, sc)
	}
	if !ok || !iam.InScope(p.Project, sc.project) || sc.build && !b {
		return hiddenError{errSandboxHidden(id)}
	}
	return nil
}

// sandboxScope is what decides who may reach a sandbox.
type sandboxScope struct {
	project string
	build   bool // a build sandbox: builders only
}

func scopeOf(sb api.Sandbox) sandboxScope { return sandboxScope{sb.Project, sb.Build} }

// settleBuild fills in a create's Build for caller p (see
// api.CreateSandboxRequest.Build): a builder's creates are build
// sandboxes unless it says otherwise, and only builders and admins make
// them (403 for the others).
func settleBuild(ctx context.Context, b *bool) (*bool, error) {
	p := principal(ctx)
	if b == nil {
		v := p.Role == iam.RoleBuilder
		return &v, nil
	}
	if *b && !builder(ctx) {
		return nil, errdefs.New(errdefs.ErrForbidden, api.CodeForbidden, "a build sandbox needs a builder or admin token; this one is %s", p.Role)
	}
	return b, nil
}

// isHidden reports whether checkSandboxScope found the sandbox missing or
// out of the caller's scope (the caller cannot tell which).
func isHidden(err error) bool {
	var h hiddenError
	return errors.As(err, &h)
}

// listScope returns the project subtree a list shows: ?project= when
// given (it must lie in the caller's scope: 403 otherwise), else the
// caller's scope.
func listScope(r *http.Request) (string, error) {
	p, ok := iam.PrincipalFrom(r.Context())
	if !ok {
		return "", errdefs.New(errdefs.ErrForbidden, api.CodeForbidden, "no caller")
	}
	q, ok := r.URL.Query()["project"]
	if !ok || len(q) == 0 {
		return p.Project, nil
	}
	project, err := iam.CleanPath(q[0])
	if err != nil {
		return "", err
	}
	if err := iam.Authorize(p, iam.ActionRead, project); err != nil {
		return "", err
	}
	return project, nil
}

// inScope keeps the sandboxes of list that lie in project's subtree,
// and the build sandboxes among them only if builds (the caller is a
// builder).
func inScope(list []api.Sandbox, project string, builds bool) []api.Sandbox {
	if project == "" && builds {
		return list
	}
	kept := list[:0]
	for _, sb := range list {
		if iam.InScope(project, sb.Project) && (builds || !sb.Build) {
			kept = append(kept, sb)
		}
	}
	return kept
}

// projectCache remembers which project a sandbox id belongs to. Bounded:
// when full, a random tenth is dropped (entries are cheap to refetch).
type projectCache struct {
	mu sync.Mutex
	m  map[string]sandboxScope
}

const projectCacheSize = 1 << 17

func (c *projectCache) get(id string) (sandboxScope, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.m[id]
	return p, ok
}

func (c *projectCache) put(id string, sc sandboxScope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]sandboxScope{}
	}
	if len(c.m) >= projectCacheSize {
		n := projectCacheSize / 10
		for k := range c.m { // map order is random enough
			delete(c.m, k)
			if n--; n == 0 {
				break
			}
		}
	}
	c.m[id] = sc
}
