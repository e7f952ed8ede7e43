package apiserver_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/store"
)

const adminSecret = "admin-secret-0123456789abcdef"

// iamHarness serves the API with IAM over an in-memory store, over a
// fake-backend node whose usage is resynced every 10ms.
type iamHarness struct {
	t     testing.TB
	url   string
	iam   *iam.IAM
	agent *node.Agent
	fake  *fake.Backend // the agent's
}

func newIAMHarness(t testing.TB, mod func(*node.Config)) *iamHarness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := store.Memory()
	usage := apiserver.NewUsage()
	m := iam.New(st, iam.Options{Usage: usage, CommitHold: -1, QuotaRetryAfter: 2 * time.Second})
	if _, err := m.EnsureAdmin(ctx, adminSecret); err != nil {
		t.Fatal(err)
	}
	agent, fb := nodetest.NewFake(t, mod)
	go usage.Follow(ctx, agent, 10*time.Millisecond)
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: agent, Images: imagetest.Busybox, Usage: usage,
		Tokens: m, IAM: m, Idempotency: iam.NewIdempotency(st, iam.IdempotencyOptions{}),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	t.Cleanup(srv.Close)
	return &iamHarness{t: t, url: srv.URL, iam: m, agent: agent, fake: fb}
}

// project creates path with quota q as the system.
func (h *iamHarness) project(path string, q iam.Quota) {
	h.t.Helper()
	if _, err := h.iam.CreateProject(context.Background(), iam.SystemPrincipal(), path, iam.ProjectSpec{Quota: q}); err != nil {
		h.t.Fatal(err)
	}
}

// token mints a token of role on project and returns its secret.
func (h *iamHarness) token(project string, role iam.Role) string {
	h.t.Helper()
	_, secret, err := h.iam.CreateToken(context.Background(), iam.SystemPrincipal(), iam.TokenSpec{Project: project, Role: role})
	if err != nil {
		h.t.Fatal(err)
	}
	return secret
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) code(t testing.TB) string {
	t.Helper()
	var e api.ErrorBody
	if err := json.Unmarshal(a.body, &e); err != nil {
		t.Fatalf("error body %q: %v", a.body, err)
	}
	return e.Error.Code
}

func (a answer) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("body %q: %v", a.body, err)
	}
}

// do sends a request with secret (and header pairs) and returns the answer.
func (h *iamHarness) do(secret, method, path, body string, hdr ...string) answer {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.url+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}

// create makes a sandbox with secret and fails the test unless it is 201.
func (h *iamHarness) create(secret, body string) api.Sandbox {
	h.t.Helper()
	a := h.do(secret, "POST", "/v1/sandboxes", body)
	if a.status != http.StatusCreated {
		h.t.Fatalf("create %s: %d %s", body, a.status, a.body)
	}
	var sb api.Sandbox
	a.decode(h.t, &sb)
	return sb
}

func TestRolesByRoute(t *testing.T) {
	h := newIAMHarness(t, func(c *node.Config) { c.Limits.CPU, c.Limits.Memory = 1000, 1<<40 })
	h.project("research", iam.Quota{})
	h.project("research/a", iam.Quota{})
	secrets := map[string]string{
		"reader":  h.token("research/a", iam.RoleReader),
		"runner":  h.token("research/a", iam.RoleRunner),
		"builder": h.token("research/a", iam.RoleBuilder),
		"admin":   h.token("research/a", iam.RoleAdmin),
		"node":    h.token("", iam.RoleNode),
	}
	const sbx = `{"image":"busybox","project":"research/a"}`
	all := []string{"reader", "runner", "builder", "admin"}
	for _, tc := range []struct {
		method, path, body string
		allowed            []string // the other roles get 403
	}{
		{"POST", "/v1/sandboxes", `{"image":"busybox"}`, all[1:]},
		{"GET", "/v1/sandboxes", "", all},
		{"GET", "/v1/sandboxes/{sb}", "", all},
		{"POST", "/v1/sandboxes/{sb}/exec", `{"cmd":"true"}`, all[1:]},
		{"GET", "/v1/sandboxes/{sb}/stat?path=/", "", all[1:]},
		{"GET", "/v1/sandboxes/{sb}/files?path=/etc/hostname", "", all[1:]},
		{"PUT", "/v1/sandboxes/{sb}/files?path=/tmp/x", "data", all[1:]},
		{"DELETE", "/v1/sandboxes/{sb}", "", all[1:]},
		{"GET", "/v1/images", "", all},
		{"GET", "/v1/nodes", "", all},
		{"GET", "/v1/layers", "", all},
		{"POST", "/v1/layers?name=x&version=1&kind=base", "", all[2:]},
		{"POST", "/v1/environments", `{"name":"e","base":"x"}`, all[2:]},
		{"POST", "/v1/images:import?name=x&format=oci-layout", "", all[2:]},
		{"DELETE", "/v1/layers/x@1", "", nil}, // shared objects: root-scoped builders only
		{"DELETE", "/v1/environments/e@1", "", nil},
		{"POST", "/v1/gc", "", nil},
		{"GET", "/v1/projects", "", all},
		{"POST", "/v1/projects", `{"path":"research/a/sub"}`, all[3:]},
		{"GET", "/v1/tokens", "", all[3:]},
		{"POST", "/v1/tokens", `{"role":"reader"}`, all[3:]},
	} {
		for role, secret := range secrets {
			path := tc.path
			if strings.Contains(path, "{sb}") {
				path = strings.ReplaceAll(path, "{sb}", h.create(adminSecret, sbx).ID)
			}
			a := h.do(secret, tc.method, path, tc.body)
			want := false
			for _, r := range tc.allowed {
				want = want || r == role
			}
			if got := a.status != http.StatusForbidden && a.status != http.StatusUnauthorized; got != want {
				t.Errorf("%s %s as %s: %d %s; want allowed=%v", tc.method, tc.path, role, a.status, a.body, want)
			} else if !want && a.code(t) != api.CodeForbidden {
				t.Errorf("%s %s as %s: code %s, want forbidden", tc.method, tc.path, role, a.code(t))
			}
		}
		if tc.method == "POST" && tc.path == "/v1/projects" {
			h.do(adminSecret, "DELETE", "/v1/projects/research/a/sub", "")
		}
	}

	// Root-scoped builders may delete shared objects (no layer store here: 503).
	rootBuilder := h.token("", iam.RoleBuilder)
	if a := h.do(rootBuilder, "POST", "/v1/gc", ""); a.status != http.StatusServiceUnavailable {
		t.Errorf("gc as a root builder: %d %s, want 503 (no layers configured)", a.status, a.body)
	}
	// No token, or an unknown one: 401.
	for _, secret := range []string{"", "wrn_not-a-real-token-at-all"} {
		if a := h.do(secret, "GET", "/v1/sandboxes", ""); a.status != http.StatusUnauthorized || a.code(t) != api.CodeUnauthenticated {
			t.Errorf("secret %q: %d %s, want 401", secret, a.status, a.body)
		}
	}
}

// A token sees its own subtree; a sandbox anywhere else answers as a
// missing one would.
func TestSandboxScope(t *testing.T) {
	h := newIAMHarness(t, nil)
	for _, p := range []string{"research", "research/a", "research/a/x", "research/b"} {
		h.project(p, iam.Quota{})
	}
	a, b := h.token("research/a", iam.RoleRunner), h.token("research/b", iam.RoleRunner)
	mine := h.create(a, `{"image":"busybox","labels":{"k":"v"}}`)
	if mine.Project != "research/a" {
		t.Errorf("default project: got %q, want the token's research/a", mine.Project)
	}
	deeper := h.create(a, `{"image":"busybox","project":"/research/a/x/"}`)
	if deeper.Project != "research/a/x" {
		t.Errorf("project in a sub-project: got %q, want research/a/x", deeper.Project)
	}
	theirs := h.create(b, `{"image":"busybox"}`)

	missing := h.do(a, "GET", "/v1/sandboxes/n1-aaaaaaaaaaaaaaaa", "")
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/" + theirs.ID, ""},
		{"POST", "/v1/sandboxes/" + theirs.ID + "/exec", `{"cmd":"true"}`},
		{"GET", "/v1/sandboxes/" + theirs.ID + "/files?path=/etc/hostname", ""},
		{"PUT", "/v1/sandboxes/" + theirs.ID + "/files?path=/tmp/x", "data"},
		{"GET", "/v1/sandboxes/" + theirs.ID + "/stat?path=/", ""},
	} {
		got := h.do(a, tc.method, tc.path, tc.body)
		if got.status != http.StatusNotFound || got.code(t) != api.CodeSandboxNotFound {
			t.Errorf("%s %s from another project: %d %s, want 404 sandbox_not_found", tc.method, tc.path, got.status, got.body)
		}
		// Same answer as a sandbox that does not exist, id aside.
		var e1, e2 api.ErrorBody
		got.decode(t, &e1)
		missing.decode(t, &e2)
		if strings.ReplaceAll(e1.Error.Message, theirs.ID, "ID") != strings.ReplaceAll(e2.Error.Message, "n1-aaaaaaaaaaaaaaaa", "ID") {
			t.Errorf("hidden %q vs missing %q: the messages differ", e1.Error.Message, e2.Error.Message)
		}
	}
	// Delete answers as for a sandbox already gone, and deletes nothing.
	if got := h.do(a, "DELETE", "/v1/sandboxes/"+theirs.ID, ""); got.status != http.StatusNoContent {
		t.Errorf("delete from another project: %d %s, want 204", got.status, got.body)
	}
	if got := h.do(b, "GET", "/v1/sandboxes/"+theirs.ID, ""); got.status != http.StatusOK {
		t.Errorf("after another project's delete: %d %s, want the sandbox still there", got.status, got.body)
	}
	if got := h.do(a, "DELETE", "/v1/sandboxes/n1-aaaaaaaaaaaaaaaa", ""); got.status != http.StatusNoContent {
		t.Errorf("delete of a missing sandbox: %d, want 204", got.status)
	}

	ids := func(secret, query string) []string {
		t.Helper()
		got := h.do(secret, "GET", "/v1/sandboxes"+query, "")
		if got.status != http.StatusOK {
			t.Fatalf("list%s: %d %s", query, got.status, got.body)
		}
		var list api.SandboxList
		got.decode(t, &list)
		var out []string
		for _, sb := range list.Sandboxes {
			out = append(out, sb.ID)
		}
		return out
	}
	eq := func(got []string, want ...string) bool { return strings.Join(got, ",") == strings.Join(want, ",") }
	if got := ids(a, ""); !eq(got, mine.ID, deeper.ID) {
		t.Errorf("list as research/a: %v, want %s %s", got, mine.ID, deeper.ID)
	}
	if got := ids(a, "?project=research/a/x"); !eq(got, deeper.ID) {
		t.Errorf("list ?project=research/a/x: %v, want %s", got, deeper.ID)
	}
	if got := ids(a, "?project=research/a&label=k=v"); !eq(got, mine.ID) {
		t.Errorf("list with a label: %v, want %s", got, mine.ID)
	}
	if got := ids(h.token("research", iam.RoleReader), ""); len(got) != 3 {
		t.Errorf("list as research: %v, want all three", got)
	}
	if got := ids(adminSecret, "?project=research/b"); !eq(got, theirs.ID) {
		t.Errorf("root list ?project=research/b: %v, want %s", got, theirs.ID)
	}
	if got := h.do(a, "GET", "/v1/sandboxes?project=research/b", ""); got.status != http.StatusForbidden {
		t.Errorf("list another project: %d %s, want 403", got.status, got.body)
	}
	if got := h.do(a, "GET", "/v1/sandboxes?project=Bad!", ""); got.status != http.StatusBadRequest || got.code(t) != api.CodeInvalidProject {
		t.Errorf("list a malformed project: %d %s, want 400 invalid_project", got.status, got.body)
	}

	// Creates stay within the scope too.
	for _, tc := range []struct {
		project string
		status  int
		code    string
	}{
		{"research/b", 403, api.CodeForbidden},
		{"research", 403, api.CodeForbidden},
		{"research/a/nope", 404, api.CodeProjectNotFound},
		{"Research/A", 400, api.CodeInvalidProject},
	} {
		got := h.do(a, "POST", "/v1/sandboxes", `{"image":"busybox","project":"`+tc.project+`"}`)
		if got.status != tc.status || got.code(t) != tc.code {
			t.Errorf("create in %s: %d %s, want %d %s", tc.project, got.status, got.body, tc.status, tc.code)
		}
	}
}

// StaticToken keeps a setup without IAM working as a root admin.
func TestStaticTokenIsRootAdmin(t *testing.T) {
	h := newHarness(t, nil)
	sb := h.create(`{"image":"busybox","project":"anything/goes"}`)
	if sb.Project != "anything/goes" {
		t.Errorf("project = %q", sb.Project)
	}
	resp, b := h.json("GET", "/v1/sandboxes?project=anything", "")
	var list api.SandboxList
	if resp.StatusCode != 200 || json.Unmarshal(b, &list) != nil || len(list.Sandboxes) != 1 {
		t.Errorf("list ?project=anything: %d %s", resp.StatusCode, b)
	}
	resp, b = h.json("GET", "/v1/projects", "")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("projects without IAM: %d %s, want 503", resp.StatusCode, b)
	}
}

// api's codes are iam's: clients switch on them.
func TestCodesMatchIAM(t *testing.T) {
	for _, c := range [][2]string{
		{api.CodeInvalidProject, iam.CodeInvalidProject},
		{api.CodeRequestExceedsQuota, iam.CodeRequestTooLarge},
		{api.CodeProjectNotFound, iam.CodeProjectNotFound},
		{api.CodeTokenNotFound, iam.CodeTokenNotFound},
		{api.CodeProjectExists, iam.CodeProjectExists},
		{api.CodeProjectHasChildren, iam.CodeProjectHasChildren},
		{api.CodeProjectInUse, iam.CodeProjectInUse},
		{api.CodeTooManyProjects, iam.CodeTooManyProjects},
		{api.CodeQuotaExceedsParent, iam.CodeQuotaExceedsParent},
		{api.CodeQuotaBelowChildren, iam.CodeQuotaBelowChildren},
		{api.CodeIdempotencyReused, iam.CodeIdempotencyReused},
		{api.CodeIdempotencyLost, iam.CodeIdempotencyLost},
		{api.CodeQuotaExceeded, iam.CodeQuotaExceeded},
		{api.CodeRateLimited, iam.CodeRateLimited},
		{api.RoleReader, string(iam.RoleReader)},
		{api.RoleRunner, string(iam.RoleRunner)},
		{api.RoleBuilder, string(iam.RoleBuilder)},
		{api.RoleAdmin, string(iam.RoleAdmin)},
		{api.RoleNode, string(iam.RoleNode)},
	} {
		if c[0] != c[1] {
			t.Errorf("api %q != iam %q", c[0], c[1])
		}
	}
}

// Build sandboxes: a builder's creates are build sandboxes, which runners
// and readers of the same project (root-scoped ones too) can neither see
// nor reach, as if missing; builders and admins can. Only they may ask
// for one, and an admin's creates are ordinary unless it does.
func TestBuildSandboxes(t *testing.T) {
	h := newIAMHarness(t, nil)
	h.project("team", iam.Quota{})
	builder, runner, reader := h.token("team", iam.RoleBuilder), h.token("team", iam.RoleRunner), h.token("team", iam.RoleReader)
	rootRunner, admin := h.token("", iam.RoleRunner), h.token("team", iam.RoleAdmin)
	build := h.create(builder, `{"image":"busybox"}`)
	if !build.Build {
		t.Fatalf("a builder's sandbox: %+v, want build", build)
	}
	plain := h.create(builder, `{"image":"busybox","build":false}`)
	adminPlain := h.create(admin, `{"image":"busybox"}`)
	adminBuild := h.create(admin, `{"image":"busybox","build":true}`)
	mine := h.create(runner, `{"image":"busybox"}`)
	if plain.Build || adminPlain.Build || !adminBuild.Build || mine.Build {
		t.Errorf("build flags: builder false %v, admin %v, admin true %v, runner %v", plain.Build, adminPlain.Build, adminBuild.Build, mine.Build)
	}
	if a := h.do(runner, "POST", "/v1/sandboxes", `{"image":"busybox","build":true}`); a.status != http.StatusForbidden || a.code(t) != api.CodeForbidden {
		t.Errorf("a runner asking for a build sandbox: %d %s, want 403", a.status, a.body)
	}
	if a := h.do(runner, "POST", "/v1/sandboxes:batch", `{"count":2,"template":{"image":"busybox","build":true}}`); a.status != http.StatusForbidden {
		t.Errorf("a runner asking for a gang of build sandboxes: %d %s, want 403", a.status, a.body)
	}

	for _, secret := range []string{runner, reader, rootRunner} {
		for _, id := range []string{build.ID, adminBuild.ID} {
			for _, tc := range []struct{ method, path, body string }{
				{"GET", "/v1/sandboxes/" + id, ""},
				{"POST", "/v1/sandboxes/" + id + "/exec", `{"cmd":"true"}`},
				{"GET", "/v1/sandboxes/" + id + "/files?path=/etc/hostname", ""},
				{"PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/x", "data"},
			} {
				if a := h.do(secret, tc.method, tc.path, tc.body); a.status != http.StatusNotFound && a.status != http.StatusForbidden {
					t.Errorf("%s %s as a non-builder: %d %s, want 404 (or 403 for a reader)", tc.method, tc.path, a.status, a.body)
				} else if secret != reader && a.code(t) != api.CodeSandboxNotFound {
					t.Errorf("%s %s as a runner: %s, want sandbox_not_found", tc.method, tc.path, a.code(t))
				}
			}
		}
		// Delete answers as for one already gone, and deletes nothing.
		h.do(secret, "DELETE", "/v1/sandboxes/"+build.ID, "")
	}
	if a := h.do(builder, "GET", "/v1/sandboxes/"+build.ID, ""); a.status != http.StatusOK {
		t.Fatalf("the builder's own build sandbox after non-builders' deletes: %d %s", a.status, a.body)
	}
	list := func(secret string) map[string]bool {
		t.Helper()
		a := h.do(secret, "GET", "/v1/sandboxes", "")
		var l api.SandboxList
		a.decode(t, &l)
		ids := map[string]bool{}
		for _, sb := range l.Sandboxes {
			ids[sb.ID] = true
		}
		return ids
	}
	for _, secret := range []string{runner, reader, rootRunner} {
		if ids := list(secret); ids[build.ID] || ids[adminBuild.ID] || !ids[plain.ID] || !ids[mine.ID] || !ids[adminPlain.ID] {
			t.Errorf("a non-builder's list: %v", ids)
		}
	}
	for _, secret := range []string{builder, admin, adminSecret} {
		if ids := list(secret); !ids[build.ID] || !ids[adminBuild.ID] || !ids[mine.ID] {
			t.Errorf("a builder's or admin's list: %v", ids)
		}
	}
	// The builder execs in it, and a runner still cannot after that
	// (the scope cache holds the kind).
	if a := h.do(builder, "POST", "/v1/sandboxes/"+build.ID+"/exec", `{"cmd":"true"}`); a.status != http.StatusOK {
		t.Errorf("exec as the builder: %d %s", a.status, a.body)
	}
	if a := h.do(runner, "POST", "/v1/sandboxes/"+build.ID+"/exec", `{"cmd":"true"}`); a.status != http.StatusNotFound {
		t.Errorf("exec as a runner after the builder's: %d %s", a.status, a.body)
	}
}
