package iam

import (
	"context"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Role is what a token may do. Reader < Runner < Builder < Admin, each
// holding every right of the ones before it; Node stands apart and only
// reaches the node-agent endpoints.
type Role string

const (
	RoleReader  Role = "reader"
	RoleRunner  Role = "runner"
	RoleBuilder Role = "builder"
	RoleAdmin   Role = "admin"
	RoleNode    Role = "node"
)

// rank orders the human/agent roles; node is outside the order (0).
func (r Role) rank() int {
	switch r {
	case RoleReader:
		return 1
	case RoleRunner:
		return 2
	case RoleBuilder:
		return 3
	case RoleAdmin:
		return 4
	}
	return 0
}

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return r.rank() > 0 || r == RoleNode }

// Action is an operation Authorize checks.
type Action string

const (
	// ActionRead: get and list sandboxes, projects, layers, environments,
	// nodes and usage.
	ActionRead Action = "read"
	// Sandbox work (runner and up).
	ActionSandboxCreate    Action = "sandbox.create" // also batch create and fork
	ActionSandboxExec      Action = "sandbox.exec"
	ActionSandboxFiles     Action = "sandbox.files" // read and write files
	ActionSandboxLifecycle Action = "sandbox.lifecycle"
	ActionSandboxDelete    Action = "sandbox.delete"
	ActionSandboxNetwork   Action = "sandbox.network" // change a sandbox's egress policy
	// Building environments (builder and up).
	ActionLayerWrite       Action = "layer.write" // push, import, delete layers
	ActionEnvironmentWrite Action = "environment.write"
	// Administration within the token's subtree (admin).
	ActionProjectWrite Action = "project.write" // create, update (quota), delete a sub-project
	ActionTokenRead    Action = "token.read"
	ActionTokenWrite   Action = "token.write" // mint, revoke
	// ActionNode: the node-agent endpoints (register, heartbeat, report);
	// only node tokens.
	ActionNode Action = "node"
)

var roleActions = map[Role][]Action{
	RoleReader:  {ActionRead},
	RoleRunner:  {ActionSandboxCreate, ActionSandboxExec, ActionSandboxFiles, ActionSandboxLifecycle, ActionSandboxDelete, ActionSandboxNetwork},
	RoleBuilder: {ActionLayerWrite, ActionEnvironmentWrite},
	RoleAdmin:   {ActionProjectWrite, ActionTokenRead, ActionTokenWrite},
}

// allowed[role] is the set of actions role may take (its own and those of
// every lower role).
var allowed = func() map[Role]map[Action]bool {
	m := map[Role]map[Action]bool{RoleNode: {ActionNode: true}}
	for _, r := range []Role{RoleReader, RoleRunner, RoleBuilder, RoleAdmin} {
		set := map[Action]bool{}
		for lower, acts := range roleActions {
			if lower.rank() <= r.rank() {
				for _, a := range acts {
					set[a] = true
				}
			}
		}
		m[r] = set
	}
	return m
}()

// Principal is an authenticated caller: the token it presented, reduced to
// what authorization needs.
type Principal struct {
	TokenID string `json:"token_id"`
	Name    string `json:"name,omitempty"`
	// Project is the token's scope: that project and everything under it.
	// "" is the root (everything).
	Project   string    `json:"project"`
	Role      Role      `json:"role"`
	ExpiresAt time.Time `json:"expires_at,omitzero"` // zero: never
	// Node is the node name a node token is bound to ("" for none).
	Node string `json:"node,omitempty"`
}

// SystemPrincipal is the platform itself acting as root admin (bootstrap,
// internal calls). Never hand it to a request.
func SystemPrincipal() Principal {
	return Principal{TokenID: "system", Name: "system", Role: RoleAdmin}
}

// Authorize checks that p may take action on project (a path, "" for the
// root). ErrForbidden (code "forbidden") when the role lacks the action or
// the project is outside p's scope. Pure and cheap: call it per request.
//
// Scope: a token for research/rl-math acts on research/rl-math and
// research/rl-math/** only. ActionProjectWrite is stricter: it needs a
// proper sub-project of the scope, so an admin can shape what was handed to
// it but never enlarge its own project's quota (only the root admin edits
// the root). Objects that belong to no project (layers, environments, nodes)
// are checked against the root, "" — or, where any holder of the role may
// act, against p.Project.
func Authorize(p Principal, action Action, project string) error {
	project, err := CleanPath(project)
	if err != nil {
		return err
	}
	if !allowed[p.Role][action] {
		return errdefs.New(errdefs.ErrForbidden, api.CodeForbidden,
			"a %s token may not %s", roleName(p.Role), action)
	}
	if !InScope(p.Project, project) {
		return errdefs.New(errdefs.ErrForbidden, api.CodeForbidden,
			"project %s is outside this token's scope %s", displayPath(project), displayPath(p.Project))
	}
	if action == ActionProjectWrite && project == p.Project && p.Project != "" {
		return errdefs.New(errdefs.ErrForbidden, api.CodeForbidden,
			"a token scoped to %s may manage its sub-projects but not %s itself", p.Project, p.Project)
	}
	return nil
}

func roleName(r Role) string {
	if r == "" {
		return "role-less"
	}
	return string(r)
}

// InScope reports whether project is scope or lies under it.
func InScope(scope, project string) bool {
	return scope == "" || project == scope || strings.HasPrefix(project, scope+"/")
}

// Parent returns the path of project's parent ("" for a top-level project
// and for the root itself).
func Parent(project string) string {
	if i := strings.LastIndexByte(project, '/'); i >= 0 {
		return project[:i]
	}
	return ""
}

func displayPath(p string) string {
	if p == "" {
		return "/ (root)"
	}
	return p
}

const (
	maxPathLen    = 255
	maxSegmentLen = 63
	maxDepth      = 16
)

// CleanPath validates a project path and returns its canonical form:
// segments of 1 to 63 characters from [a-z0-9._-], starting with a letter
// or digit, joined by "/", at most 16 deep and 255 long. Leading and
// trailing slashes are dropped, so "" and "/" both name the root.
// ErrInvalid (code "invalid_project") otherwise.
func CleanPath(p string) (string, error) {
	p = strings.Trim(p, "/")
	if p == "" {
		return "", nil
	}
	bad := func(why string) (string, error) {
		return "", errdefs.New(errdefs.ErrInvalid, CodeInvalidProject, "invalid project path %q: %s", p, why)
	}
	if len(p) > maxPathLen {
		return bad("longer than 255 characters")
	}
	segs := strings.Split(p, "/")
	if len(segs) > maxDepth {
		return bad("deeper than 16 levels")
	}
	for _, s := range segs {
		if s == "" || len(s) > maxSegmentLen {
			return bad("each segment must be 1 to 63 characters")
		}
		if c := s[0]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return bad("each segment must start with a lowercase letter or digit")
		}
		for i := 0; i < len(s); i++ {
			c := s[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return bad("only lowercase letters, digits and . _ - are allowed")
			}
		}
	}
	return p, nil
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p, for handlers downstream of the
// authentication middleware.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal WithPrincipal stored in ctx.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}
