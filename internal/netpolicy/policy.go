// Package netpolicy is a sandbox's egress policy: parsing and checking
// what an allowlist lets out (policy.go), the ranges no policy reaches
// (denied.go), and the state the node keeps per networked sandbox, which
// its firewall, DNS proxy and Host/SNI proxy share (sandbox.go).
//
// Enforcement lives in the subpackages and never inside the sandbox:
// nft installs the per-sandbox nftables rules, dnsproxy answers only
// allowed names and teaches the firewall what they resolved to, hostproxy
// checks Host and SNI on ports 80 and 443, and egress wires them to the
// sandboxes' veths.
package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
)

// AnyPort in a rule means every port.
const AnyPort = 0

// Policy is a parsed, valid api.NetworkPolicy. Its zero value is none.
// A Policy never changes once made: a sandbox swaps the whole policy.
type Policy struct {
	mode  string
	names []NameRule
	nets  []NetRule
}

// NameRule lets out to a domain (and, with Wildcard, only to the names
// under it) on Port, or every port.
type NameRule struct {
	Name     string // lower case, no trailing dot
	Wildcard bool   // "*.Name": names under Name, not Name itself
	Port     uint16
}

// NetRule lets out to an IPv4 prefix on Port, or every port.
type NetRule struct {
	Prefix netip.Prefix
	Port   uint16
}

// None is the policy of a sandbox without a network.
var None = &Policy{mode: api.NetworkNone}

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalid, api.CodeInvalid, "network: "+format, args...)
}

// Parse checks p and returns its Policy. Allow entries without a mode make
// an allowlist; mode open or none with entries is an error, as are
// malformed, IPv6 and too many entries (api.MaxAllowDomains,
// api.MaxAllowCIDRs). Errors are ErrInvalid with CodeInvalid.
func Parse(p api.NetworkPolicy) (*Policy, error) {
	mode := p.Mode
	if mode == "" {
		mode = api.NetworkNone
		if len(p.Allow) > 0 {
			mode = api.NetworkAllowlist
		}
	}
	switch mode {
	case api.NetworkNone, api.NetworkOpen:
		if len(p.Allow) > 0 {
			return nil, invalid("mode %s takes no allow entries (they make an allowlist)", mode)
		}
		if mode == api.NetworkNone {
			return None, nil
		}
		return &Policy{mode: mode}, nil
	case api.NetworkAllowlist:
	default:
		return nil, invalid("unknown mode %q (want none, allowlist or open)", p.Mode)
	}
	pol := &Policy{mode: mode}
	for _, e := range p.Allow {
		if err := pol.add(e); err != nil {
			return nil, err
		}
	}
	if len(pol.names) > api.MaxAllowDomains {
		return nil, invalid("%d domains allowed, at most %d", len(pol.names), api.MaxAllowDomains)
	}
	if len(pol.nets) > api.MaxAllowCIDRs {
		return nil, invalid("%d addresses or CIDRs allowed, at most %d", len(pol.nets), api.MaxAllowCIDRs)
	}
	return pol, nil
}

func (p *Policy) add(entry string) error {
	if len(entry) > api.MaxAllowEntry {
		return invalid("allow entry of %d bytes is too long", len(entry))
	}
	host, port, err := splitPort(entry)
	if err != nil {
		return err
	}
	if strings.Contains(host, "/") {
		pfx, err := netip.ParsePrefix(host)
		if err != nil {
			return invalid("allow %q: bad CIDR", entry)
		}
		if !pfx.Addr().Is4() {
			return invalid("allow %q: IPv6 egress is not supported", entry)
		}
		r := NetRule{Prefix: pfx.Masked(), Port: port}
		if !slices.Contains(p.nets, r) {
			p.nets = append(p.nets, r)
		}
		return nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Is4() {
			return invalid("allow %q: IPv6 egress is not supported", entry)
		}
		r := NetRule{Prefix: netip.PrefixFrom(a, 32), Port: port}
		if !slices.Contains(p.nets, r) {
			p.nets = append(p.nets, r)
		}
		return nil
	}
	r, err := parseName(host)
	if err != nil {
		return invalid("allow %q: %v", entry, err)
	}
	r.Port = port
	if !slices.Contains(p.names, r) {
		p.names = append(p.names, r)
	}
	return nil
}

// splitPort splits "host:port"; a host without a port gets AnyPort.
// IPv6 literals are refused by the caller, so a colon always means a port.
func splitPort(entry string) (string, uint16, error) {
	i := strings.LastIndexByte(entry, ':')
	if i < 0 {
		return entry, AnyPort, nil
	}
	if strings.Count(entry, ":") > 1 {
		return "", 0, invalid("allow %q: IPv6 egress is not supported", entry)
	}
	n, err := strconv.ParseUint(entry[i+1:], 10, 16)
	if err != nil || n == 0 {
		return "", 0, invalid("allow %q: port must be 1-65535", entry)
	}
	return entry[:i], uint16(n), nil
}

// parseName checks a domain or "*."-wildcard domain: LDH labels (and "_",
// which real names use), at most 63 bytes each, 253 in all, at least two
// labels, and for a wildcard at least two labels under the "*." (no
// "*.com").
func parseName(s string) (NameRule, error) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	var r NameRule
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		r.Wildcard, s = true, rest
	}
	if s == "" {
		return r, fmt.Errorf("empty name")
	}
	if len(s) > 253 {
		return r, fmt.Errorf("name longer than 253 bytes")
	}
	labels := strings.Split(s, ".")
	if len(labels) < 2 {
		return r, fmt.Errorf("a domain has at least two labels")
	}
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return r, err
		}
	}
	if _, err := strconv.Atoi(labels[len(labels)-1]); err == nil {
		return r, fmt.Errorf("not a domain and not an IPv4 address")
	}
	r.Name = s
	return r, nil
}

func checkLabel(l string) error {
	if l == "" || len(l) > 63 {
		return fmt.Errorf("label %q must be 1-63 bytes", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' && i > 0 && i < len(l)-1
		if !ok {
			return fmt.Errorf("label %q: only letters, digits, '-' and '_'", l)
		}
	}
	return nil
}

// Mode is none, allowlist or open.
func (p *Policy) Mode() string {
	if p == nil || p.mode == "" {
		return api.NetworkNone
	}
	return p.mode
}

// Networked reports whether the sandbox gets an interface at all.
func (p *Policy) Networked() bool { return p.Mode() != api.NetworkNone }

// Names and Nets are the allowlist's rules, in the order given.
func (p *Policy) Names() []NameRule {
	if p == nil {
		return nil
	}
	return slices.Clone(p.names)
}

func (p *Policy) Nets() []NetRule {
	if p == nil {
		return nil
	}
	return slices.Clone(p.nets)
}

// API is the policy in its canonical wire form.
func (p *Policy) API() api.NetworkPolicy {
	out := api.NetworkPolicy{Mode: p.Mode()}
	if p == nil {
		return out
	}
	for _, r := range p.names {
		out.Allow = append(out.Allow, r.String())
	}
	for _, r := range p.nets {
		out.Allow = append(out.Allow, r.String())
	}
	return out
}

func (r NameRule) String() string {
	s := r.Name
	if r.Wildcard {
		s = "*." + s
	}
	return withPort(s, r.Port)
}

func (r NetRule) String() string {
	s := r.Prefix.String()
	if r.Prefix.IsSingleIP() {
		s = r.Prefix.Addr().String()
	}
	return withPort(s, r.Port)
}

func withPort(s string, port uint16) string {
	if port == AnyPort {
		return s
	}
	return s + ":" + strconv.Itoa(int(port))
}

// Match reports whether name (case-insensitive, trailing dot allowed) is
// one the rule covers.
func (r NameRule) Match(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if r.Wildcard {
		return len(name) > len(r.Name)+1 && strings.HasSuffix(name, r.Name) && name[len(name)-len(r.Name)-1] == '.'
	}
	return name == r.Name
}

// NamePorts says whether the policy resolves name, and to which ports
// then: any (true) or only those listed. A DoH name (IsDoHName) counts
// only with rules that name that exact host: open and wildcards never
// resolve one.
func (p *Policy) NamePorts(name string) (ok, anyPort bool, ports []uint16) {
	doh := IsDoHName(name)
	switch p.Mode() {
	case api.NetworkOpen:
		return !doh, !doh, nil
	case api.NetworkNone:
		return false, false, nil
	}
	for _, r := range p.names {
		if !r.Match(name) || doh && r.Wildcard {
			continue
		}
		ok = true
		if r.Port == AnyPort {
			anyPort = true
		} else if !slices.Contains(ports, r.Port) {
			ports = append(ports, r.Port)
		}
	}
	if anyPort {
		ports = nil
	}
	return ok, anyPort, ports
}

// AllowsName reports whether the policy lets name out on port.
func (p *Policy) AllowsName(name string, port uint16) bool {
	ok, anyPort, ports := p.NamePorts(name)
	return ok && (anyPort || slices.Contains(ports, port))
}

// AllowsAddr reports whether the policy lets addr:port out by address
// alone (an open policy, or an address or CIDR rule), never for an
// address the fence denies.
func (p *Policy) AllowsAddr(f *Fence, addr netip.Addr, port uint16) bool {
	addr = addr.Unmap()
	if f.Denies(addr) {
		return false
	}
	switch p.Mode() {
	case api.NetworkOpen:
		return true
	case api.NetworkNone:
		return false
	}
	for _, r := range p.nets {
		if r.Prefix.Contains(addr) && (r.Port == AnyPort || r.Port == port) {
			return true
		}
	}
	return false
}

// Update applies a PATCH to the policy cur and returns the new policy.
func Update(cur *Policy, u api.NetworkUpdate) (*Policy, error) {
	next := cur.API()
	if u.Mode != nil {
		next.Mode = *u.Mode
		if u.Allow == nil && *u.Mode != api.NetworkAllowlist {
			next.Allow = nil
		}
	}
	if u.Allow != nil {
		next.Allow = slices.Clone(*u.Allow)
		if u.Mode == nil {
			next.Mode = api.NetworkAllowlist
		}
	}
	if len(u.Add) > 0 {
		if next.Mode == api.NetworkNone {
			next.Mode = api.NetworkAllowlist
		}
		next.Allow = append(next.Allow, u.Add...)
	}
	if len(u.Remove) > 0 {
		// Compare canonical forms, so "PyPI.org." removes "pypi.org".
		drop := map[string]bool{}
		for _, e := range u.Remove {
			one, err := Parse(api.NetworkPolicy{Allow: []string{e}})
			if err != nil {
				return nil, err
			}
			drop[one.API().Allow[0]] = true
		}
		canon, err := Parse(next)
		if err != nil {
			return nil, err
		}
		next = canon.API()
		next.Allow = slices.DeleteFunc(next.Allow, func(e string) bool { return drop[e] })
		if next.Mode == api.NetworkNone {
			next.Allow = nil
		}
	}
	return Parse(next)
}
