package apiserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
)

// Cluster is the set of nodes the apiserver serves sandboxes from:
// SingleNode for the one in-process node of `warren up`, Router for a
// fleet of node agents reached over the node API. Handlers go through it
// for everything that is not about one sandbox already routed.
type Cluster interface {
	// Create chooses a node and creates the sandbox there.
	Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error)
	// Route returns the node that owns sandbox id, from the node id the
	// sandbox id carries. When that node is lost, the Node returned
	// answers Get with the sandbox in state "lost" and every other call
	// with ErrUnavailable (code sandbox_lost). ErrNotFound (code
	// sandbox_not_found) when no such node is known.
	Route(ctx context.Context, id string) (Node, error)
	// List returns the sandboxes of every node that match f, oldest
	// first.
	List(ctx context.Context, f node.Filter) ([]api.Sandbox, error)
	// Nodes returns every node, for GET /v1/nodes.
	Nodes(ctx context.Context) ([]api.Node, error)
}

// Node is one node as the calls on its sandboxes reach it. The apiserver
// itself needs only a sandbox's record (scope checks, idempotent replays)
// and its delete (quota, caches); every other call on a sandbox, whatever
// its verb, is forwarded as the caller made it: the node API's sandbox
// routes are REST v1's (internal/node/nodeapi), so a new verb needs no
// code here but its route rule (auth.go).
type Node interface {
	ID() string
	Get(ctx context.Context, id string) (api.Sandbox, error)
	Delete(ctx context.Context, id string) error
	// Forward sends r, a call on sandbox id (/v1/sandboxes/{id}/{verb}),
	// to the node and writes the node's answer to w. It returns an error
	// only while nothing has been written, for the caller to answer with;
	// once the answer has started, a failure is a *nodeapi.CutShort.
	Forward(w http.ResponseWriter, r *http.Request, id string) error
}

// LayerUser is what a Cluster may also do: say which layers its live
// sandboxes use, refusing (ErrUnavailable) when it cannot know for sure,
// so that a layer delete or a GC never frees a layer a sandbox on an
// unreachable node still holds. A Cluster without it answers with List.
type LayerUser interface {
	LiveLayers(ctx context.Context) (map[string][]string, error)
}

// SingleNode is the Cluster of one in-process node agent: creates go
// straight to it (it has the final say on admission anyway), calls on its
// sandboxes go to its node API handler in-process (no socket, the same
// code as across hosts), and a sandbox id that names another node is not
// found.
func SingleNode(a nodeapi.Agent, log *slog.Logger) Cluster {
	b := make([]byte, 32)
	rand.Read(b)
	secret := hex.EncodeToString(b)
	return single{a: a, h: nodeapi.NewServer(a, nodeapi.Secret(secret), log), auth: "Bearer " + secret}
}

type single struct {
	a    nodeapi.Agent
	h    http.Handler // a's node API
	auth string       // the header its node API takes
}

func (c single) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	return c.a.Create(ctx, req)
}

func (c single) Route(_ context.Context, id string) (Node, error) {
	nid, err := node.NodeOf(id)
	if err != nil || nid != c.a.ID() {
		return nil, errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "sandbox %s not found (no node %s)", id, nid)
	}
	return localNode{c}, nil
}

func (c single) List(ctx context.Context, f node.Filter) ([]api.Sandbox, error) {
	return c.a.List(ctx, f)
}

func (c single) Nodes(context.Context) ([]api.Node, error) {
	n := c.a.Status()
	if n.Pool == "" {
		n.Pool = api.PoolOnPrem
	}
	return []api.Node{n}, nil
}

// localNode is the in-process node as a Node.
type localNode struct{ single }

func (n localNode) ID() string { return n.a.ID() }
func (n localNode) Get(ctx context.Context, id string) (api.Sandbox, error) {
	return n.a.Get(ctx, id)
}
func (n localNode) Delete(ctx context.Context, id string) error { return n.a.Delete(ctx, id) }

// Forward serves r on the node API handler, which writes its own answer
// and errors.
func (n localNode) Forward(w http.ResponseWriter, r *http.Request, _ string) error {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", n.auth)
	n.h.ServeHTTP(w, r)
	return nil
}
