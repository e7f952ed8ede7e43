package nodeapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/node/nodetest"
)

func sortedIDs(sbs []api.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	sort.Strings(out)
	return out
}

func TestChanges(t *testing.T) {
	c, _, _ := serve(t, nil)
	ctx := context.Background()
	a := mustCreate(t, c, api.CreateSandboxRequest{})
	b := mustCreate(t, c, api.CreateSandboxRequest{})

	full, err := c.Changes(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{a.ID, b.ID}
	sort.Strings(want)
	if !full.Full || full.Epoch == "" || !slices.Equal(sortedIDs(full.Sandboxes), want) {
		t.Fatalf("first call: full %v, epoch %q, %v; want the full list %v", full.Full, full.Epoch, sortedIDs(full.Sandboxes), want)
	}
	if err := c.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	d := mustCreate(t, c, api.CreateSandboxRequest{})
	delta, err := c.Changes(ctx, full.Epoch, full.Rev)
	if err != nil {
		t.Fatal(err)
	}
	if delta.Full || !slices.Equal(sortedIDs(delta.Sandboxes), []string{d.ID}) || !slices.Equal(delta.Deleted, []string{a.ID}) {
		t.Fatalf("delta: full %v, changed %v, deleted %v; want [%s] and [%s]", delta.Full, sortedIDs(delta.Sandboxes), delta.Deleted, d.ID, a.ID)
	}
}

// An agent without Changes, or a node that predates GET /v1/changes, is
// listed whole.
func TestChangesFallBackToList(t *testing.T) {
	ctx := context.Background()
	agent := nodetest.New(t, nil)
	sb, err := agent.Create(ctx, api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	plain := struct{ nodeapi.Agent }{agent} // hides Changes
	srv := httptest.NewServer(nodeapi.NewServer(plain, nodeapi.Secret(token), quiet))
	t.Cleanup(srv.Close)

	current := nodeapi.NewServer(agent, nodeapi.Secret(token), quiet)
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/changes" { // as the catch-all route of an older node answers
			httperr.Write(w, errdefs.New(errdefs.ErrNotFound, api.CodeNotFound, "no node API route for %s %s", r.Method, r.URL.Path))
			return
		}
		current.ServeHTTP(w, r)
	}))
	t.Cleanup(old.Close)

	for name, url := range map[string]string{"agent without Changes": srv.URL, "older node": old.URL} {
		c := nodeapi.NewClient(agent.ID(), url, token, nil)
		ch, err := c.Changes(ctx, "some-epoch", 42)
		if err != nil || !ch.Full || !slices.Equal(sortedIDs(ch.Sandboxes), []string{sb.ID}) {
			t.Errorf("%s: %+v, %v; want a full list of [%s]", name, ch, err, sb.ID)
		}
	}
}
