package api

// Network policy modes (NetworkPolicy.Mode).
const (
	// NetworkNone is loopback only: no interface, no rules, no cost. The
	// default.
	NetworkNone = "none"
	// NetworkAllowlist lets out only what Allow names: domains (with *.
	// wildcards) through the node's DNS proxy, and addresses or CIDRs.
	NetworkAllowlist = "allowlist"
	// NetworkOpen lets out to the public internet; the always-denied
	// ranges (private, link-local, metadata, the platform itself, other
	// sandboxes) stay denied.
	NetworkOpen = "open"
)

// Limits of one policy's allowlist.
const (
	MaxAllowDomains = 256
	MaxAllowCIDRs   = 64
	// MaxAllowEntry bounds one entry: a 253-byte name, "*.", ":65535".
	MaxAllowEntry = 264
)

// NetworkPolicy is a sandbox's egress policy: in CreateSandboxRequest,
// in PATCH /v1/sandboxes/{id}/network and in Sandbox.Network.
//
// Allow entries are "pypi.org" (the name itself), "*.pythonhosted.org"
// (any name under it, not the name itself), "198.51.100.7",
// "198.51.100.0/24", each optionally with a port: "github.com:22",
// "198.51.100.0/24:443". Allow implies mode allowlist; a policy with mode
// allowlist and no entries lets nothing out (but still resolves nothing).
type NetworkPolicy struct {
	Mode  string   `json:"mode,omitempty"`
	Allow []string `json:"allow,omitempty"`
}

// Networked reports whether p gives a sandbox a network at all (mode
// allowlist or open, or allow entries without a mode).
func (p *NetworkPolicy) Networked() bool {
	if p == nil {
		return false
	}
	return p.Mode == NetworkAllowlist || p.Mode == NetworkOpen || p.Mode == "" && len(p.Allow) > 0
}

// SandboxNetwork is Sandbox.Network: the policy in force and what the
// node counted against it.
type SandboxNetwork struct {
	NetworkPolicy
	// Address is the sandbox's IPv4 address on its node (none for mode
	// none).
	Address string `json:"address,omitempty"`
	// DeniedConnections counts connections (and datagrams) the policy
	// refused, DeniedQueries the DNS queries it refused, since creation.
	DeniedConnections uint64 `json:"denied_connections"`
	DeniedQueries     uint64 `json:"denied_queries"`
}

// NetworkUpdate is the body of PATCH /v1/sandboxes/{id}/network. Mode and
// Allow, when given, replace the policy's; then Add and Remove edit its
// allowlist (Add on a sandbox with mode none switches it to allowlist).
// The answer is the sandbox's SandboxNetwork. The change applies within a
// second, also to connections already open that it no longer allows.
type NetworkUpdate struct {
	Mode   *string   `json:"mode,omitempty"`
	Allow  *[]string `json:"allow,omitempty"`
	Add    []string  `json:"add,omitempty"`
	Remove []string  `json:"remove,omitempty"`
}

// CodeNetworkUnavailable (503): the node cannot give sandboxes a network
// (no nftables, no veth, or networking turned off by its operator).
const CodeNetworkUnavailable = "network_unavailable"
