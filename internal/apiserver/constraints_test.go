package apiserver_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/node"
)

// TestPlacementConstraints: node_selector and pool reach placement through
// the router, single creates and gang templates alike, and a create no
// node matches is a 503 naming the constraint.
func TestPlacementConstraints(t *testing.T) {
	labels := map[string]map[string]string{"na": nil, "nb": {"rack": "r2"}, "nc": {"rack": "r1", "zone": "z"}, "nd": {"rack": "r1"}}
	f := newFleetWith(t, fleetOptions{node: func(id string, c *node.Config) {
		c.Labels = labels[id]
		if id == "nd" {
			c.Pool = api.PoolCloud
		}
	}}, "na", "nb", "nc", "nd")

	for range 6 {
		if sb := f.create(`{"image":"busybox","resources":{"cpu":0.1},"node_selector":{"rack":"r1"}}`); sb.Node != "nc" {
			t.Fatalf("node_selector rack=r1: placed on %s, want nc (nd matches too but is in the cloud pool)", sb.Node)
		}
		if sb := f.create(`{"image":"busybox","resources":{"cpu":0.1},"pool":"cloud"}`); sb.Node != "nd" {
			t.Fatalf("pool cloud: placed on %s, want nd", sb.Node)
		}
	}
	resp, b := f.json("POST", "/v1/sandboxes:batch", `{"count":3,"template":{"image":"busybox","resources":{"cpu":0.1},"node_selector":{"rack":"r1"},"pool":"cloud"}}`)
	var batch api.BatchCreateResponse
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &batch) != nil || len(batch.Sandboxes) != 3 {
		t.Fatalf("batch: %d %s", resp.StatusCode, b)
	}
	for _, sb := range batch.Sandboxes {
		if sb.Node != "nd" {
			t.Fatalf("batch member on %s, want nd", sb.Node)
		}
	}

	for _, tt := range []struct {
		body string
		msg  []string
	}{
		{`{"image":"busybox","node_selector":{"rack":"r9"}}`,
			[]string{"no node matches node_selector rack=r9", "3 nodes", "1 lack label rack", "1 has rack=r1", "1 has rack=r2"}},
		{`{"image":"busybox","node_selector":{"zone":"z"},"pool":"cloud"}`,
			[]string{"no node in pool cloud matches node_selector zone=z", "1 lack label zone"}},
	} {
		resp, b := f.json("POST", "/v1/sandboxes", tt.body)
		var e api.ErrorBody
		json.Unmarshal(b, &e)
		if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != api.CodeNoMatchingNode {
			t.Errorf("%s: got %d %s, want 503 %s", tt.body, resp.StatusCode, b, api.CodeNoMatchingNode)
			continue
		}
		for _, m := range tt.msg {
			if !strings.Contains(e.Error.Message, m) {
				t.Errorf("%s: message %q lacks %q", tt.body, e.Error.Message, m)
			}
		}
	}
}

// TestSingleNodeConstraints: the in-process node of warren up refuses a
// create whose pool or node_selector it does not match (503), and takes
// one it does.
func TestSingleNodeConstraints(t *testing.T) {
	h := newHarness(t, func(c *node.Config) { c.Labels = map[string]string{"rack": "r1"} })
	h.create(`{"image":"busybox","node_selector":{"rack":"r1"},"pool":"onprem"}`)
	for _, tt := range []struct{ body, msg string }{
		{`{"image":"busybox","node_selector":{"rack":"r2"}}`, "no node matches node_selector rack=r2 (node "},
		{`{"image":"busybox","node_selector":{"gpu":"yes"}}`, "lacks label gpu"},
		{`{"image":"busybox","pool":"cloud"}`, "no node matches pool cloud"},
	} {
		resp, b := h.json("POST", "/v1/sandboxes", tt.body)
		var e api.ErrorBody
		json.Unmarshal(b, &e)
		if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != api.CodeNoMatchingNode || !strings.Contains(e.Error.Message, tt.msg) {
			t.Errorf("%s: got %d %s, want 503 %s with %q", tt.body, resp.StatusCode, b, api.CodeNoMatchingNode, tt.msg)
		}
	}
}
