package api

import "time"

// Roles a token can hold. Each of reader < runner < builder < admin has
// every right of the ones before it; node stands apart and only reaches the
// node-agent endpoints.
const (
	RoleReader  = "reader"  // read sandboxes, projects, layers, environments, nodes
	RoleRunner  = "runner"  // + create, exec in, copy files to and from, delete sandboxes
	RoleBuilder = "builder" // + build layers, compose and import environments
	RoleAdmin   = "admin"   // + create and change sub-projects, mint and revoke tokens
	RoleNode    = "node"    // a node agent joining the cluster
)

// Quota is what a project's whole subtree may use. Zero fields set no
// limit of the project's own (its ancestors' limits still apply). A
// sub-project's quota is carved out of its parent's: the quotas of a
// project's sub-projects add up to at most its own.
type Quota struct {
	Sandboxes int64    `json:"sandboxes,omitempty"`
	CPU       float64  `json:"cpu,omitempty"` // vCPU, as sandboxes request them
	Memory    Quantity `json:"memory,omitempty"`
	Disk      Quantity `json:"disk,omitempty"`
	// CreatesPerSec limits sandbox creations per second (fractions allowed).
	CreatesPerSec float64 `json:"creates_per_sec,omitempty"`
	// CreatesBurst is the rate limit's bucket size; 0 means one second's
	// worth.
	CreatesBurst int64 `json:"creates_burst,omitempty"`
	// FnCallsPerSec limits FnCalls per second (each call of a batch
	// counts); FnCallsBurst is its bucket size.
	FnCallsPerSec float64 `json:"fn_calls_per_sec,omitempty"`
	FnCallsBurst  int64   `json:"fn_calls_burst,omitempty"`
}

// QuotaPatch changes some fields of a Quota: the fields present are set (0
// removes that limit), the others are kept.
type QuotaPatch struct {
	Sandboxes     *int64    `json:"sandboxes,omitempty"`
	CPU           *float64  `json:"cpu,omitempty"`
	Memory        *Quantity `json:"memory,omitempty"`
	Disk          *Quantity `json:"disk,omitempty"`
	CreatesPerSec *float64  `json:"creates_per_sec,omitempty"`
	CreatesBurst  *int64    `json:"creates_burst,omitempty"`
	FnCallsPerSec *float64  `json:"fn_calls_per_sec,omitempty"`
	FnCallsBurst  *int64    `json:"fn_calls_burst,omitempty"`
}

// Apply returns q with p's fields set.
func (p QuotaPatch) Apply(q Quota) Quota {
	if p.Sandboxes != nil {
		q.Sandboxes = *p.Sandboxes
	}
	if p.CPU != nil {
		q.CPU = *p.CPU
	}
	if p.Memory != nil {
		q.Memory = *p.Memory
	}
	if p.Disk != nil {
		q.Disk = *p.Disk
	}
	if p.CreatesPerSec != nil {
		q.CreatesPerSec = *p.CreatesPerSec
	}
	if p.CreatesBurst != nil {
		q.CreatesBurst = *p.CreatesBurst
	}
	if p.FnCallsPerSec != nil {
		q.FnCallsPerSec = *p.FnCallsPerSec
	}
	if p.FnCallsBurst != nil {
		q.FnCallsBurst = *p.FnCallsBurst
	}
	return q
}

// Usage counts what sandboxes use or are being created with.
type Usage struct {
	Sandboxes int64    `json:"sandboxes"`
	CPU       float64  `json:"cpu"` // vCPU
	Memory    Quantity `json:"memory"`
	Disk      Quantity `json:"disk"`
}

// Project is one node of the project tree. Paths are "/"-separated
// segments of [a-z0-9._-] ("research/rl-math"); "" is the root.
type Project struct {
	Path        string `json:"path"`
	Description string `json:"description,omitempty"`
	Quota       Quota  `json:"quota"`
	// MemoryMerge: nodes merge equal memory pages (KSM) among this
	// project's sandboxes (and its sub-projects'), never with any other
	// project's. See CreateProjectRequest.
	MemoryMerge bool `json:"memory_merge,omitempty"`
	// Usage is what the live sandboxes of the whole subtree use, as the
	// fleet view last saw it; Reserved is what creates in flight through
	// the answering apiserver hold on top.
	Usage    Usage `json:"usage"`
	Reserved Usage `json:"reserved"`
	// Children are the paths of the direct sub-projects.
	Children  []string  `json:"children,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"` // token id
	UpdatedAt time.Time `json:"updated_at"`
}

// ProjectList is the body of GET /v1/projects: a subtree, sorted by path
// (so every parent comes before its children).
type ProjectList struct {
	Projects []Project `json:"projects"`
}

// CreateProjectRequest is the body of POST /v1/projects. The parent must
// exist, and the caller must be an admin of a proper ancestor.
type CreateProjectRequest struct {
	Path        string `json:"path"`
	Quota       Quota  `json:"quota"`
	Description string `json:"description,omitempty"`
	// MemoryMerge lets nodes merge equal memory pages (KSM) among the
	// project's container sandboxes and microVMs, and its sub-projects'
	// (a sub-project that sets it too forms a group of its own): many
	// sandboxes of one environment hold the same pages. A node runs
	// merging sandboxes of one group at a time; no sandbox can opt
	// itself in. Merged pages leak by write timing to whatever shares
	// them, so set it for one tenant's projects only (on the root it
	// merges every project's).
	MemoryMerge bool `json:"memory_merge,omitempty"`
}

// UpdateProjectRequest is the body of PATCH /v1/projects/{path}: what is
// present changes, the rest is kept.
type UpdateProjectRequest struct {
	Quota       *QuotaPatch `json:"quota,omitempty"`
	Description *string     `json:"description,omitempty"`
	MemoryMerge *bool       `json:"memory_merge,omitempty"`
}

// Token is a token's metadata. Its secret is shown once, when it is
// created, and never stored.
type Token struct {
	ID          string    `json:"id"`
	Project     string    `json:"project"` // scope: this project and its subtree
	Role        string    `json:"role"`
	Name        string    `json:"name,omitempty"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	CreatedBy   string    `json:"created_by,omitempty"` // token id
	ExpiresAt   time.Time `json:"expires_at,omitzero"`  // zero: never
	// Node, on a node token, is the one node name it registers (empty:
	// any name, never one a live agent holds).
	Node string `json:"node,omitempty"`
}

// TokenList is the body of GET /v1/tokens.
type TokenList struct {
	Tokens []Token `json:"tokens"`
}

// CreateTokenRequest is the body of POST /v1/tokens. The caller must be an
// admin whose scope holds Project; the role may not rank above the
// caller's, nor the token outlive it. Node tokens are minted by a root
// admin at the root.
type CreateTokenRequest struct {
	// Project is the token's scope; empty means the caller's own, "/" the
	// root.
	Project string `json:"project,omitempty"`
	Role    string `json:"role"`
	// TTL is the lifetime; 0 means the creator's own expiry (never, if the
	// creator never expires).
	TTL         Duration `json:"ttl,omitempty"`
	Name        string   `json:"name,omitempty"`
	Description string   `json:"description,omitempty"`
	// Node binds a node token to one node name: an agent holding it
	// registers as that name only (role node only; NodeNamePattern).
	Node string `json:"node,omitempty"`
}

// NodeNameMax is the longest node name; a name is 1 to NodeNameMax of
// [a-z0-9.-], starting and ending with a letter or digit (a DNS label's
// rules, with dots).
const NodeNameMax = 63

// CreatedToken is the answer to POST /v1/tokens: the token and its secret,
// which the server shows this once.
type CreatedToken struct {
	Token  Token  `json:"token"`
	Secret string `json:"secret"`
}

// Error codes of projects, tokens, quotas and idempotency keys.
const (
	CodeInvalidProject      = "invalid_project"        // 400: malformed project path
	CodeRequestExceedsQuota = "request_exceeds_quota"  // 400: one sandbox larger than the quota can ever grant
	CodeProjectNotFound     = "project_not_found"      // 404
	CodeTokenNotFound       = "token_not_found"        // 404
	CodeProjectExists       = "project_exists"         // 409
	CodeProjectHasChildren  = "project_has_children"   // 409: delete its sub-projects first
	CodeProjectInUse        = "project_in_use"         // 409: it still has sandboxes
	CodeTooManyProjects     = "too_many_projects"      // 409
	CodeQuotaExceedsParent  = "quota_exceeds_parent"   // 409: sub-project quotas would add up to more than the parent's
	CodeQuotaBelowChildren  = "quota_below_children"   // 409: below what the project delegated
	CodeIdempotencyReused   = "idempotency_key_reused" // 409: the key was used for a different request
	CodeIdempotencyLost     = "idempotency_claim_lost" // 409: the create took so long another request took its key over
	CodeQuotaExceeded       = "quota_exceeded"         // 429 with Retry-After
	CodeRateLimited         = "rate_limited"           // 429 with Retry-After
)

// Error codes of node registration (node tokens and agents).
const (
	CodeNodeNameMismatch = "node_name_mismatch" // 403: the node token is bound to another node name
	CodeNodeNotOwner     = "node_not_owner"     // 403: the registration, its lease or the node id belongs to another agent
	CodeNodeRegistered   = "node_registered"    // 409: another agent holds this node id's live registration
	CodeNodeNameTaken    = "node_name_taken"    // 409: another live agent registered this node name
)
