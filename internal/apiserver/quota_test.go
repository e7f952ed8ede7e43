package apiserver_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/iam"
)

func TestQuotaOnCreate(t *testing.T) {
	h := newIAMHarness(t, nil)
	h.project("q", iam.Quota{Resources: iam.Resources{Sandboxes: 2, Memory: 1 << 30}})
	tok := h.token("q", iam.RoleRunner)

	// A create the node refuses holds no quota.
	if a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"nope"}`); a.status != http.StatusNotFound {
		t.Fatalf("unknown image: %d %s", a.status, a.body)
	}
	first := h.create(tok, `{"image":"busybox","resources":{"memory":"256Mi"}}`)
	h.create(tok, `{"image":"busybox","resources":{"memory":"256Mi"}}`)
	a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"memory":"256Mi"}}`)
	if a.status != http.StatusTooManyRequests || a.code(t) != api.CodeQuotaExceeded {
		t.Fatalf("third create in a 2-sandbox quota: %d %s, want 429 quota_exceeded", a.status, a.body)
	}
	if ra, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want whole seconds", a.header.Get("Retry-After"))
	}
	// One sandbox larger than the quota could ever grant: 400, not 429.
	if a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"memory":"2Gi"}}`); a.status != http.StatusBadRequest || a.code(t) != api.CodeRequestExceedsQuota {
		t.Errorf("2Gi in a 1Gi quota: %d %s, want 400 request_exceeds_quota", a.status, a.body)
	}

	// Usage shows on the project, then drains after a delete.
	var p api.Project
	h.do(adminSecret, "GET", "/v1/projects/q", "").decode(t, &p)
	if p.Usage.Sandboxes+p.Reserved.Sandboxes < 2 || p.Quota.Sandboxes != 2 || p.Quota.Memory != 1<<30 {
		t.Errorf("project q: %+v", p)
	}
	if a := h.do(tok, "DELETE", "/v1/sandboxes/"+first.ID, ""); a.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", a.status, a.body)
	}
	// The delete frees its share at once: no wait for a resync. This one
	// goes away by itself after 1s (TTL), which frees its share at the
	// next resync.
	h.create(tok, `{"image":"busybox","ttl":"1s","resources":{"memory":"16Mi"}}`)
	if a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"memory":"16Mi"}}`); a.status != http.StatusTooManyRequests {
		t.Fatalf("create over quota: %d %s", a.status, a.body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"memory":"16Mi"}}`)
		if a.status == http.StatusCreated {
			break
		}
		if a.status != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("create after a TTL expiry: %d %s", a.status, a.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Concurrent creates never overshoot the quota.
func TestQuotaBurst(t *testing.T) {
	h := newIAMHarness(t, nil)
	h.project("burst", iam.Quota{Resources: iam.Resources{Sandboxes: 5}})
	tok := h.token("burst", iam.RoleRunner)
	var wg sync.WaitGroup
	statuses := make([]int, 30)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"cpu":0.1,"memory":"16Mi"}}`).status
		}()
	}
	wg.Wait()
	created := 0
	for _, s := range statuses {
		switch s {
		case http.StatusCreated:
			created++
		case http.StatusTooManyRequests:
		default:
			t.Errorf("status %d", s)
		}
	}
	if created != 5 {
		t.Errorf("created %d of 30 in a 5-sandbox quota, want exactly 5", created)
	}
}

// An agent holding an admin token runs its own sub-tree: sub-projects
// with part of its quota, tokens for them, and nothing beyond.
func TestAgentDelegates(t *testing.T) {
	h := newIAMHarness(t, nil)
	h.project("research", iam.Quota{Resources: iam.Resources{Sandboxes: 10, MilliCPU: 10000}})
	agent := h.token("research", iam.RoleAdmin)

	if a := h.do(agent, "POST", "/v1/projects", `{"path":"research/agent-1","quota":{"sandboxes":4,"cpu":4}}`); a.status != http.StatusCreated {
		t.Fatalf("sub-project: %d %s", a.status, a.body)
	}
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/projects", `{"path":"research/agent-2","quota":{"sandboxes":7}}`, 409, api.CodeQuotaExceedsParent},
		{"PATCH", "/v1/projects/research/agent-1", `{"quota":{"sandboxes":11}}`, 409, api.CodeQuotaExceedsParent},
		{"PATCH", "/v1/projects/research", `{"quota":{"sandboxes":100}}`, 403, api.CodeForbidden}, // its own quota
		{"POST", "/v1/projects", `{"path":"other"}`, 403, api.CodeForbidden},
		{"POST", "/v1/projects", `{"path":"research/agent-1"}`, 409, api.CodeProjectExists},
		{"POST", "/v1/projects", `{"path":"research/nope/x"}`, 404, api.CodeProjectNotFound},
		{"POST", "/v1/projects", `{"path":"research/Bad"}`, 400, api.CodeInvalidProject},
		{"POST", "/v1/tokens", `{"project":"/","role":"reader"}`, 403, api.CodeForbidden},
		{"POST", "/v1/tokens", `{"role":"node"}`, 403, api.CodeForbidden},
		{"POST", "/v1/tokens", `{"role":"root"}`, 400, api.CodeInvalid},
		{"GET", "/v1/projects?path=/", "", 403, api.CodeForbidden},
		{"GET", "/v1/projects/nope", "", 403, api.CodeForbidden},
		{"DELETE", "/v1/tokens/000000000000000000000000", "", 404, api.CodeTokenNotFound},
	} {
		if a := h.do(agent, tc.method, tc.path, tc.body); a.status != tc.status || a.code(t) != tc.code {
			t.Errorf("%s %s %s: %d %s, want %d %s", tc.method, tc.path, tc.body, a.status, a.body, tc.status, tc.code)
		}
	}

	a := h.do(agent, "POST", "/v1/tokens", `{"project":"research/agent-1","role":"runner","ttl":"1h","name":"worker"}`)
	if a.status != http.StatusCreated {
		t.Fatalf("mint: %d %s", a.status, a.body)
	}
	var minted api.CreatedToken
	a.decode(t, &minted)
	if minted.Token.Role != "runner" || minted.Token.Project != "research/agent-1" || minted.Token.ExpiresAt.IsZero() || minted.Secret == "" {
		t.Errorf("minted %+v", minted)
	}
	worker := minted.Secret
	for i := range 4 {
		sb := h.create(worker, `{"image":"busybox","resources":{"cpu":0.5}}`)
		if sb.Project != "research/agent-1" {
			t.Errorf("sandbox %d in %q", i, sb.Project)
		}
	}
	if a := h.do(worker, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"cpu":0.5}}`); a.status != 429 || a.code(t) != api.CodeQuotaExceeded {
		t.Errorf("5th create in a 4-sandbox sub-project: %d %s", a.status, a.body)
	}
	// The parent's own creates see the delegated 4 as taken: 6 left.
	for range 6 {
		h.create(agent, `{"image":"busybox","resources":{"cpu":0.5}}`)
	}
	if a := h.do(agent, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"cpu":0.5}}`); a.status != 429 {
		t.Errorf("11th create under a 10-sandbox parent: %d %s", a.status, a.body)
	}

	// The project tree as the agent sees it.
	var list api.ProjectList
	h.do(agent, "GET", "/v1/projects", "").decode(t, &list)
	if len(list.Projects) != 2 || list.Projects[0].Path != "research" || list.Projects[1].Path != "research/agent-1" ||
		len(list.Projects[0].Children) != 1 || list.Projects[0].Children[0] != "research/agent-1" {
		t.Errorf("projects: %+v", list.Projects)
	}

	// Revoking the worker's token locks it out at once on this apiserver.
	if a := h.do(agent, "DELETE", "/v1/tokens/"+minted.Token.ID, ""); a.status != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", a.status, a.body)
	}
	if a := h.do(worker, "GET", "/v1/sandboxes", ""); a.status != http.StatusUnauthorized {
		t.Errorf("revoked token: %d %s, want 401", a.status, a.body)
	}
}

func TestRateLimit(t *testing.T) {
	h := newIAMHarness(t, nil)
	h.project("slow", iam.Quota{CreatesPerSec: 0.5, CreatesBurst: 1})
	tok := h.token("slow", iam.RoleRunner)
	h.create(tok, `{"image":"busybox"}`)
	a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox"}`)
	if a.status != http.StatusTooManyRequests || a.code(t) != api.CodeRateLimited || a.header.Get("Retry-After") == "" {
		t.Errorf("second create at 0.5/s: %d %s (Retry-After %q), want 429 rate_limited", a.status, a.body, a.header.Get("Retry-After"))
	}
}

// Concurrent replays of one idempotency key get one sandbox, and do not
// count against the quota more than once.
func TestIdempotentCreate(t *testing.T) {
	h := newIAMHarness(t, nil)
	h.project("idem", iam.Quota{Resources: iam.Resources{Sandboxes: 1}})
	tok := h.token("idem", iam.RoleRunner)

	const n = 20
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","labels":{"run":"7"}}`, "Idempotency-Key", "rollout-7")
		}()
	}
	wg.Wait()
	ids := map[string]int{}
	replayed := 0
	for _, a := range answers {
		if a.status != http.StatusCreated {
			t.Fatalf("answer %d %s", a.status, a.body)
		}
		var sb api.Sandbox
		a.decode(t, &sb)
		ids[sb.ID]++
		if a.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if len(ids) != 1 || replayed != n-1 {
		t.Fatalf("%d answers carry ids %v (%d replayed), want one id and %d replays", n, ids, replayed, n-1)
	}
	var list api.SandboxList
	h.do(tok, "GET", "/v1/sandboxes", "").decode(t, &list)
	if len(list.Sandboxes) != 1 {
		t.Errorf("%d sandboxes exist, want 1", len(list.Sandboxes))
	}

	// The key in the body works as the header does; another body is refused.
	a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","labels":{"run":"7"},"idempotency_key":"rollout-7"}`)
	var sb api.Sandbox
	a.decode(t, &sb)
	if a.status != http.StatusCreated || ids[sb.ID] == 0 {
		t.Errorf("replay by body field: %d %s", a.status, a.body)
	}
	a = h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","labels":{"run":"8"}}`, "Idempotency-Key", "rollout-7")
	if a.status != http.StatusConflict || a.code(t) != api.CodeIdempotencyReused {
		t.Errorf("same key, other body: %d %s, want 409 idempotency_key_reused", a.status, a.body)
	}
	// A failed create gives the key up: the next try with it creates.
	if a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox"}`, "Idempotency-Key", "k2"); a.status != 429 {
		t.Fatalf("over quota: %d %s", a.status, a.body)
	}
	h.do(tok, "DELETE", "/v1/sandboxes/"+sb.ID, "")
	deadline := time.Now().Add(5 * time.Second)
	for {
		a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox"}`, "Idempotency-Key", "k2")
		if a.status == http.StatusCreated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry of an abandoned key: %d %s", a.status, a.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Without IAM (StaticToken), idempotency keys still hold within the
// process.
func TestIdempotentCreateStatic(t *testing.T) {
	h := newHarness(t, nil)
	var wg sync.WaitGroup
	ids := make([]string, 10)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, b := h.do("POST", "/v1/sandboxes", "application/json", strings.NewReader(`{"image":"busybox"}`), "Idempotency-Key", "one")
			var sb api.Sandbox
			if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &sb) != nil {
				t.Errorf("%d %s", resp.StatusCode, b)
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] || id == "" {
			t.Fatalf("ids %v, want one", ids)
		}
	}
}
