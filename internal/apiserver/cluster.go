package apiserver

import (
	"context"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/node"
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

// LayerUser is what a Cluster may also do: say which layers its live
// sandboxes use, refusing (ErrUnavailable) when it cannot know for sure,
// so that a layer delete or a GC never frees a layer a sandbox on an
// unreachable node still holds. A Cluster without it answers with List.
type LayerUser interface {
	LiveLayers(ctx context.Context) (map[string][]string, error)
}

// StatusNode is a node that reports its own status in-process;
// *node.Agent is one.
type StatusNode interface {
	Node
	Status() api.Node
}

// SingleNode is the Cluster of one in-process node: creates go straight
// to it (it has the final say on admission anyway), and a sandbox id that
// names another node is not found.
func SingleNode(n StatusNode) Cluster { return single{n} }

type single struct{ n StatusNode }

func (c single) Create(ctx context.Context, req api.CreateSandboxRequest) (api.Sandbox, error) {
	return c.n.Create(ctx, req)
}

func (c single) Route(_ context.Context, id string) (Node, error) {
	nid, err := node.NodeOf(id)
	if err != nil || nid != c.n.ID() {
		return nil, errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "sandbox %s not found (no node %s)", id, nid)
	}
	return c.n, nil
}

func (c single) List(ctx context.Context, f node.Filter) ([]api.Sandbox, error) {
	return c.n.List(ctx, f)
}

func (c single) Nodes(context.Context) ([]api.Node, error) {
	n := c.n.Status()
	if n.Pool == "" {
		n.Pool = api.PoolOnPrem
	}
	return []api.Node{n}, nil
}
