package apiserver_test

import (
	"context"
	"encoding/json"
	"errors"
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

// TestRegisterThroughAPIServer: an agent registers through an apiserver
// with any node-role token, and its node secret lands in the registration
// (etcd) and in no answer of the API. Other roles, revoked tokens and
// registrations without a secret are refused.
func TestRegisterThroughAPIServer(t *testing.T) {
	ctx := context.Background()
	st := store.Memory().(store.Watcher)
	m := iam.New(st, iam.Options{})
	if _, err := m.EnsureAdmin(ctx, adminSecret); err != nil {
		t.Fatal(err)
	}
	mint := func(role iam.Role) (string, string) {
		tok, secret, err := m.CreateToken(ctx, iam.SystemPrincipal(), iam.TokenSpec{Role: role})
		if err != nil {
			t.Fatal(err)
		}
		return tok.ID, secret
	}
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Cluster:       emptyCluster{},
		Tokens:        m,
		IAM:           m,
		Registrations: st,
		Log:           quietLog,
	}))
	t.Cleanup(srv.Close)
	reg := func(token string, r fleet.Registration) error {
		v, _ := json.Marshal(r)
		_, err := nodeapi.NewRegistrations([]string{srv.URL}, token, nil).PutWithLease(ctx, fleet.Key(r.ID), v, 5*time.Second)
		return err
	}
	a := fleet.Registration{Node: api.Node{ID: "a1", Address: "10.0.0.1:7444"}, Secret: "secret-of-a1"}

	nodeID, nodeTok := mint(iam.RoleNode)
	if err := reg(nodeTok, a); err != nil {
		t.Fatalf("register with a node token: %v", err)
	}
	kv, err := st.Get(ctx, fleet.Key("a1"))
	if err != nil {
		t.Fatal(err)
	}
	var got fleet.Registration
	if err := json.Unmarshal(kv.Value, &got); err != nil || got.Secret != a.Secret || got.Address != a.Address || got.Pool != api.PoolOnPrem {
		t.Errorf("stored registration %s: %+v, %v", kv.Value, got, err)
	}

	noSecret := a
	noSecret.Secret = ""
	if err := reg(nodeTok, noSecret); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("registration without a node secret: %v, want ErrInvalid", err)
	}
	_, runner := mint(iam.RoleRunner)
	for name, tok := range map[string]string{"admin": adminSecret, "runner": runner} {
		if err := reg(tok, a); !errors.Is(err, errdefs.ErrForbidden) {
			t.Errorf("register with an %s token: %v, want ErrForbidden", name, err)
		}
	}
	if err := m.RevokeToken(ctx, iam.SystemPrincipal(), nodeID); err != nil {
		t.Fatal(err)
	}
	if err := reg(nodeTok, a); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("register with a revoked node token: %v, want ErrUnauthenticated", err)
	}
}

// emptyCluster is a Cluster with no node and no sandbox.
type emptyCluster struct{ apiserver.Cluster }

func (emptyCluster) Nodes(context.Context) ([]api.Node, error) { return nil, nil }
