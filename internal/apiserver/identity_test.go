package apiserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/store"
)

// keyed adds a node key to each call, as an agent does.
type keyed struct{ key string }

func (k keyed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if k.key != "" {
		r.Header.Set(fleet.NodeKeyHeader, k.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestNodeIdentity: through the apiserver, a token bound to a node name
// registers that name only (and fills it in when the agent names none); a
// second agent on the same bound token is refused while the first's
// registration is alive; and no agent, whatever its token, replaces,
// renews, revokes or removes another's live registration. The agent that
// holds the node key (a restart) takes its own back at once.
func TestNodeIdentity(t *testing.T) {
	ctx := context.Background()
	st := store.Memory().(store.Watcher)
	m := iam.New(st, iam.Options{})
	if _, err := m.EnsureAdmin(ctx, adminSecret); err != nil {
		t.Fatal(err)
	}
	mint := func(node string) string {
		_, secret, err := m.CreateToken(ctx, iam.SystemPrincipal(), iam.TokenSpec{Role: iam.RoleNode, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		return secret
	}
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Cluster: emptyCluster{}, Tokens: m, IAM: m, Registrations: st, Log: quietLog,
	}))
	t.Cleanup(srv.Close)
	agent := func(token, key string) *nodeapi.Registrations {
		return nodeapi.NewRegistrations([]string{srv.URL}, token, &http.Client{Transport: keyed{key}})
	}
	reg := func(r *nodeapi.Registrations, id, name string) (store.LeaseID, error) {
		v, _ := json.Marshal(fleet.Registration{Node: api.Node{ID: id, Name: name, Address: "127.0.0.1:1"}, Secret: "s-" + id})
		return r.PutWithLease(ctx, fleet.Key(id), v, 5*time.Second)
	}
	stored := func(id string) fleet.Registration {
		kv, err := st.Get(ctx, fleet.Key(id))
		if err != nil {
			t.Fatal(err)
		}
		var r fleet.Registration
		json.Unmarshal(kv.Value, &r)
		return r
	}
	wantCode := func(what string, err error, kind error, code string) {
		t.Helper()
		if !errors.Is(err, kind) || errdefs.Code(err) != code {
			t.Errorf("%s: %v (code %q), want %v with code %s", what, err, errdefs.Code(err), kind, code)
		}
	}

	bound := mint("rack2-node7")
	first := agent(bound, "key-of-the-first-agent")
	lease, err := reg(first, "n1", "")
	if err != nil {
		t.Fatalf("bound token, no name: %v", err)
	}
	if r := stored("n1"); r.Name != "rack2-node7" || r.Owner == "" || r.Lease != int64(lease) {
		t.Errorf("registration %+v: want the bound name, an owner and its lease", r)
	}
	_, err = reg(agent(bound, "key-of-the-first-agent"), "n1", "rack3-node1")
	wantCode("bound token, another name", err, errdefs.ErrForbidden, api.CodeNodeNameMismatch)

	// A second agent (another node key, another node id) on the same
	// bound token: its name is taken while the first is alive.
	second := agent(bound, "key-of-the-second-agent")
	_, err = reg(second, "n2", "")
	wantCode("second agent on a bound token", err, errdefs.ErrConflict, api.CodeNodeNameTaken)

	// Any other token, bound or not, with or without a node key: no
	// takeover of n1's live registration.
	for name, r := range map[string]*nodeapi.Registrations{
		"unbound token":      agent(mint(""), "key-of-a-thief-0123456"),
		"unbound, no key":    agent(mint(""), ""),
		"other bound token":  agent(mint("rack9"), "key-of-a-thief-0123456"),
		"same token, no key": agent(bound, ""),
	} {
		_, err := reg(r, "n1", "")
		wantCode(name+": register over n1", err, errdefs.ErrConflict, api.CodeNodeRegistered)
		wantCode(name+": renew n1's lease", r.KeepAlive(ctx, lease), errdefs.ErrForbidden, api.CodeNodeNotOwner)
		wantCode(name+": revoke n1's lease", r.Revoke(ctx, lease), errdefs.ErrForbidden, api.CodeNodeNotOwner)
		wantCode(name+": remove n1", r.Delete(ctx, fleet.Key("n1")), errdefs.ErrForbidden, api.CodeNodeNotOwner)
	}
	if r := stored("n1"); r.Secret != "s-n1" || r.Lease != int64(lease) {
		t.Fatalf("n1's registration changed: %+v", r)
	}
	if err := first.KeepAlive(ctx, lease); err != nil {
		t.Errorf("the owner renews: %v", err)
	}
	// The owner restarting (same node key) takes it back at once.
	again, err := reg(agent(bound, "key-of-the-first-agent"), "n1", "rack2-node7")
	if err != nil || again == lease {
		t.Fatalf("the owner registering again: lease %d, %v", again, err)
	}
	if err := first.Delete(ctx, fleet.Key("n1")); err != nil {
		t.Fatalf("the owner removes its registration: %v", err)
	}
	for _, k := range []string{fleet.Key("n1"), fleet.NameKey("rack2-node7"), fleet.LeaseKey(again)} {
		if _, err := st.Get(ctx, k); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s after the owner removed n1: %v, want gone", k, err)
		}
	}
	// Once the first is gone, the second may take the name; but n1 stays
	// the first agent's: no newcomer registers as a node that died.
	if _, err := reg(second, "n2", ""); err != nil {
		t.Errorf("second agent after the first left: %v", err)
	}
	_, err = reg(agent(mint(""), "key-of-a-thief-0123456"), "n1", "")
	wantCode("a newcomer registering a gone node's id", err, errdefs.ErrForbidden, api.CodeNodeNotOwner)
	if _, err := reg(first, "n1", "rack2-node7-again"); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("the bound token under another name: %v, want ErrForbidden", err)
	}
	if _, err := reg(agent(mint(""), "key-of-the-first-agent"), "n1", ""); err != nil {
		t.Errorf("n1's own agent (its node key) with another token: %v", err)
	}
	if _, _, err := m.CreateToken(ctx, iam.SystemPrincipal(), iam.TokenSpec{Role: iam.RoleRunner, Node: "x"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a runner token bound to a node: %v, want ErrInvalid", err)
	}
	if _, _, err := m.CreateToken(ctx, iam.SystemPrincipal(), iam.TokenSpec{Role: iam.RoleNode, Node: "Bad_Name"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a malformed node name: %v, want ErrInvalid", err)
	}
}
