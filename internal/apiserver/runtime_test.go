package apiserver_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/node"
)

// withRuntimes gives a node a fake container backend with the runtimes
// runc and gvisor, gvisor failing with why unless it is "".
func withRuntimes(t *testing.T, why string) func(*node.Config) {
	return func(c *node.Config) {
		opts := fake.Options{Name: api.BackendContainer, Runtimes: []string{api.RuntimeRunc, api.RuntimeGVisor}}
		if why != "" {
			opts.RuntimeUnavailable = map[string]error{api.RuntimeGVisor: errdefs.Unavailable("gvisor: %s", why)}
		}
		b, err := fake.New(filepath.Join(t.TempDir(), "fake"), opts)
		if err != nil {
			t.Fatal(err)
		}
		c.Backends = []backend.Backend{b}
	}
}

// TestRuntimePlacement: gVisor creates, single and gang, go only to the
// node that runs gVisor, the node list says which does and why not, and
// bad runtimes are 400 before any node is asked; with no node running
// gVisor the answer is 503 runtime_unavailable with a node's reason.
func TestRuntimePlacement(t *testing.T) {
	nodes := map[string]func(*node.Config){"ga": withRuntimes(t, ""), "gb": withRuntimes(t, "runsc not found"), "gc": nil}
	f := newFleetWith(t, fleetOptions{node: func(id string, c *node.Config) {
		if mod := nodes[id]; mod != nil {
			mod(c)
		}
	}}, "ga", "gb", "gc")

	for range 6 {
		if sb := f.create(`{"image":"busybox","resources":{"cpu":0.1},"runtime":"gvisor"}`); sb.Node != "ga" || sb.Runtime != api.RuntimeGVisor {
			t.Fatalf("gvisor create: on %s with runtime %q, want ga and gvisor", sb.Node, sb.Runtime)
		}
	}
	resp, b := f.json("POST", "/v1/sandboxes:batch", `{"count":3,"template":{"image":"busybox","resources":{"cpu":0.1},"runtime":"gvisor"}}`)
	var batch api.BatchCreateResponse
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &batch) != nil || len(batch.Sandboxes) != 3 {
		t.Fatalf("batch: %d %s", resp.StatusCode, b)
	}
	for _, sb := range batch.Sandboxes {
		if sb.Node != "ga" || sb.Runtime != api.RuntimeGVisor {
			t.Fatalf("gang member on %s with runtime %q, want ga and gvisor", sb.Node, sb.Runtime)
		}
	}
	// runc, the default, goes anywhere, also to a node without runtimes.
	seen := map[string]bool{}
	for range 30 {
		seen[f.create(`{"image":"busybox","resources":{"cpu":0.01},"runtime":"runc"}`).Node] = true
	}
	if len(seen) != 3 {
		t.Errorf("runc creates went to %v, want every node", seen)
	}

	var list api.NodeList
	if resp, b := f.json("GET", "/v1/nodes", ""); resp.StatusCode != http.StatusOK || json.Unmarshal(b, &list) != nil {
		t.Fatalf("nodes: %d %s", resp.StatusCode, b)
	}
	for _, n := range list.Nodes {
		ok, why := n.RunsRuntime(api.BackendContainer, api.RuntimeGVisor)
		if want := n.ID == "ga"; ok != want || n.ID == "gb" && why != "runsc not found" {
			t.Errorf("node %s runs gvisor: %v (%q); want %v", n.ID, ok, why, want)
		}
	}

	for _, tt := range []struct{ body, msg string }{
		{`{"image":"busybox","runtime":"kata"}`, `runtime "kata"`},
		{`{"image":"busybox","runtime":"gvisor","network":{"mode":"open"}}`, "network must be none"},
		{`{"image":"busybox","runtime":"gvisor","backend":"microvm"}`, "backend microvm has no runtimes"},
	} {
		resp, b := f.json("POST", "/v1/sandboxes", tt.body)
		var e api.ErrorBody
		json.Unmarshal(b, &e)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error.Message, tt.msg) {
			t.Errorf("%s: %d %s, want 400 saying %q", tt.body, resp.StatusCode, b, tt.msg)
		}
	}

	f2 := newFleetWith(t, fleetOptions{node: func(id string, c *node.Config) {
		if id == "gb" {
			withRuntimes(t, "runsc not found")(c)
		}
	}}, "gb", "gc")
	resp, b = f2.json("POST", "/v1/sandboxes", `{"image":"busybox","runtime":"gvisor"}`)
	var e api.ErrorBody
	json.Unmarshal(b, &e)
	if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != api.CodeRuntimeUnavailable ||
		!strings.Contains(e.Error.Message, "2 without runtime gvisor (gb: runsc not found)") {
		t.Errorf("no node runs gvisor: %d %s, want 503 runtime_unavailable with gb's reason", resp.StatusCode, b)
	}
}
