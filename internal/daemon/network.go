package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"

	"github.com/warrenhq/warren/internal/netpolicy/egress"
	"github.com/warrenhq/warren/internal/node"
)

// NetworkConfig is a node's sandbox network (`warren up` and `warren
// agent` flags).
type NetworkConfig struct {
	// Off gives sandboxes no network at all: creates asking for one get
	// network_unavailable.
	Off bool
	// Name and Pool tell this agent's network apart from other agents' on
	// the same host (egress.Config); defaults "0" and 10.213.0.0/16.
	Name string
	Pool string
	// DNSUpstream is the resolver the DNS proxy asks (host:port); default
	// the host's /etc/resolv.conf.
	DNSUpstream string
	// AllowPrivate are ranges of the always-denied set the operator lets
	// sandboxes reach (a package mirror on the LAN); Deny are public
	// addresses added to it.
	AllowPrivate []string
	Deny         []string
}

// startNetwork sets the node's network up. A host that cannot (no
// nftables, another agent on the same pool) gets a node without one and
// a problem line saying why, not a failed start: sandboxes without a
// network are most of the work.
func startNetwork(ctx context.Context, cfg NetworkConfig, stateDir string, platform []string, log *slog.Logger) (n node.Network, problem string, stop func()) {
	stop = func() {}
	if cfg.Off {
		return nil, "turned off (--no-network)", stop
	}
	ec := egress.Config{Name: cfg.Name, DNSUpstream: cfg.DNSUpstream, StateDir: stateDir, Log: log}
	if cfg.Pool != "" {
		p, err := netip.ParsePrefix(cfg.Pool)
		if err != nil {
			return nil, fmt.Sprintf("--network-pool %q: %v", cfg.Pool, err), stop
		}
		ec.Pool = p
	}
	var err error
	if ec.Fence.Exempt, err = prefixes(cfg.AllowPrivate); err != nil {
		return nil, "--allow-private: " + err.Error(), stop
	}
	if ec.Fence.Extra, err = prefixes(cfg.Deny); err != nil {
		return nil, "--deny: " + err.Error(), stop
	}
	// The platform's own addresses (apiservers, etcd) are never reachable
	// from a sandbox, even when public.
	ec.Fence.Extra = append(ec.Fence.Extra, platformPrefixes(ctx, platform)...)
	m, err := egress.New(ctx, ec)
	if err != nil {
		log.Warn("sandboxes get no network on this node", "err", err)
		return nil, err.Error(), stop
	}
	log.Info("sandbox network", "name", ec.Name, "pool", ec.Pool, "gateway", egress.Gateway)
	return m, "", func() { m.Close() }
}

func prefixes(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%q: want an IPv4 address or CIDR", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("%q: IPv4 only", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// platformPrefixes resolves the hosts of the platform's URLs or host:port
// addresses to /32s.
func platformPrefixes(ctx context.Context, addrs []string) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range addrs {
		host := a
		if u, err := url.Parse(a); err == nil && u.Host != "" {
			host = u.Hostname()
		} else if h, _, err := net.SplitHostPort(a); err == nil {
			host = h
		}
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
		if err != nil {
			continue
		}
		for _, ip := range ips {
			out = append(out, netip.PrefixFrom(ip.Unmap(), 32))
		}
	}
	return out
}

var _ node.Network = (*egress.Manager)(nil)
