package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// recorder answers every request with status and body and remembers what
// it was asked.
type recorder struct {
	method, uri, body string
	status            int
	answer            any
	header            map[string]string
}

func (rec *recorder) server(t *testing.T) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.method, rec.uri, rec.body = r.Method, r.URL.RequestURI(), string(b)
		for k, v := range rec.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.status)
		if rec.answer != nil {
			json.NewEncoder(w).Encode(rec.answer)
		}
	}))
	t.Cleanup(srv.Close)
	return New(srv.URL, "tok", WithCreateRetry(RetryPolicy{}))
}

func TestProjectCalls(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{status: 200, answer: api.Project{Path: "research/rl-math", Quota: api.Quota{Sandboxes: 2000, CPU: 500, Memory: 2 << 40}}}
	c := rec.server(t)
	n := int64(3000)
	desc := "math"
	for _, tc := range []struct {
		name              string
		call              func() error
		method, uri, body string
	}{
		{"create", func() error {
			_, err := c.CreateProject(ctx, api.CreateProjectRequest{Path: "research/rl-math", Quota: api.Quota{Sandboxes: 2000, CPU: 500, Memory: 2 << 40}})
			return err
		}, "POST", "/v1/projects", `{"path":"research/rl-math","quota":{"sandboxes":2000,"cpu":500,"memory":"2Ti"}}`},
		{"get", func() error { _, err := c.GetProject(ctx, "research/rl-math"); return err }, "GET", "/v1/projects/research/rl-math", ""},
		{"get root", func() error { _, err := c.GetProject(ctx, "/"); return err }, "GET", "/v1/projects/", ""},
		{"update", func() error {
			_, err := c.UpdateProject(ctx, "research/rl-math", api.UpdateProjectRequest{Quota: &api.QuotaPatch{Sandboxes: &n}, Description: &desc})
			return err
		}, "PATCH", "/v1/projects/research/rl-math", `{"quota":{"sandboxes":3000},"description":"math"}`},
		{"delete", func() error { return c.DeleteProject(ctx, "research/rl-math") }, "DELETE", "/v1/projects/research/rl-math", ""},
		{"list scope", func() error { _, err := c.ListProjects(ctx, ""); return err }, "GET", "/v1/projects", ""},
		{"list root", func() error { _, err := c.ListProjects(ctx, "/"); return err }, "GET", "/v1/projects?path=%2F", ""},
		{"token create", func() error {
			_, err := c.CreateToken(ctx, api.CreateTokenRequest{Project: "research", Role: api.RoleRunner, TTL: api.Duration(720 * time.Hour), Name: "trainer-7"})
			return err
		}, "POST", "/v1/tokens", `{"project":"research","role":"runner","ttl":"720h0m0s","name":"trainer-7"}`},
		{"token list", func() error { _, err := c.ListTokens(ctx, "research"); return err }, "GET", "/v1/tokens?project=research", ""},
		{"token revoke", func() error { return c.RevokeToken(ctx, "abc") }, "DELETE", "/v1/tokens/abc", ""},
	} {
		if err := tc.call(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if rec.method != tc.method || rec.uri != tc.uri || (tc.body != "" && rec.body != tc.body) {
			t.Errorf("%s sent %s %s %s; want %s %s %s", tc.name, rec.method, rec.uri, rec.body, tc.method, tc.uri, tc.body)
		}
	}
	if err := c.DeleteProject(ctx, "/"); err == nil {
		t.Error("deleting the root: no error")
	}
	p, err := c.GetProject(ctx, "research/rl-math")
	if err != nil || p.Quota.Memory != 2<<40 || p.Quota.CPU != 500 {
		t.Errorf("decoded %+v, %v", p, err)
	}
}

func TestQuotaErrors(t *testing.T) {
	rec := &recorder{status: 429, header: map[string]string{"Retry-After": "3"},
		answer: api.ErrorBody{Error: api.Error{Code: api.CodeQuotaExceeded, Message: "sandboxes quota of project q is exhausted", RetryAfter: 3}}}
	c := rec.server(t)
	_, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{Image: "busybox", Project: "q", IdempotencyKey: "k"})
	if !IsQuotaExceeded(err) || !IsExhausted(err) || IsRateLimited(err) || RetryAfter(err) != 3*time.Second {
		t.Errorf("quota refusal: %v (retry after %v)", err, RetryAfter(err))
	}
	var sent api.CreateSandboxRequest
	if json.Unmarshal([]byte(rec.body), &sent) != nil || sent.Project != "q" || sent.IdempotencyKey != "k" {
		t.Errorf("create body %s", rec.body)
	}
	// Stream errors (no status) classify by code.
	for code, want := range map[string]error{
		api.CodeQuotaExceedsParent: ErrConflict, api.CodeProjectNotFound: ErrNotFound,
		api.CodeRateLimited: ErrExhausted, api.CodeInvalidProject: ErrInvalid,
	} {
		if e := (&Error{Code: code}); !errors.Is(e, want) {
			t.Errorf("code %s is not %v", code, want)
		}
	}
}
