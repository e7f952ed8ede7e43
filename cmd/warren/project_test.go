package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/store"
)

const rootSecret = "root-admin-secret-0123456789"

// iamServer serves the real apiserver with IAM over an in-memory store and
// a fake-backend node; it returns a function running the CLI against it
// with a given token.
func iamServer(t *testing.T) func(token string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := store.Memory()
	usage := apiserver.NewUsage()
	// A quota refusal asks for longer than the CLI's retry policy waits,
	// so it comes back at once.
	m := iam.New(st, iam.Options{Usage: usage, CommitHold: -1, QuotaRetryAfter: time.Minute})
	if _, err := m.EnsureAdmin(ctx, rootSecret); err != nil {
		t.Fatal(err)
	}
	agent := nodetest.New(t, nil)
	go usage.Follow(ctx, agent, 50*time.Millisecond)
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: agent, Images: imagetest.Busybox, Tokens: m, IAM: m, Usage: usage,
		Idempotency: iam.NewIdempotency(st, iam.IdempotencyOptions{}),
		Log:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	t.Cleanup(srv.Close)
	return func(token string, args ...string) result {
		vars := map[string]string{"WARREN_ADDR": srv.URL, "WARREN_TOKEN": token, "WARREN_DATA_DIR": t.TempDir()}
		var out, errOut bytes.Buffer
		a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(k string) string { return vars[k] }}
		code := run(context.Background(), args, a)
		return result{code, out.String(), errOut.String()}
	}
}

func TestProjectAndTokenVerbs(t *testing.T) {
	cli := iamServer(t)
	ok := func(token string, args ...string) result {
		t.Helper()
		r := cli(token, args...)
		if r.code != 0 {
			t.Fatalf("warren %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
		}
		return r
	}
	fails := func(code int, stderr, token string, args ...string) {
		t.Helper()
		r := cli(token, args...)
		if r.code != code || !strings.Contains(r.stderr, stderr) {
			t.Errorf("warren %s: exit %d stderr %q; want exit %d and %q", strings.Join(args, " "), r.code, r.stderr, code, stderr)
		}
	}

	r := ok(rootSecret, "project", "create", "research", "--quota", "sandboxes=10,vcpu=8,memory=8Gi,creates=100/s", "--description", "RL research")
	if !strings.Contains(r.stdout, "research") || !strings.Contains(r.stdout, "0 / 10") || !strings.Contains(r.stdout, "100/s") {
		t.Errorf("create printed %q", r.stdout)
	}
	fails(1, "(quota_exceeds_parent)", rootSecret, "project", "create", "research/rl-math", "--quota", "sandboxes=2,vcpu=2,memory=2Ti")
	fails(1, "(project_not_found)", rootSecret, "project", "create", "nope/x")
	ok(rootSecret, "project", "create", "research/rl-math", "--quota", "sandboxes=2,vcpu=2,memory=2Gi")

	r = ok(rootSecret, "token", "create", "--project", "research/rl-math", "--role", "runner", "--ttl", "30d", "--name", "trainer-7")
	runner := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(runner, iam.SecretPrefix) || !strings.Contains(r.stderr, "runner of research/rl-math") || !strings.Contains(r.stderr, "shown only once") {
		t.Fatalf("token create: stdout %q stderr %q", r.stdout, r.stderr)
	}

	ids := []string{
		strings.TrimSpace(ok(runner, "sandbox", "create", "--image", "busybox", "--cpu", "0.5", "--memory", "64Mi").stdout),
		strings.TrimSpace(ok(runner, "sandbox", "create", "--image", "busybox", "--cpu", "0.5", "--memory", "64Mi").stdout),
	}
	fails(1, "(quota_exceeded)", runner, "sandbox", "create", "--image", "busybox", "--cpu", "0.5", "--memory", "64Mi")
	fails(1, "(forbidden)", runner, "sandbox", "create", "--image", "busybox", "--project", "research")
	fails(1, "(forbidden)", runner, "project", "create", "research/rl-math/sub")
	if r := ok(runner, "sandbox", "get", ids[0]); !strings.Contains(r.stdout, "research/rl-math") {
		t.Errorf("sandbox get shows no project: %q", r.stdout)
	}
	if r := ok(rootSecret, "sandbox", "ls", "--project", "research", "-o", "id"); r.stdout != ids[0]+"\n"+ids[1]+"\n" {
		t.Errorf("sandbox ls --project research: %q", r.stdout)
	}

	// The tree with usage: the sub-project's two sandboxes count in both.
	r = ok(rootSecret, "project", "ls")
	for _, want := range []string{"PROJECT", "/ ", "└── research", "    └── rl-math", "2 / 10", "2 / 2", "1 / 2", "128Mi / 2Gi", "RL research"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("project ls lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := ok(rootSecret, "project", "ls", "research/rl-math"); strings.Contains(r.stdout, "└──") || !strings.HasPrefix(strings.Split(r.stdout, "\n")[1], "research/rl-math") {
		t.Errorf("project ls research/rl-math:\n%s", r.stdout)
	}
	var p api.Project
	if err := json.Unmarshal([]byte(ok(rootSecret, "project", "get", "research/rl-math", "-o", "json").stdout), &p); err != nil ||
		p.Quota.Sandboxes != 2 || p.Quota.Memory != 2<<30 || p.Usage.Sandboxes != 2 || p.Usage.CPU != 1 {
		t.Errorf("project get -o json: %+v %v", p, err)
	}
	if r := ok(rootSecret, "project", "get", "research"); !strings.Contains(r.stdout, "Sub-projects:") || !strings.Contains(r.stdout, "rl-math") {
		t.Errorf("project get research:\n%s", r.stdout)
	}

	// More quota, then the create goes through; other fields stay.
	r = ok(rootSecret, "project", "update", "research/rl-math", "--quota", "sandboxes=3")
	if !strings.Contains(r.stdout, "2 / 3") || !strings.Contains(r.stdout, "2Gi") {
		t.Errorf("update printed:\n%s", r.stdout)
	}
	ok(runner, "sandbox", "create", "--image", "busybox", "--cpu", "0.5", "--memory", "64Mi")
	fails(1, "(quota_below_children)", rootSecret, "project", "update", "research", "--quota", "sandboxes=2")
	fails(1, "(project_in_use)", rootSecret, "project", "rm", "research/rl-math")
	fails(1, "(project_has_children)", rootSecret, "project", "rm", "research")

	// Tokens: list, revoke, and the revoked one stops working.
	r = ok(rootSecret, "token", "ls", "--project", "research")
	if !strings.Contains(r.stdout, "trainer-7") || !strings.Contains(r.stdout, "runner") || !strings.Contains(r.stdout, "in 29d") {
		t.Errorf("token ls:\n%s", r.stdout)
	}
	// A node token bound to a node name: shown by create and ls.
	fails(2, "--node binds a node token", rootSecret, "token", "create", "--role", "runner", "--node", "rack2-node7")
	fails(1, "(invalid_argument)", rootSecret, "token", "create", "--role", "node", "--node", "Rack2_Node7")
	r = ok(rootSecret, "token", "create", "--role", "node", "--project", "/", "--node", "rack2-node7", "--name", "rack2")
	if !strings.Contains(r.stderr, "bound to node rack2-node7") {
		t.Errorf("token create --node: stderr %q", r.stderr)
	}
	if r = ok(rootSecret, "token", "ls", "--project", "/"); !strings.Contains(r.stdout, "NODE") || !strings.Contains(r.stdout, "rack2-node7") {
		t.Errorf("token ls shows no bound node:\n%s", r.stdout)
	}
	var bound api.TokenList
	if err := json.Unmarshal([]byte(ok(rootSecret, "token", "ls", "--project", "/", "-o", "json").stdout), &bound); err != nil {
		t.Fatal(err)
	}
	for _, tok := range bound.Tokens {
		if tok.Name == "rack2" && tok.Node != "rack2-node7" {
			t.Errorf("token %+v: want node rack2-node7", tok)
		}
		if tok.Name == "rack2" {
			ok(rootSecret, "token", "revoke", tok.ID)
		}
	}
	var list api.TokenList
	if err := json.Unmarshal([]byte(ok(rootSecret, "token", "ls", "-o", "json").stdout), &list); err != nil || len(list.Tokens) != 2 {
		t.Fatalf("token ls -o json: %+v %v", list, err)
	}
	var id string
	for _, tok := range list.Tokens {
		if tok.Name == "trainer-7" {
			id = tok.ID
		}
	}
	if r := ok(rootSecret, "token", "revoke", id); r.stdout != id+"\n" {
		t.Errorf("revoke printed %q", r.stdout)
	}
	fails(1, "(unauthenticated)", runner, "sandbox", "ls")
	fails(1, "(token_not_found)", rootSecret, "token", "revoke", id)

	// An agent's admin token runs its own sub-tree.
	agent := strings.TrimSpace(ok(rootSecret, "token", "create", "--project", "research", "--role", "admin").stdout)
	ok(agent, "project", "create", "research/agent-1", "--quota", "sandboxes=1")
	fails(1, "(forbidden)", agent, "project", "update", "research", "--quota", "sandboxes=100")
	var created api.CreatedToken
	if err := json.Unmarshal([]byte(ok(agent, "token", "create", "--project", "research/agent-1", "--role", "runner", "-o", "json").stdout), &created); err != nil || created.Secret == "" {
		t.Fatalf("token create -o json: %v", err)
	}
	if r := ok(agent, "project", "ls"); !strings.HasPrefix(strings.Split(r.stdout, "\n")[1], "research ") {
		t.Errorf("the agent's project ls starts at its own project:\n%s", r.stdout)
	}
}

func TestProjectUsageErrors(t *testing.T) {
	cli := iamServer(t)
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"project", "create"}, "one project path"},
		{[]string{"project", "create", "x", "--quota", "bogus=1"}, `unknown key "bogus"`},
		{[]string{"project", "create", "x", "--quota", "sandboxes"}, "want KEY=VALUE"},
		{[]string{"project", "create", "x", "--quota", "memory=lots"}, "a size like 2Ti"},
		{[]string{"project", "update", "x"}, "nothing to change"},
		{[]string{"project", "rm"}, "one or more project paths"},
		{[]string{"project", "ls", "a", "b"}, "at most one project path"},
		{[]string{"token", "create"}, "--role is required"},
		{[]string{"token", "create", "--role", "runner", "--ttl", "soon"}, "--ttl"},
		{[]string{"token", "revoke"}, "one or more token ids"},
	} {
		if r := cli(rootSecret, tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.stderr) {
			t.Errorf("warren %s: exit %d stderr %q; want 2 and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.stderr)
		}
	}
}

func TestParseQuota(t *testing.T) {
	p, err := parseQuota("sandboxes=2000, vcpu=500,memory=2Ti,disk=10Ti,creates=50/s,burst=100,fn=400/s,fn-burst=800")
	if err != nil {
		t.Fatal(err)
	}
	got := p.Apply(api.Quota{})
	want := api.Quota{Sandboxes: 2000, CPU: 500, Memory: 2 << 40, Disk: 10 << 40, CreatesPerSec: 50, CreatesBurst: 100,
		FnCallsPerSec: 400, FnCallsBurst: 800}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	p, _ = parseQuota("cpu=0.5")
	if q := p.Apply(want); q.CPU != 0.5 || q.Sandboxes != 2000 {
		t.Errorf("a patch of cpu changed %+v", q)
	}
	for _, in := range []string{"30d", "12h", "1.5d"} {
		if _, err := parseTTL(in); err != nil {
			t.Errorf("parseTTL(%q): %v", in, err)
		}
	}
}
