package iam_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/store"
)

// IAM satisfies the apiserver's Tokens interface.
var _ interface {
	Check(ctx context.Context, token string) error
} = (*iam.IAM)(nil)

func mustToken(t *testing.T, m *iam.IAM, by iam.Principal, spec iam.TokenSpec) (iam.Token, string, iam.Principal) {
	t.Helper()
	tok, secret, err := m.CreateToken(context.Background(), by, spec)
	if err != nil {
		t.Fatalf("CreateToken(%+v) by %s@%q: %v", spec, by.Role, by.Project, err)
	}
	p, err := m.Authenticate(context.Background(), secret)
	if err != nil {
		t.Fatalf("Authenticate new token: %v", err)
	}
	return tok, secret, p
}

func TestTokenLifecycle(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	m, _ := newIAM(t, c, iam.Options{})
	mustCreate(t, m, "research", quota(10))
	mustCreate(t, m, "research/rl-math", quota(5))

	tok, secret, p := mustToken(t, m, root, iam.TokenSpec{
		Project: "research/rl-math", Role: iam.RoleRunner, TTL: time.Hour, Name: "trainer",
	})
	if !strings.HasPrefix(secret, iam.SecretPrefix) || len(secret) < 40 {
		t.Fatalf("secret %q: want %s and 256 random bits", secret, iam.SecretPrefix)
	}
	if strings.Contains(secret, tok.ID) {
		t.Fatalf("secret %q contains the public id %q", secret, tok.ID)
	}
	want := iam.Principal{TokenID: tok.ID, Name: "trainer", Project: "research/rl-math", Role: iam.RoleRunner, ExpiresAt: c.Now().Add(time.Hour)}
	if p != want {
		t.Fatalf("principal: got %+v, want %+v", p, want)
	}
	if err := m.Check(ctx, secret); err != nil {
		t.Fatalf("Check: %v", err)
	}

	for _, bad := range []string{"", "short", secret + "x", strings.Repeat("x", 64)} {
		_, err := m.Authenticate(ctx, bad)
		wantErr(t, "Authenticate("+bad+")", err, errdefs.ErrUnauthenticated, "unauthenticated")
		wantErr(t, "Check("+bad+")", m.Check(ctx, bad), errdefs.ErrUnauthenticated, "")
	}

	list, err := m.ListTokens(ctx, root, "research")
	wantErr(t, "ListTokens", err, nil, "")
	if len(list) != 1 || list[0].ID != tok.ID || list[0].Role != iam.RoleRunner {
		t.Fatalf("ListTokens: got %+v", list)
	}

	// Expiry is exact, cache or not.
	c.Advance(time.Hour - time.Second)
	if _, err := m.Authenticate(ctx, secret); err != nil {
		t.Fatalf("Authenticate before expiry: %v", err)
	}
	c.Advance(time.Second)
	_, err = m.Authenticate(ctx, secret)
	wantErr(t, "Authenticate at expiry", err, errdefs.ErrUnauthenticated, "")

	// Revocation through this IAM applies at once.
	_, secret2, _ := mustToken(t, m, root, iam.TokenSpec{Project: "research", Role: iam.RoleReader})
	tok2, _ := m.Authenticate(ctx, secret2)
	wantErr(t, "RevokeToken", m.RevokeToken(ctx, root, tok2.TokenID), nil, "")
	_, err = m.Authenticate(ctx, secret2)
	wantErr(t, "Authenticate revoked", err, errdefs.ErrUnauthenticated, "")
	wantErr(t, "RevokeToken again", m.RevokeToken(ctx, root, tok2.TokenID), errdefs.ErrNotFound, iam.CodeTokenNotFound)
}

// TestRevokeElsewhereWithinCacheBound: a token revoked through another
// apiserver stops working here within AuthCacheTTL.
func TestRevokeElsewhereWithinCacheBound(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	st := store.Memory()
	defer st.Close()
	opts := iam.Options{Now: c.Now, AuthCacheTTL: 5 * time.Second}
	a, b := iam.New(st, opts), iam.New(st, opts)
	tok, secret, err := a.CreateToken(ctx, root, iam.TokenSpec{Role: iam.RoleRunner})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Authenticate(ctx, secret); err != nil { // b caches it
		t.Fatal(err)
	}
	if err := a.RevokeToken(ctx, root, tok.ID); err != nil {
		t.Fatal(err)
	}
	c.Advance(4 * time.Second)
	if _, err := b.Authenticate(ctx, secret); err != nil {
		t.Fatalf("within the cache bound b may still accept the token; got %v", err)
	}
	c.Advance(time.Second)
	_, err = b.Authenticate(ctx, secret)
	wantErr(t, "after AuthCacheTTL", err, errdefs.ErrUnauthenticated, "")
}

func TestAuthenticateCachesAndCollapses(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Store: store.Memory()}
	defer st.Close()
	m := iam.New(st, iam.Options{})
	_, secret, err := m.CreateToken(ctx, root, iam.TokenSpec{Role: iam.RoleReader})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.Authenticate(ctx, secret); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for range 100 {
		m.Authenticate(ctx, secret)
		m.Authenticate(ctx, "wrn_not-a-token-at-all")
	}
	if n := st.tokenGets.Load(); n != 2 {
		t.Fatalf("got %d token reads for 50 concurrent + 200 repeated checks of 2 secrets, want 2", n)
	}
}

func TestDeletedProjectKillsTokens(t *testing.T) {
	ctx := context.Background()
	m, _ := newIAM(t, nil, iam.Options{})
	mustCreate(t, m, "a", quota(1))
	_, secret, _ := mustToken(t, m, root, iam.TokenSpec{Project: "a", Role: iam.RoleRunner})
	if err := m.DeleteProject(ctx, root, "a"); err != nil {
		t.Fatal(err)
	}
	_, err := m.Authenticate(ctx, secret)
	wantErr(t, "token of a deleted project", err, errdefs.ErrUnauthenticated, "")
	mustCreate(t, m, "a", quota(1)) // same path, new project
	_, err = m.Authenticate(ctx, secret)
	wantErr(t, "token of a re-created project", err, errdefs.ErrUnauthenticated, "")
	if list, _ := m.ListTokens(ctx, root, ""); len(list) != 0 {
		t.Fatalf("tokens of the deleted project still listed: %+v", list)
	}
}

// TestMintRules: tokens never go above their creator's role, scope or
// lifetime.
func TestMintRules(t *testing.T) {
	c := newClock()
	m, _ := newIAM(t, c, iam.Options{})
	mustCreate(t, m, "research", quota(10))
	mustCreate(t, m, "research/rl-math", quota(5))
	mustCreate(t, m, "other", quota(1))
	_, _, admin := mustToken(t, m, root, iam.TokenSpec{Project: "research", Role: iam.RoleAdmin})
	_, _, builder := mustToken(t, m, root, iam.TokenSpec{Project: "research", Role: iam.RoleBuilder})
	_, _, shortAdmin := mustToken(t, m, root, iam.TokenSpec{Project: "research", Role: iam.RoleAdmin, TTL: time.Hour})

	tests := []struct {
		name string
		by   iam.Principal
		spec iam.TokenSpec
		kind error
	}{
		{"admin mints runner below", admin, iam.TokenSpec{Project: "research/rl-math", Role: iam.RoleRunner}, nil},
		{"admin mints admin below", admin, iam.TokenSpec{Project: "research/rl-math", Role: iam.RoleAdmin}, nil},
		{"admin mints at its own scope", admin, iam.TokenSpec{Project: "research", Role: iam.RoleReader}, nil},
		{"admin outside its scope", admin, iam.TokenSpec{Project: "other", Role: iam.RoleReader}, errdefs.ErrForbidden},
		{"admin at the root", admin, iam.TokenSpec{Project: "", Role: iam.RoleReader}, errdefs.ErrForbidden},
		{"builder mints nothing", builder, iam.TokenSpec{Project: "research", Role: iam.RoleReader}, errdefs.ErrForbidden},
		{"scoped admin mints no node token", admin, iam.TokenSpec{Project: "research", Role: iam.RoleNode}, errdefs.ErrForbidden},
		{"root admin mints a node token", root, iam.TokenSpec{Role: iam.RoleNode}, nil},
		{"node tokens live at the root", root, iam.TokenSpec{Project: "research", Role: iam.RoleNode}, errdefs.ErrForbidden},
		{"unknown role", root, iam.TokenSpec{Role: "owner"}, errdefs.ErrInvalid},
		{"missing project", root, iam.TokenSpec{Project: "nope", Role: iam.RoleReader}, errdefs.ErrNotFound},
		{"within creator's lifetime", shortAdmin, iam.TokenSpec{Project: "research", Role: iam.RoleRunner, TTL: 30 * time.Minute}, nil},
		{"beyond creator's lifetime", shortAdmin, iam.TokenSpec{Project: "research", Role: iam.RoleRunner, TTL: 2 * time.Hour}, errdefs.ErrForbidden},
	}
	for _, tc := range tests {
		_, _, err := m.CreateToken(context.Background(), tc.by, tc.spec)
		wantErr(t, tc.name, err, tc.kind, "")
	}
	// TTL 0 inherits the creator's expiry.
	tok, _, err := m.CreateToken(context.Background(), shortAdmin, iam.TokenSpec{Project: "research", Role: iam.RoleReader})
	if err != nil || !tok.ExpiresAt.Equal(shortAdmin.ExpiresAt) {
		t.Fatalf("inherited expiry: got %v, %v; want %v", tok.ExpiresAt, err, shortAdmin.ExpiresAt)
	}
	// Revoking and listing stay within scope.
	outside, _, _ := mustToken(t, m, root, iam.TokenSpec{Project: "other", Role: iam.RoleReader})
	wantErr(t, "revoke outside scope", m.RevokeToken(context.Background(), admin, outside.ID), errdefs.ErrNotFound, "")
	list, err := m.ListTokens(context.Background(), admin, "research")
	wantErr(t, "ListTokens", err, nil, "")
	for _, tk := range list {
		if !iam.InScope("research", tk.Project) {
			t.Fatalf("ListTokens(research) returned %+v", tk)
		}
	}
	_, err = m.ListTokens(context.Background(), builder, "research")
	wantErr(t, "builder lists tokens", err, errdefs.ErrForbidden, "")
}

// TestAgentRunsItsSubtree: an agent with an admin token for its project
// hands a sub-project part of its quota, mints a runner token for it, and
// that token works there and nowhere else.
func TestAgentRunsItsSubtree(t *testing.T) {
	ctx := context.Background()
	m, _ := newIAM(t, nil, iam.Options{})
	mustCreate(t, m, "research", quota(100))
	mustCreate(t, m, "research/rl-math", quota(10))
	_, _, agent := mustToken(t, m, root, iam.TokenSpec{Project: "research/rl-math", Role: iam.RoleAdmin, Name: "agent"})

	_, err := m.UpdateProject(ctx, agent, "research/rl-math", iam.ProjectSpec{Quota: quota(50)})
	wantErr(t, "agent grows its own quota", err, errdefs.ErrForbidden, "")
	_, err = m.CreateProject(ctx, agent, "research/sibling", iam.ProjectSpec{})
	wantErr(t, "agent creates outside its scope", err, errdefs.ErrForbidden, "")
	_, err = m.CreateProject(ctx, agent, "research/rl-math/exp1", iam.ProjectSpec{Quota: quota(11)})
	wantErr(t, "agent hands out more than it has", err, errdefs.ErrConflict, iam.CodeQuotaExceedsParent)
	exp, err := m.CreateProject(ctx, agent, "research/rl-math/exp1", iam.ProjectSpec{Quota: quota(4)})
	wantErr(t, "agent creates a sub-project", err, nil, "")
	if exp.CreatedBy != agent.TokenID {
		t.Fatalf("CreatedBy: got %q, want %q", exp.CreatedBy, agent.TokenID)
	}
	_, _, runner := mustToken(t, m, agent, iam.TokenSpec{Project: "research/rl-math/exp1", Role: iam.RoleRunner})

	wantErr(t, "runner creates in exp1", iam.Authorize(runner, iam.ActionSandboxCreate, "research/rl-math/exp1"), nil, "")
	wantErr(t, "runner creates in rl-math", iam.Authorize(runner, iam.ActionSandboxCreate, "research/rl-math"), errdefs.ErrForbidden, "")
	wantErr(t, "runner pushes layers", iam.Authorize(runner, iam.ActionLayerWrite, "research/rl-math/exp1"), errdefs.ErrForbidden, "")
	_, _, err = m.CreateToken(ctx, runner, iam.TokenSpec{Project: "research/rl-math/exp1", Role: iam.RoleRunner})
	wantErr(t, "runner mints", err, errdefs.ErrForbidden, "")

	// The agent's own direct use is what it did not hand down.
	for i := range 6 {
		if _, err := m.Reserve(ctx, "research/rl-math", sandboxes(1)); err != nil {
			t.Fatalf("agent reservation %d: %v", i, err)
		}
	}
	_, err = m.Reserve(ctx, "research/rl-math", sandboxes(1))
	wantErr(t, "agent past its remainder", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
	for i := range 4 {
		if _, err := m.Reserve(ctx, "research/rl-math/exp1", sandboxes(1)); err != nil {
			t.Fatalf("sub-project reservation %d: %v", i, err)
		}
	}
	_, err = m.Reserve(ctx, "research/rl-math/exp1", sandboxes(1))
	wantErr(t, "sub-project past its quota", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
}

func TestEnsureAdmin(t *testing.T) {
	ctx := context.Background()
	m, st := newIAM(t, nil, iam.Options{})
	const secret = "0123456789abcdef0123456789abcdef"
	tok, err := m.EnsureAdmin(ctx, secret)
	wantErr(t, "EnsureAdmin", err, nil, "")
	again, err := iam.New(st, iam.Options{}).EnsureAdmin(ctx, secret) // a restart
	wantErr(t, "EnsureAdmin again", err, nil, "")
	if again.ID != tok.ID || !again.CreatedAt.Equal(tok.CreatedAt) {
		t.Fatalf("EnsureAdmin is not idempotent: %+v then %+v", tok, again)
	}
	p, err := m.Authenticate(ctx, secret)
	wantErr(t, "Authenticate bootstrap", err, nil, "")
	if p.Role != iam.RoleAdmin || p.Project != "" || !p.ExpiresAt.IsZero() {
		t.Fatalf("bootstrap principal: got %+v", p)
	}
	wantErr(t, "bootstrap admin creates projects", iam.Authorize(p, iam.ActionProjectWrite, "research"), nil, "")
	_, err = m.EnsureAdmin(ctx, "short")
	wantErr(t, "EnsureAdmin(short)", err, errdefs.ErrInvalid, "")
	if list, _ := m.ListTokens(ctx, p, ""); len(list) != 1 {
		t.Fatalf("ListTokens: got %d tokens, want the bootstrap one", len(list))
	}
}
