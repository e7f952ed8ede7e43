package node

import (
	"context"
	"net/netip"
	"os"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/netpolicy"
)

// Network is the node's sandbox network; *egress.Manager implements it.
// A sandbox with policy none is never given to it.
type Network interface {
	// Attach gives sandbox id (its network namespace is ns) an interface
	// and policy p, at address want if free; it returns the address.
	Attach(ctx context.Context, id string, ns *os.File, p *netpolicy.Policy, want netip.Addr) (netip.Addr, error)
	// Adopt takes over a sandbox an earlier agent process attached,
	// re-attaching through ns if its interface is gone.
	Adopt(ctx context.Context, id string, ns func() (*os.File, error), p *netpolicy.Policy, addr netip.Addr) (netip.Addr, error)
	// Update changes an attached sandbox's policy.
	Update(id string, p *netpolicy.Policy) error
	// Detach takes the interface away; unknown ids are not an error.
	Detach(id string) error
	// Status is the sandbox's address and what its policy refused.
	Status(id string) (addr netip.Addr, deniedConns, deniedQueries uint64)
	// Sweep removes interfaces no attached sandbox holds.
	Sweep() error
	// DNS is the sandboxes' nameserver.
	DNS() string
}

// checkNetwork parses a create's policy (nil: none) and checks this node
// can give it: ErrInvalid for a bad policy, ErrUnavailable with
// CodeNetworkUnavailable on a node without a network.
func (a *Agent) checkNetwork(req *api.CreateSandboxRequest) (*netpolicy.Policy, error) {
	if req.Network == nil {
		return netpolicy.None, nil
	}
	p, err := netpolicy.Parse(*req.Network)
	if err != nil {
		return nil, err
	}
	if p.Networked() && a.cfg.Network == nil {
		return nil, a.noNetwork()
	}
	return p, nil
}

func (a *Agent) noNetwork() error {
	why := a.cfg.NetworkProblem
	if why == "" {
		why = "networking is off on this node"
	}
	return errdefs.New(errdefs.ErrUnavailable, api.CodeNetworkUnavailable, "node %s gives sandboxes no network: %s", a.cfg.ID, why)
}

// attach gives a running sandbox its network.
func (a *Agent) attach(ctx context.Context, nb backend.NetNSer, id string, p *netpolicy.Policy, want netip.Addr) (*api.SandboxNetwork, error) {
	ns, err := nb.NetNS(ctx, id)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	addr, err := a.cfg.Network.Attach(ctx, id, ns, p, want)
	if err != nil {
		return nil, err
	}
	return &api.SandboxNetwork{NetworkPolicy: p.API(), Address: addr.String()}, nil
}

// adoptNetwork gives a re-adopted sandbox its network back: its veth
// outlived the agent; the firewall's rules did not.
func (a *Agent) adoptNetwork(ctx context.Context, b backend.Backend, v *api.Sandbox) {
	p := policyOf(*v)
	if !p.Networked() {
		return
	}
	nb, ok := b.(backend.NetNSer)
	if a.cfg.Network == nil || !ok {
		a.log.Error("re-adopted sandbox lost its network: this node has none now", "sandbox", v.ID)
		return
	}
	want, _ := netip.ParseAddr(v.Network.Address)
	addr, err := a.cfg.Network.Adopt(ctx, v.ID, func() (*os.File, error) { return nb.NetNS(ctx, v.ID) }, p, want)
	if err != nil {
		a.log.Error("re-adopted sandbox lost its network", "sandbox", v.ID, "err", err)
		return
	}
	v.Network.Address = addr.String()
}

// policyOf is the parsed policy of a sandbox view (none without one).
func policyOf(v api.Sandbox) *netpolicy.Policy {
	if v.Network == nil {
		return netpolicy.None
	}
	p, err := netpolicy.Parse(v.Network.NetworkPolicy)
	if err != nil {
		return netpolicy.None
	}
	return p
}

// UpdateNetwork changes a running sandbox's policy: from none it gets an
// interface, to none it loses it, between networked policies the rules
// change in one transaction. The answer is the policy now in force.
func (a *Agent) UpdateNetwork(ctx context.Context, id string, u api.NetworkUpdate) (api.SandboxNetwork, error) {
	b, s, done, err := call[backend.Backend](ctx, a, id, "network")
	if err != nil {
		return api.SandboxNetwork{}, err
	}
	s.netMu.Lock()
	defer s.netMu.Unlock()
	cur := policyOf(s.snapshot())
	next, err := netpolicy.Update(cur, u)
	if err == nil && next.Networked() {
		err = s.ownNetwork("network") // runtime.go
	}
	if err == nil && next.Networked() && a.cfg.Network == nil {
		err = a.noNetwork()
	}
	if err != nil {
		return api.SandboxNetwork{}, done(err)
	}
	var view *api.SandboxNetwork
	switch {
	case !next.Networked():
		if a.cfg.Network != nil {
			err = a.cfg.Network.Detach(id)
		}
	case cur.Networked():
		err = a.cfg.Network.Update(id, next)
		view = &api.SandboxNetwork{NetworkPolicy: next.API(), Address: s.snapshot().Network.Address}
	default:
		nb, ok := b.(backend.NetNSer)
		if !ok {
			err = errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported, "backend %s gives sandboxes no network", b.Name())
			break
		}
		view, err = a.attach(ctx, nb, id, next, netip.Addr{})
	}
	if err != nil {
		return api.SandboxNetwork{}, done(err)
	}
	s.mu.Lock()
	s.view.Network = view
	s.changed()
	s.mu.Unlock()
	a.persist(s)
	if err := done(nil); err != nil {
		return api.SandboxNetwork{}, err
	}
	return a.networkStatus(s.snapshot()), nil
}

// networkStatus fills a view's counters in (none: mode none).
func (a *Agent) networkStatus(v api.Sandbox) api.SandboxNetwork {
	if v.Network == nil {
		return api.SandboxNetwork{NetworkPolicy: api.NetworkPolicy{Mode: api.NetworkNone}}
	}
	n := *v.Network
	if a.cfg.Network != nil {
		_, n.DeniedConnections, n.DeniedQueries = a.cfg.Network.Status(v.ID)
	}
	return n
}
