package netpolicy

import (
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Learned addresses: a name's answer lets its addresses out for the
// answer's TTL, but never less than MinLearnTTL (clients connect a moment
// after they resolve, and many cache answers past a short TTL) and never
// more than MaxLearnTTL. A sandbox keeps at most MaxLearned addresses; past
// that, the ones that expire soonest go first.
const (
	MinLearnTTL = time.Minute
	MaxLearnTTL = 24 * time.Hour
	MaxLearned  = 4096
)

// Firewall is what a Sandbox tells the kernel about: egress implements it
// with the sandbox's nftables sets. Calls come from the DNS proxy's
// goroutines and must not block for long.
type Firewall interface {
	// Learn lets the sandbox reach addr on every port (anyPort) or on
	// ports, until ttl has passed.
	Learn(sb *Sandbox, addr netip.Addr, anyPort bool, ports []uint16, ttl time.Duration)
}

// Sandbox is one networked sandbox's egress state on its node: its
// address, its policy, the addresses its allowed names resolved to, the
// connections the Host/SNI proxy holds for it, and its denial counters.
// It is safe for concurrent use.
type Sandbox struct {
	ID    string
	Addr  netip.Addr // the sandbox's own address: proxies know it by it
	fence *Fence
	fw    Firewall

	mu      sync.Mutex
	policy  *Policy
	learned map[netip.Addr]*learned
	conns   map[*tracked]struct{}

	deniedConns   atomic.Uint64
	deniedQueries atomic.Uint64
}

type learned struct {
	names   map[string]time.Time // names that resolved to the address, until when
	expires time.Time            // the latest of names'
}

type tracked struct {
	c    io.Closer
	name string
	dst  netip.AddrPort
}

// NewSandbox makes the state of sandbox id at addr under policy p. fence
// and fw may be nil (the default fence; no kernel to tell).
func NewSandbox(id string, addr netip.Addr, p *Policy, fence *Fence, fw Firewall) *Sandbox {
	if p == nil {
		p = None
	}
	return &Sandbox{ID: id, Addr: addr, fence: fence, fw: fw, policy: p,
		learned: map[netip.Addr]*learned{}, conns: map[*tracked]struct{}{}}
}

// Policy is the policy in force.
func (s *Sandbox) Policy() *Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy
}

// Fence is the node's always-denied set the sandbox is checked against.
func (s *Sandbox) Fence() *Fence { return s.fence }

// SetPolicy puts p in force: names it no longer allows are forgotten
// (their addresses with them, unless another allowed name resolved to the
// same one) and the proxied connections it no longer allows are closed.
// The caller rebuilds the kernel's sets from Learned afterwards.
func (s *Sandbox) SetPolicy(p *Policy) {
	if p == nil {
		p = None
	}
	s.mu.Lock()
	s.policy = p
	for addr, l := range s.learned {
		for name := range l.names {
			if ok, _, _ := p.NamePorts(name); !ok {
				delete(l.names, name)
			}
		}
		if len(l.names) == 0 {
			delete(s.learned, addr)
			continue
		}
		l.expires = time.Time{}
		for _, t := range l.names {
			if t.After(l.expires) {
				l.expires = t
			}
		}
	}
	var doomed []io.Closer
	for t := range s.conns {
		if !s.allowsConnLocked(t.name, t.dst, time.Now()) {
			doomed = append(doomed, t.c)
			delete(s.conns, t)
		}
	}
	s.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

// Learn records that name resolved to addr for ttl, if the policy
// resolves name and the fence allows addr, and tells the firewall. It
// reports whether it did: the DNS proxy strips the answers it did not.
func (s *Sandbox) Learn(name string, addr netip.Addr, ttl time.Duration) bool {
	addr = addr.Unmap()
	if s.fence.Denies(addr) {
		return false
	}
	ttl = min(max(ttl, MinLearnTTL), MaxLearnTTL)
	name = canonName(name)
	now := time.Now()
	s.mu.Lock()
	ok, anyPort, ports := s.policy.NamePorts(name)
	if !ok {
		s.mu.Unlock()
		return false
	}
	l := s.learned[addr]
	if l == nil {
		if len(s.learned) >= MaxLearned {
			s.evictLocked(now)
		}
		l = &learned{names: map[string]time.Time{}}
		s.learned[addr] = l
	}
	until := now.Add(ttl)
	if until.After(l.names[name]) {
		l.names[name] = until
	}
	if until.After(l.expires) {
		l.expires = until
	}
	anyPort, ports = s.portsLocked(l, now)
	ttl = l.expires.Sub(now)
	s.mu.Unlock()
	if s.fw != nil {
		s.fw.Learn(s, addr, anyPort, ports, ttl)
	}
	return true
}

// evictLocked drops expired addresses, or else the one that expires
// soonest.
func (s *Sandbox) evictLocked(now time.Time) {
	var first netip.Addr
	var firstT time.Time
	for a, l := range s.learned {
		if !l.expires.After(now) {
			delete(s.learned, a)
			continue
		}
		if firstT.IsZero() || l.expires.Before(firstT) {
			first, firstT = a, l.expires
		}
	}
	if len(s.learned) >= MaxLearned {
		delete(s.learned, first)
	}
}

// portsLocked is the union of the ports the live names of l allow.
func (s *Sandbox) portsLocked(l *learned, now time.Time) (anyPort bool, ports []uint16) {
	for name, t := range l.names {
		if !t.After(now) {
			continue
		}
		ok, a, ps := s.policy.NamePorts(name)
		if !ok {
			continue
		}
		if a {
			return true, nil
		}
		for _, p := range ps {
			if !slices.Contains(ports, p) {
				ports = append(ports, p)
			}
		}
	}
	slices.Sort(ports)
	return false, ports
}

// LearnedAddr is one address a sandbox may reach because an allowed name
// resolved to it.
type LearnedAddr struct {
	Addr    netip.Addr
	AnyPort bool
	Ports   []uint16
	Expires time.Time
}

// Learned lists the live learned addresses, for rebuilding the kernel's
// sets.
func (s *Sandbox) Learned() []LearnedAddr {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []LearnedAddr
	for a, l := range s.learned {
		if !l.expires.After(now) {
			continue
		}
		anyPort, ports := s.portsLocked(l, now)
		if !anyPort && len(ports) == 0 {
			continue
		}
		out = append(out, LearnedAddr{Addr: a, AnyPort: anyPort, Ports: ports, Expires: l.expires})
	}
	slices.SortFunc(out, func(a, b LearnedAddr) int { return a.Addr.Compare(b.Addr) })
	return out
}

// Answer is one name's answer the sandbox keeps: the name resolved to
// Addr, which it may reach until Expires.
type Answer struct {
	Name    string     `json:"name"`
	Addr    netip.Addr `json:"addr"`
	Expires time.Time  `json:"expires"`
}

// Answers lists the live answers, for a later process of the agent to
// Learn again.
func (s *Sandbox) Answers() []Answer {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Answer
	for a, l := range s.learned {
		for n, t := range l.names {
			if t.After(now) {
				out = append(out, Answer{Name: n, Addr: a, Expires: t})
			}
		}
	}
	slices.SortFunc(out, func(a, b Answer) int {
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// Resolved reports whether name resolved to addr for this sandbox and the
// answer has not expired.
func (s *Sandbox) Resolved(name string, addr netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resolvedLocked(canonName(name), addr.Unmap(), time.Now())
}

func (s *Sandbox) resolvedLocked(name string, addr netip.Addr, now time.Time) bool {
	l := s.learned[addr]
	return l != nil && l.names[name].After(now)
}

// AllowsConn is the Host/SNI proxy's check of a connection to dst that
// names name (the TLS SNI or HTTP Host; "" if none): dst is allowed by
// address, or name is allowed on dst's port and resolved to dst's address
// for this sandbox. So a request to an allowed address that names another
// host (domain fronting onto a shared CDN address) is refused. A DoH name
// the policy does not name exactly is refused at any address.
func (s *Sandbox) AllowsConn(name string, dst netip.AddrPort) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allowsConnLocked(canonName(name), dst, time.Now())
}

func (s *Sandbox) allowsConnLocked(name string, dst netip.AddrPort, now time.Time) bool {
	addr := dst.Addr().Unmap()
	if name != "" && IsDoHName(name) && !s.policy.AllowsName(name, dst.Port()) {
		return false // DoH by name, even at an address allowed by itself (open)
	}
	if s.policy.AllowsAddr(s.fence, addr, dst.Port()) {
		return true
	}
	if name == "" || s.fence.Denies(addr) || !s.policy.AllowsName(name, dst.Port()) {
		return false
	}
	return s.resolvedLocked(name, addr, now)
}

// Track registers a proxied connection to dst naming name: SetPolicy
// closes it once the policy no longer allows it. untrack ends the
// registration (call it when the connection ends).
func (s *Sandbox) Track(c io.Closer, name string, dst netip.AddrPort) (untrack func()) {
	t := &tracked{c: c, name: canonName(name), dst: dst}
	s.mu.Lock()
	s.conns[t] = struct{}{}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.conns, t)
		s.mu.Unlock()
	}
}

// DenyConn and DenyQuery count a refused connection and a refused DNS
// query; the firewall's own counters add to DeniedConns in egress.
func (s *Sandbox) DenyConn()  { s.deniedConns.Add(1) }
func (s *Sandbox) DenyQuery() { s.deniedQueries.Add(1) }

// Denied returns the counts so far of DenyConn and DenyQuery.
func (s *Sandbox) Denied() (conns, queries uint64) {
	return s.deniedConns.Load(), s.deniedQueries.Load()
}

func canonName(n string) string {
	b := []byte(n)
	if len(b) > 0 && b[len(b)-1] == '.' {
		b = b[:len(b)-1]
	}
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Table finds a node's networked sandboxes by address: the proxies know a
// connection's sandbox only by its source address (the firewall drops
// anything a sandbox sends from another).
type Table struct {
	mu sync.RWMutex
	m  map[netip.Addr]*Sandbox
}

// Add registers s under s.Addr, replacing any earlier holder.
func (t *Table) Add(s *Sandbox) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[netip.Addr]*Sandbox{}
	}
	t.m[s.Addr] = s
	t.mu.Unlock()
}

// Remove unregisters s (not a later sandbox given the same address).
func (t *Table) Remove(s *Sandbox) {
	t.mu.Lock()
	if t.m[s.Addr] == s {
		delete(t.m, s.Addr)
	}
	t.mu.Unlock()
}

// Lookup returns the sandbox whose address is src, or nil.
func (t *Table) Lookup(src netip.Addr) *Sandbox {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.m[src.Unmap()]
}
