package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client/clienttest"
)

// TestCreatePlacementFlags: --node-selector (repeatable) and --pool reach
// the create request, single and gang alike.
func TestCreatePlacementFlags(t *testing.T) {
	var got []api.CreateSandboxRequest
	srv := newServer(t, clienttest.WithIntercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != "POST" || !strings.HasPrefix(r.URL.Path, "/v1/sandboxes") {
			return false
		}
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		var req api.CreateSandboxRequest
		if r.URL.Path == "/v1/sandboxes:batch" {
			var batch api.BatchCreateRequest
			json.Unmarshal(b, &batch)
			req = batch.Template
		} else {
			json.Unmarshal(b, &req)
		}
		got = append(got, req)
		return false
	}))
	mustCreate(t, srv, "--node-selector", "rack=r1", "--node-selector", "zone=a", "--pool", "cloud")
	if r := cli(t, srv, nil, "", "sandbox", "create", "--image", "busybox", "--count", "2", "--node-selector", "rack=r1", "--pool", "cloud"); r.code != 0 {
		t.Fatalf("gang create: exit %d, stderr %q", r.code, r.stderr)
	}
	if len(got) != 2 {
		t.Fatalf("saw %d creates, want 2", len(got))
	}
	if want := map[string]string{"rack": "r1", "zone": "a"}; !reflect.DeepEqual(got[0].NodeSelector, want) || got[0].Pool != api.PoolCloud {
		t.Errorf("create: node_selector %v pool %q, want %v cloud", got[0].NodeSelector, got[0].Pool, want)
	}
	if got[1].NodeSelector["rack"] != "r1" || got[1].Pool != api.PoolCloud {
		t.Errorf("gang template: node_selector %v pool %q, want rack=r1 cloud", got[1].NodeSelector, got[1].Pool)
	}
	if r := cli(t, srv, nil, "", "sandbox", "create", "--image", "busybox", "--node-selector", "rack"); r.code != 2 || !strings.Contains(r.stderr, "--node-selector") {
		t.Errorf("--node-selector rack: exit %d, stderr %q; want 2", r.code, r.stderr)
	}
}
