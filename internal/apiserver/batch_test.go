package apiserver_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
)

func (h *harness) listLabel(label string) []api.Sandbox {
	h.t.Helper()
	resp, b := h.do("GET", "/v1/sandboxes?label="+label, "", nil)
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("list: %d %s", resp.StatusCode, b)
	}
	var l api.SandboxList
	if err := json.Unmarshal(b, &l); err != nil {
		h.t.Fatal(err)
	}
	return l.Sandboxes
}

func TestBatchCreate(t *testing.T) {
	h := newHarness(t, nil)
	resp, b := h.json("POST", "/v1/sandboxes:batch", `{"count":4,"all_or_none":true,"template":{"image":"busybox","labels":{"task":"t1"}}}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("gang of 4: %d %s", resp.StatusCode, b)
	}
	var out api.BatchCreateResponse
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Gang == "" || len(out.Sandboxes) != 4 || len(out.Errors) != 0 {
		t.Fatalf("gang of 4: %s", b)
	}
	seen := map[string]bool{}
	for _, sb := range out.Sandboxes {
		if sb.Labels[api.LabelGang] != out.Gang || sb.Labels["task"] != "t1" {
			t.Errorf("member %s labels %v", sb.ID, sb.Labels)
		}
		seen[sb.Labels[api.LabelGangIndex]] = true
	}
	for i := range 4 {
		if !seen[strconv.Itoa(i)] {
			t.Errorf("no member with index %d", i)
		}
	}
	if l := h.listLabel(api.LabelGang + "=" + out.Gang); len(l) != 4 {
		t.Errorf("list by gang label: %d sandboxes, want 4", len(l))
	}

	for _, body := range []string{`{"count":0,"template":{"image":"busybox"}}`, `{"count":2,"template":{"image":"busybox","idempotency_key":"k"}}`} {
		if resp, b := h.json("POST", "/v1/sandboxes:batch", body); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", body, resp.StatusCode, b)
		}
	}
}

func TestBatchCreateCapacity(t *testing.T) {
	h := newHarness(t, func(c *node.Config) { c.Limits.Sandboxes = 3 })
	resp, b := h.json("POST", "/v1/sandboxes:batch", `{"count":5,"all_or_none":true,"template":{"image":"busybox","resources":{"cpu":0.1,"memory":"16Mi"}}}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("all-or-none gang of 5 on a 3-sandbox node: %d %s (Retry-After %q), want 429", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	if l := h.listLabel(api.LabelGangIndex + "=0"); len(l) != 0 {
		t.Fatalf("after a refused all-or-none gang: %d sandboxes left: %+v", len(l), l)
	}
	resp, b = h.do("GET", "/v1/sandboxes", "", nil)
	var all api.SandboxList
	if err := json.Unmarshal(b, &all); err != nil || len(all.Sandboxes) != 0 {
		t.Fatalf("after a refused all-or-none gang: %s (%v), want no sandboxes", b, err)
	}

	resp, b = h.json("POST", "/v1/sandboxes:batch", `{"count":5,"template":{"image":"busybox","resources":{"cpu":0.1,"memory":"16Mi"}}}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("best-effort gang of 5 on a 3-sandbox node: %d %s, want 200", resp.StatusCode, b)
	}
	var out api.BatchCreateResponse
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Sandboxes) != 3 || len(out.Errors) != 2 {
		t.Fatalf("best-effort gang: %d created, %d errors, want 3 and 2: %s", len(out.Sandboxes), len(out.Errors), b)
	}
	for _, e := range out.Errors {
		if e.Error.Code == "" {
			t.Errorf("member %d: error without a code", e.Index)
		}
	}
}

func TestBatchCreateQuota(t *testing.T) {
	h := newIAMHarness(t, nil)
	h.project("g", iam.Quota{Resources: iam.Resources{Sandboxes: 3}})
	tok := h.token("g", iam.RoleRunner)
	a := h.do(tok, "POST", "/v1/sandboxes:batch", `{"count":4,"all_or_none":true,"template":{"image":"busybox","resources":{"cpu":0.1,"memory":"16Mi"}}}`)
	if a.status != http.StatusTooManyRequests || a.code(t) != api.CodeQuotaExceeded || a.header.Get("Retry-After") == "" {
		t.Fatalf("gang of 4 in a 3-sandbox quota: %d %s, want 429 quota_exceeded", a.status, a.body)
	}
	// Nothing was created or left reserved: a gang of 3 fits.
	a = h.do(tok, "POST", "/v1/sandboxes:batch", `{"count":3,"all_or_none":true,"template":{"image":"busybox","resources":{"cpu":0.1,"memory":"16Mi"}}}`)
	if a.status != http.StatusCreated {
		t.Fatalf("gang of 3 in a 3-sandbox quota: %d %s", a.status, a.body)
	}
	var out api.BatchCreateResponse
	a.decode(t, &out)
	for _, sb := range out.Sandboxes {
		if sb.Project != "g" {
			t.Errorf("member %s in project %q", sb.ID, sb.Project)
		}
	}
	if a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"cpu":0.1,"memory":"16Mi"}}`); a.status != http.StatusTooManyRequests {
		t.Errorf("create past a full gang: %d %s, want 429", a.status, a.body)
	}
}
