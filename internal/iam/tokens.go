package iam

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

const (
	tokensPrefix = "/iam/tokens/"
	tokensFormat = 1
	// SecretPrefix starts every secret CreateToken mints, so that secret
	// scanners and people recognise one.
	SecretPrefix = "wrn_"
	idHexLen     = 24 // token id: the first 96 bits of the secret's sha256
	minSecretLen = 16
	maxSecretLen = 512
)

// Token is a token's metadata; the secret itself is never stored, only its
// sha256.
type Token struct {
	// ID is public: the first 24 hex digits of sha256(secret), so that a
	// presented secret finds its record with one read.
	ID          string    `json:"id"`
	Project     string    `json:"project"` // scope: this project's subtree
	ProjectUID  string    `json:"project_uid"`
	Role        Role      `json:"role"`
	Name        string    `json:"name,omitempty"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	CreatedBy   string    `json:"created_by,omitempty"` // token id
	ExpiresAt   time.Time `json:"expires_at,omitzero"`  // zero: never
	// Node binds a node token to one node name: the agent holding it
	// registers only as that name. Empty: any name (tokensFormat 1 has
	// no binding, and reads as unbound).
	Node string `json:"node,omitempty"`
}

// TokenSpec is what CreateToken mints.
type TokenSpec struct {
	Project string `json:"project"`
	Role    Role   `json:"role"`
	// TTL is the lifetime; 0 means the creator's own expiry (never, if
	// the creator never expires).
	TTL         time.Duration `json:"ttl,omitempty"`
	Name        string        `json:"name,omitempty"`
	Description string        `json:"description,omitempty"`
	// Node binds a node token to one node name (RoleNode only; see
	// ValidNodeName).
	Node string `json:"node,omitempty"`
}

// nodeNamePattern: api.NodeNameMax of [a-z0-9.-], starting and ending
// with a letter or digit.
var nodeNamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// ValidNodeName checks a node name (a token's binding, an agent's
// --node-name); ErrInvalid otherwise.
func ValidNodeName(name string) error {
	if !nodeNamePattern.MatchString(name) {
		return errdefs.Invalid("node name %q: want 1-%d of [a-z0-9.-], starting and ending with a letter or digit", name, api.NodeNameMax)
	}
	return nil
}

// BoundNodeName is the node name an agent registers as with p's node
// token, asking for name: the token's binding when it has one (name empty
// or equal), else name as asked. ErrForbidden (api.CodeNodeNameMismatch)
// for another name than the binding; ErrInvalid for a malformed name.
func BoundNodeName(p Principal, name string) (string, error) {
	if p.Node != "" {
		if name != "" && name != p.Node {
			return "", errdefs.New(errdefs.ErrForbidden, api.CodeNodeNameMismatch,
				"node token %s is bound to node %q; this agent asked to register as %q", p.TokenID, p.Node, name)
		}
		return p.Node, nil
	}
	if name != "" {
		if err := ValidNodeName(name); err != nil {
			return "", err
		}
	}
	return name, nil
}

type tokenRecord struct {
	V     int    `json:"v"`
	Token Token  `json:"token"`
	Hash  string `json:"hash"` // hex sha256 of the secret
}

func tokenKey(id string) string { return tokensPrefix + id }

func hashSecret(secret string) [32]byte { return sha256.Sum256([]byte(secret)) }

func idOf(h [32]byte) string { return hex.EncodeToString(h[:])[:idHexLen] }

// CreateToken mints a token on behalf of by and returns it with its
// secret, which is shown this once. by must be an admin whose scope holds
// spec.Project; the new role may not rank above by's, nor the token outlive
// by's own. Node tokens reach every node endpoint of the cluster, so only a
// root admin mints them, at the root. Errors: ErrInvalid, ErrForbidden,
// ErrNotFound (project).
func (i *IAM) CreateToken(ctx context.Context, by Principal, spec TokenSpec) (Token, string, error) {
	project, err := CleanPath(spec.Project)
	if err != nil {
		return Token{}, "", err
	}
	if !spec.Role.Valid() {
		return Token{}, "", errdefs.Invalid("unknown role %q: want admin, builder, runner, reader or node", spec.Role)
	}
	if spec.TTL < 0 {
		return Token{}, "", errdefs.Invalid("token ttl %v is negative", spec.TTL)
	}
	if len(spec.Name) > 255 || len(spec.Description) > 1024 {
		return Token{}, "", errdefs.Invalid("token name (255) or description (1024) too long")
	}
	if spec.Node != "" {
		if spec.Role != RoleNode {
			return Token{}, "", errdefs.Invalid("only a node token is bound to a node (role %s)", spec.Role)
		}
		if err := ValidNodeName(spec.Node); err != nil {
			return Token{}, "", err
		}
	}
	if err := Authorize(by, ActionTokenWrite, project); err != nil {
		return Token{}, "", err
	}
	if spec.Role == RoleNode {
		if by.Project != "" || project != "" {
			return Token{}, "", errdefs.New(errdefs.ErrForbidden, api.CodeForbidden,
				"node tokens are minted by a root admin, at the root project")
		}
	} else if spec.Role.rank() > by.Role.rank() {
		return Token{}, "", errdefs.New(errdefs.ErrForbidden, api.CodeForbidden,
			"a %s token may not mint a %s token", by.Role, spec.Role)
	}
	now := i.now().UTC()
	expires := by.ExpiresAt
	if spec.TTL > 0 {
		expires = now.Add(spec.TTL)
		if !by.ExpiresAt.IsZero() && expires.After(by.ExpiresAt) {
			return Token{}, "", errdefs.New(errdefs.ErrForbidden, api.CodeForbidden,
				"the token would outlive its creator's (expires %s)", by.ExpiresAt.Format(time.RFC3339))
		}
	}
	t, err := i.loadTree(ctx)
	if err != nil {
		return Token{}, "", err
	}
	n := t.nodes[project]
	if n == nil {
		return Token{}, "", projectNotFound(project)
	}
	for attempt := 0; ; attempt++ {
		secret := newSecret()
		h := hashSecret(secret)
		tok := Token{
			ID: idOf(h), Project: project, ProjectUID: n.rec.UID, Role: spec.Role,
			Name: spec.Name, Description: spec.Description,
			CreatedAt: now, CreatedBy: by.TokenID, ExpiresAt: expires, Node: spec.Node,
		}
		err := i.putToken(ctx, tok, h)
		if errors.Is(err, errdefs.ErrConflict) && attempt < 3 {
			continue // a 96-bit id collision: draw again
		}
		if err != nil {
			return Token{}, "", err
		}
		return tok, secret, nil
	}
}

func newSecret() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func (i *IAM) putToken(ctx context.Context, tok Token, h [32]byte) error {
	val, err := json.Marshal(tokenRecord{V: tokensFormat, Token: tok, Hash: hex.EncodeToString(h[:])})
	if err != nil {
		return fmt.Errorf("iam: encode token: %w", err)
	}
	return i.st.Create(ctx, tokenKey(tok.ID), val)
}

// EnsureAdmin registers secret as a root admin token that never expires,
// named "bootstrap", unless it is already registered: `warren up` and the
// first apiserver call it with the secret in <data-dir>/admin-token at every
// start, so that file keeps working (and revoking it lasts only until the
// next start: replace the file to retire it).
func (i *IAM) EnsureAdmin(ctx context.Context, secret string) (Token, error) {
	if err := checkSecret(secret); err != nil {
		return Token{}, err
	}
	h := hashSecret(secret)
	tok := Token{
		ID: idOf(h), Project: "", ProjectUID: RootUID, Role: RoleAdmin,
		Name: "bootstrap", Description: "bootstrap admin token (admin-token file)",
		CreatedAt: i.now().UTC(), CreatedBy: "system",
	}
	for attempt := 0; attempt < 3; attempt++ {
		rec, _, err := i.getToken(ctx, tok.ID)
		if err == nil {
			if !hashEqual(rec.Hash, h) || rec.Token.Role != RoleAdmin || rec.Token.Project != "" {
				return Token{}, errdefs.New(errdefs.ErrConflict, api.CodeConflict,
					"token id %s is taken by another token", tok.ID)
			}
			return rec.Token, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return Token{}, err
		}
		err = i.putToken(ctx, tok, h)
		if err == nil {
			i.auth.evict(h)
			return tok, nil
		}
		if !errors.Is(err, errdefs.ErrConflict) {
			return Token{}, err
		}
	}
	return Token{}, errdefs.New(errdefs.ErrConflict, api.CodeConflict, "bootstrap token changed concurrently")
}

func checkSecret(secret string) error {
	if len(secret) < minSecretLen || len(secret) > maxSecretLen {
		return errdefs.Invalid("a token secret must be %d to %d characters", minSecretLen, maxSecretLen)
	}
	return nil
}

func hashEqual(hexHash string, h [32]byte) bool {
	b, err := hex.DecodeString(hexHash)
	return err == nil && subtle.ConstantTimeCompare(b, h[:]) == 1
}

func (i *IAM) getToken(ctx context.Context, id string) (tokenRecord, int64, error) {
	kv, err := i.st.Get(ctx, tokenKey(id))
	if errors.Is(err, errdefs.ErrNotFound) {
		return tokenRecord{}, 0, errdefs.New(errdefs.ErrNotFound, CodeTokenNotFound, "token %s not found", id)
	}
	if err != nil {
		return tokenRecord{}, 0, fmt.Errorf("iam: get token %s: %w", id, err)
	}
	var rec tokenRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return tokenRecord{}, 0, fmt.Errorf("iam: decode token %s: %w", id, err)
	}
	if rec.V > tokensFormat {
		return tokenRecord{}, 0, fmt.Errorf("iam: token %s stored in format %d, newer than this binary's %d", id, rec.V, tokensFormat)
	}
	return rec, kv.Version, nil
}

// ListTokens returns the tokens scoped anywhere in project's subtree,
// oldest first, expired ones included. Needs ActionTokenRead on project.
func (i *IAM) ListTokens(ctx context.Context, by Principal, project string) ([]Token, error) {
	project, err := CleanPath(project)
	if err != nil {
		return nil, err
	}
	if err := Authorize(by, ActionTokenRead, project); err != nil {
		return nil, err
	}
	kvs, err := i.st.List(ctx, tokensPrefix)
	if err != nil {
		return nil, fmt.Errorf("iam: list tokens: %w", err)
	}
	t, err := i.loadTree(ctx)
	if err != nil {
		return nil, err
	}
	out := []Token{}
	for _, kv := range kvs {
		var rec tokenRecord
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		tok := rec.Token
		if n := t.nodes[tok.Project]; n == nil || n.rec.UID != tok.ProjectUID {
			continue // its project was deleted
		}
		if InScope(project, tok.Project) {
			out = append(out, tok)
		}
	}
	sort.Slice(out, func(a, b int) bool {
		if !out[a].CreatedAt.Equal(out[b].CreatedAt) {
			return out[a].CreatedAt.Before(out[b].CreatedAt)
		}
		return out[a].ID < out[b].ID
	})
	return out, nil
}

// RevokeToken deletes token id. It stops working at once on this
// apiserver and within AuthCacheTTL on the others. Needs ActionTokenWrite
// on the token's project; a token outside by's scope is ErrNotFound, as is
// an unknown id.
func (i *IAM) RevokeToken(ctx context.Context, by Principal, id string) error {
	rec, _, err := i.getToken(ctx, id)
	if err != nil {
		return err
	}
	if !InScope(by.Project, rec.Token.Project) {
		return errdefs.New(errdefs.ErrNotFound, CodeTokenNotFound, "token %s not found", id)
	}
	if err := Authorize(by, ActionTokenWrite, rec.Token.Project); err != nil {
		return err
	}
	if err := i.st.Delete(ctx, tokenKey(id)); err != nil {
		return fmt.Errorf("iam: revoke token %s: %w", id, err)
	}
	if h, err := hex.DecodeString(rec.Hash); err == nil && len(h) == 32 {
		i.auth.evict([32]byte(h))
	}
	return nil
}

// deleteProjectTokens removes, best effort, the tokens of a deleted
// project (they already fail Authenticate by their stale project UID).
func (i *IAM) deleteProjectTokens(ctx context.Context, path, uid string) {
	kvs, err := i.st.List(ctx, tokensPrefix)
	if err != nil {
		return
	}
	for _, kv := range kvs {
		var rec tokenRecord
		if json.Unmarshal(kv.Value, &rec) == nil && rec.Token.Project == path && rec.Token.ProjectUID == uid {
			i.st.Delete(ctx, kv.Key)
			if h, err := hex.DecodeString(rec.Hash); err == nil && len(h) == 32 {
				i.auth.evict([32]byte(h))
			}
		}
	}
}

// Authenticate resolves a bearer secret to its principal.
// ErrUnauthenticated (code "unauthenticated") for an unknown, expired or
// revoked secret or one whose project was deleted; ErrUnavailable when the
// store cannot be reached. Cost: a sha256 and a map lookup when cached; one
// store read otherwise (concurrent misses for one secret share it). Results
// are cached for AuthCacheTTL, which bounds how long a revocation made
// through another apiserver takes to apply here; expiry is checked on every
// call.
func (i *IAM) Authenticate(ctx context.Context, secret string) (Principal, error) {
	if len(secret) < minSecretLen || len(secret) > maxSecretLen {
		return Principal{}, unauthenticated("invalid token")
	}
	h := hashSecret(secret)
	now := i.now()
	e, ok := i.auth.get(h, now)
	if !ok {
		var err error
		e, err = i.auth.fill(h, now, now.Add(i.opts.AuthCacheTTL), func() (authEntry, error) {
			// Shared by concurrent callers: not bound to this one's cancellation.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			return i.lookup(ctx, h)
		})
		if err != nil {
			return Principal{}, err
		}
	}
	if !e.valid {
		return Principal{}, unauthenticated("invalid token")
	}
	if !e.p.ExpiresAt.IsZero() && !now.Before(e.p.ExpiresAt) {
		return Principal{}, unauthenticated("token %s expired at %s", e.p.TokenID, e.p.ExpiresAt.Format(time.RFC3339))
	}
	t, err := i.treeWith(ctx, e.p.Project)
	if err != nil {
		return Principal{}, err
	}
	if n := t.nodes[e.p.Project]; n == nil || n.rec.UID != e.uid {
		return Principal{}, unauthenticated("token %s belongs to a deleted project", e.p.TokenID)
	}
	return e.p, nil
}

// Check reports whether token authenticates (Authenticate without the
// principal).
func (i *IAM) Check(ctx context.Context, token string) error {
	_, err := i.Authenticate(ctx, token)
	return err
}

func (i *IAM) lookup(ctx context.Context, h [32]byte) (authEntry, error) {
	rec, _, err := i.getToken(ctx, idOf(h))
	if errors.Is(err, errdefs.ErrNotFound) {
		return authEntry{}, nil
	}
	if err != nil {
		return authEntry{}, err
	}
	if !hashEqual(rec.Hash, h) {
		return authEntry{}, nil
	}
	tok := rec.Token
	return authEntry{
		valid: true, uid: tok.ProjectUID,
		p: Principal{TokenID: tok.ID, Name: tok.Name, Project: tok.Project, Role: tok.Role, ExpiresAt: tok.ExpiresAt, Node: tok.Node},
	}, nil
}

func unauthenticated(format string, args ...any) error {
	return errdefs.New(errdefs.ErrUnauthenticated, api.CodeUnauthenticated, format, args...)
}

// authCache caches lookups by secret hash, positive and negative, and
// collapses concurrent misses for one secret into one store read.
type authCache struct {
	mu      sync.Mutex
	max     int
	gen     uint64 // bumped by evict, so a lookup racing a revoke is not cached
	m       map[[32]byte]authEntry
	flights map[[32]byte]*flight
}

type authEntry struct {
	valid bool
	p     Principal
	uid   string // the project UID the token was minted for
	until time.Time
}

type flight struct {
	done chan struct{}
	e    authEntry
	err  error
}

func (c *authCache) init(max int) {
	c.max = max
	c.m = map[[32]byte]authEntry{}
	c.flights = map[[32]byte]*flight{}
}

func (c *authCache) get(h [32]byte, now time.Time) (authEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[h]
	if !ok || !now.Before(e.until) {
		return authEntry{}, false
	}
	return e, true
}

func (c *authCache) evict(h [32]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.m, h)
}

// fill runs load once for concurrent callers with the same h and caches
// its answer until until, unless an eviction happened meanwhile.
func (c *authCache) fill(h [32]byte, now, until time.Time, load func() (authEntry, error)) (authEntry, error) {
	c.mu.Lock()
	if e, ok := c.m[h]; ok && now.Before(e.until) { // a flight just landed
		c.mu.Unlock()
		return e, nil
	}
	if f, ok := c.flights[h]; ok {
		c.mu.Unlock()
		<-f.done
		return f.e, f.err
	}
	f := &flight{done: make(chan struct{})}
	c.flights[h] = f
	gen := c.gen
	c.mu.Unlock()

	f.e, f.err = load()

	c.mu.Lock()
	delete(c.flights, h)
	if f.err == nil && c.gen == gen {
		if len(c.m) >= c.max {
			// Drop about a tenth, in map order (random): cheap, and a
			// flood of made-up secrets cannot pin the cache.
			n := c.max/10 + 1
			for k := range c.m {
				delete(c.m, k)
				if n--; n == 0 {
					break
				}
			}
		}
		f.e.until = until
		c.m[h] = f.e
	}
	c.mu.Unlock()
	close(f.done)
	return f.e, f.err
}
