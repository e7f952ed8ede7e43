package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestNodeIdentityAgents runs agents registering through the apiserver and
// directly in etcd: a token bound to a node name registers that name (also
// when the agent names none) and refuses another; a second agent on the
// same bound token is refused while the first is alive; an agent that
// copies a live node's id (another data dir, so another node key) is
// refused whatever its token, and still once that node is gone; each
// refusal ends the agent with a stable code. Once the first agent is gone,
// its name is free again.
func TestNodeIdentityAgents(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs", "busybox")
	ctx := context.Background()
	c := startCluster(t, "")
	for _, viaEtcd := range []bool{false, true} {
		t.Run(fmt.Sprintf("etcd=%v", viaEtcd), func(t *testing.T) {
			name := fmt.Sprintf("rack2-node%v", viaEtcd)
			tok, err := c.admin.CreateToken(ctx, api.CreateTokenRequest{Project: "/", Role: api.RoleNode, Node: name})
			if err != nil {
				t.Fatal(err)
			}
			if tok.Token.Node != name {
				t.Fatalf("token %+v: want bound to %s", tok.Token, name)
			}
			short := func(cfg *AgentConfig) { cfg.RegistrationTTL = time.Second }
			dir := fmt.Sprintf("id-%v-", viaEtcd)

			first := c.mustAgent(dir+"first", tok.Secret, viaEtcd)
			if r := c.registration(first.id); r.Name != name || r.Owner == "" {
				t.Errorf("registration %+v: want name %s and an owner", r, name)
			}
			c.waitHealthy(first.id)
			nodes, _ := c.admin.ListNodes(ctx)
			for _, n := range nodes {
				if n.ID == first.id && n.Name != name {
					t.Errorf("node ls: %s named %q, want %s", n.ID, n.Name, name)
				}
			}

			refused := func(what string, err error, kind error, code string) {
				t.Helper()
				if !errors.Is(err, kind) || errdefs.Code(err) != code {
					t.Errorf("%s: %v (code %q), want %v with code %s", what, err, errdefs.Code(err), kind, code)
				}
			}
			_, err = c.startAgent(dir+"mismatch", tok.Secret, viaEtcd, func(cfg *AgentConfig) { cfg.NodeName = "rack3-node1" })
			refused("bound token, another --node-name", err, errdefs.ErrForbidden, api.CodeNodeNameMismatch)

			_, err = c.startAgent(dir+"second", tok.Secret, viaEtcd, short)
			refused("second agent on the bound token", err, errdefs.ErrConflict, api.CodeNodeNameTaken)

			// Another data dir holding the live node's id: another node
			// key, so no takeover, with any token.
			thief := filepath.Join(c.dir, dir+"thief")
			os.MkdirAll(thief, 0o700)
			os.WriteFile(filepath.Join(thief, "node-id"), []byte(first.id+"\n"), 0o600)
			other := c.mintNodeToken()
			_, err = c.startAgent(dir+"thief", other.Secret, viaEtcd, short)
			refused("another agent taking over a live node id", err, errdefs.ErrConflict, api.CodeNodeRegistered)
			if r := c.registration(first.id); r.Name != name || r.Address == "" {
				t.Errorf("the live node's registration after the attempts: %+v", r)
			}

			// Gone (its registration expires with its TTL): the name is free.
			if err := first.stop(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(4 * time.Second)
			if _, err := c.startAgent(dir+"second", tok.Secret, viaEtcd); err != nil {
				t.Errorf("second agent after the first left: %v", err)
			}
			// The gone node's id stays its own agent's: a newcomer holding
			// a copy of it does not get its sandboxes' calls.
			_, err = c.startAgent(dir+"thief", other.Secret, viaEtcd, short)
			refused("another agent taking over a gone node's id", err, errdefs.ErrForbidden, api.CodeNodeNotOwner)
		})
	}
}
