// Package nft is the node's egress firewall for networked sandboxes, in
// one nftables table of its own (google/nftables, no nft(8) needed).
//
// Per sandbox, on its host veth: nothing but IPv4 from its own address;
// connections the current policy accepted pass on a conntrack mark that
// names the policy's generation (so a policy change re-checks every open
// connection on its next packet, and TTL expiry of a learned address does
// not cut a download mid-way); DNS and DoT to anywhere but the node's
// DNS proxy and HTTPS/DoT to known DoH addresses are refused; the fence
// (netpolicy.Fence) comes next; then the policy: open accepts, an
// allowlist accepts its CIDR rules and the addresses its names resolved
// to (sets with timeouts the DNS proxy fills through Learn). TCP 80 and
// 443 to learned addresses are redirected to the Host/SNI proxy; UDP 80
// and 443 to them (QUIC, which that proxy cannot check) are refused.
// Every refusal is counted per sandbox and answered (TCP reset, ICMP
// admin-prohibited), so that tools fail fast instead of hanging.
//
//	table inet NAME
//	  chain forward   iifname "P*" jump egress; oifname "P*" ct state established,related accept; oifname "P*" drop
//	  chain egress    iifname vmap @fwd; drop
//	  chain s<N>      sandbox N: protocol, anti-spoof, ct mark, DNS/DoH, fence, goto p<N>
//	  chain p<N>      its policy; goto x<N>
//	  chain x<N>      counter name d<N>; reject
//	  chain input     iifname "P*" jump hostin     (only the proxies' ports on the gateway)
//	  chain prerouting (nat)  DNS to the gateway -> the DNS proxy; iifname vmap @nat -> n<N>
//	  chain n<N>      tcp 80/443 to learned addresses -> the Host/SNI proxy
//	  chain postrouting (nat) ip saddr POOL oifname != "P*" masquerade
package nft

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/netpolicy"
)

// Config is one firewall's shape.
type Config struct {
	// Table is the nftables table's name; one per agent.
	Table string
	// IfPrefix starts the names of every host veth this firewall owns.
	IfPrefix string
	// Pool holds the sandboxes' addresses (masqueraded on the way out).
	Pool netip.Prefix
	// Gateway is the sandboxes' next hop on every veth, where the proxies
	// listen.
	Gateway netip.Addr
	// The proxies' ports on the gateway.
	DNSPort, HTTPPort, TLSPort uint16
	// Fence is what no policy reaches.
	Fence *netpolicy.Fence
	// DoH are addresses of public DNS-over-HTTPS resolvers, refused on
	// 443 and 853 whatever the policy.
	DoH []netip.Addr
}

// Firewall is one agent's table. Safe for concurrent use.
type Firewall struct {
	cfg Config
	t   *nftables.Table

	mu    sync.Mutex
	c     *nftables.Conn
	gen   uint32
	fwd   *nftables.Set // ifname -> jump s<N>
	nat   *nftables.Set // ifname -> jump n<N>
	doh   *nftables.Set
	boxes map[*netpolicy.Sandbox]*box
}

// box is one sandbox's objects in the table.
type box struct {
	slot   int
	ifname string
	la, lp *nftables.Set // learned: any port; address . port
}

// Open replaces any table of cfg.Table (an earlier process's) with a
// fresh one holding no sandbox. It fails with an error naming what the
// kernel refused when nftables is missing.
func Open(cfg Config) (*Firewall, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	f := &Firewall{cfg: cfg, c: c, t: &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyINet}, boxes: map[*netpolicy.Sandbox]*box{}}
	// Generations start anywhere: an earlier process's marks on open
	// connections then rarely match this one's, and a connection whose
	// mark does not is checked against the policy again, as after a change.
	var g [4]byte
	rand.Read(g[:])
	f.gen = binary.BigEndian.Uint32(g[:])
	// An earlier process's table goes in the same transaction that
	// installs the new one: its sandboxes' veths are never without rules
	// (until they are added back, their traffic meets the new table's
	// drop for interfaces it does not know).
	if _, err := c.ListTableOfFamily(cfg.Table, nftables.TableFamilyINet); err == nil {
		c.DelTable(f.t)
	}
	if err := f.base(); err != nil {
		return nil, err
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables: install table %s: %w", cfg.Table, err)
	}
	return f, nil
}

// Close lets go of the table and leaves it in force: the sandboxes that
// outlive the agent keep exactly their rules until the next Open replaces
// them (a table deleted instead would leave their veths with no rules at
// all: unfiltered and unmasqueraded).
func (f *Firewall) Close() error {
	return f.c.CloseLasting()
}

// Destroy deletes the table: every sandbox on it loses its network.
func (f *Firewall) Destroy() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.c.DelTable(f.t)
	return f.c.Flush()
}

func (f *Firewall) chain(name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: f.t}
}

func (f *Firewall) rule(chain *nftables.Chain, e ...[]expr.Any) {
	f.c.AddRule(&nftables.Rule{Table: f.t, Chain: chain, Exprs: cat(e...)})
}

func (f *Firewall) base() error {
	c, t, p := f.c, f.t, f.cfg.IfPrefix
	c.AddTable(t)
	f.fwd = &nftables.Set{Table: t, Name: "fwd", IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	f.nat = &nftables.Set{Table: t, Name: "nat", IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	f.doh = &nftables.Set{Table: t, Name: "doh", KeyType: nftables.TypeIPAddr}
	var doh []nftables.SetElement
	for _, a := range f.cfg.DoH {
		b := a.As4()
		doh = append(doh, nftables.SetElement{Key: b[:]})
	}
	for s, el := range map[*nftables.Set][]nftables.SetElement{f.fwd: nil, f.nat: nil, f.doh: doh} {
		if err := c.AddSet(s, el); err != nil {
			return fmt.Errorf("nftables: set %s: %w", s.Name, err)
		}
	}

	accept, drop := one(verdict(expr.VerdictAccept)), one(verdict(expr.VerdictDrop))
	egress := c.AddChain(f.chain("egress"))
	f.rule(egress, iifVmap(f.fwd))
	f.rule(egress, drop)
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	f.rule(fwd, iifnamePrefix(p), one(jump("egress")))
	f.rule(fwd, oifnamePrefix(p, expr.CmpOpEq), ctEstablished(), accept)
	f.rule(fwd, oifnamePrefix(p, expr.CmpOpEq), drop)

	// The host answers a sandbox only at the proxies.
	hostin := c.AddChain(f.chain("hostin"))
	f.rule(hostin, ctEstablished(), accept)
	gw := addrIs(offDaddr, f.cfg.Gateway, expr.CmpOpEq)
	f.rule(hostin, nfprotoIs(unix.NFPROTO_IPV4, expr.CmpOpEq), gw, l4proto(unix.IPPROTO_UDP), dport(f.cfg.DNSPort), accept)
	for _, port := range []uint16{f.cfg.DNSPort, f.cfg.HTTPPort, f.cfg.TLSPort} {
		f.rule(hostin, nfprotoIs(unix.NFPROTO_IPV4, expr.CmpOpEq), gw, l4proto(unix.IPPROTO_TCP), dport(port), accept)
	}
	f.rule(hostin, drop)
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	f.rule(in, iifnamePrefix(p), one(jump("hostin")))

	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		f.rule(pre, iifnamePrefix(p), nfprotoIs(unix.NFPROTO_IPV4, expr.CmpOpEq), gw, l4proto(proto), dport(53), redirectTo(f.cfg.DNSPort))
	}
	f.rule(pre, iifnamePrefix(p), iifVmap(f.nat))

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	pool := f.cfg.Pool
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-pool.Bits()))
	net := pool.Masked().Addr().As4()
	f.rule(post, nfprotoIs(unix.NFPROTO_IPV4, expr.CmpOpEq), oifnamePrefix(p, expr.CmpOpNeq), one(
		loadAddr(offSaddr),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net[:]},
		&expr.Masq{},
	))
	return nil
}

func names(slot int) (s, p, x, n, la, lp, d string) {
	k := strconv.Itoa(slot)
	return "s" + k, "p" + k, "x" + k, "n" + k, "la" + k, "lp" + k, "d" + k
}

// Put installs sandbox sb's rules on host interface ifname (slot is its
// number on this node, unique among live sandboxes), or replaces them with
// its current policy and learned addresses: the change is one
// transaction, in force when Put returns.
func (f *Firewall) Put(sb *netpolicy.Sandbox, slot int, ifname string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sName, pName, xName, nName, laName, lpName, dName := names(slot)
	b := f.boxes[sb]
	fresh := b == nil
	if fresh {
		b = &box{slot: slot, ifname: ifname,
			la: &nftables.Set{Table: f.t, Name: laName, KeyType: nftables.TypeIPAddr, HasTimeout: true},
			lp: &nftables.Set{Table: f.t, Name: lpName, KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService), Concatenation: true, HasTimeout: true},
		}
		f.c.AddObj(&nftables.CounterObj{Table: f.t, Name: dName})
		for _, s := range []*nftables.Set{b.la, b.lp} {
			if err := f.c.AddSet(s, nil); err != nil {
				return err
			}
		}
	}
	s, p, x, n := f.chain(sName), f.chain(pName), f.chain(xName), f.chain(nName)
	for _, ch := range []*nftables.Chain{s, p, x, n} {
		if fresh {
			f.c.AddChain(ch)
		} else {
			f.c.FlushChain(ch)
		}
	}
	if !fresh {
		f.c.FlushSet(b.la)
		f.c.FlushSet(b.lp)
	}
	f.gen++
	gen := f.gen
	f.rules(sb, b, gen, s, p, x, n)
	if err := f.learned(b, sb.Learned()); err != nil {
		return err
	}
	if fresh {
		key := ifname
		if err := f.c.SetAddElements(f.fwd, []nftables.SetElement{{Key: padIfname(key), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: sName}}}); err != nil {
			return err
		}
		if err := f.c.SetAddElements(f.nat, []nftables.SetElement{{Key: padIfname(key), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: nName}}}); err != nil {
			return err
		}
	}
	if err := f.c.Flush(); err != nil {
		return fmt.Errorf("nftables: sandbox %s: %w", sb.ID, err)
	}
	f.boxes[sb] = b
	return nil
}

// rules writes the sandbox's four chains.
func (f *Firewall) rules(sb *netpolicy.Sandbox, b *box, gen uint32, s, p, x, n *nftables.Chain) {
	deny := one(gotoChain(x.Name))
	ok := cat(ctMarkSet(gen), one(verdict(expr.VerdictAccept)))
	tcp, udp := l4proto(unix.IPPROTO_TCP), l4proto(unix.IPPROTO_UDP)

	// x: count and answer.
	f.rule(x, one(counter("d"+strconv.Itoa(b.slot))))
	f.rule(x, tcp, one(rejectTCP()))
	f.rule(x, one(rejectAdmin()))

	// s: what no policy changes.
	f.rule(s, nfprotoIs(unix.NFPROTO_IPV4, expr.CmpOpNeq), deny)
	f.rule(s, addrIs(offSaddr, sb.Addr, expr.CmpOpNeq), deny)
	f.rule(s, ctMarkIs(gen), one(verdict(expr.VerdictAccept)))
	for _, proto := range [][]expr.Any{tcp, udp} {
		f.rule(s, proto, dport(53), deny)
		f.rule(s, proto, dport(853), deny)
		f.rule(s, proto, daddrInSet(f.doh), dport(443), deny)
	}
	fence := sb.Fence()
	if fence != nil {
		for _, e := range fence.Extra {
			f.rule(s, daddrIn(e), deny)
		}
		for _, e := range fence.Exempt {
			f.rule(s, daddrIn(e), one(gotoChain(p.Name)))
		}
	}
	for _, d := range netpolicy.Denied {
		f.rule(s, daddrIn(d), deny)
	}
	f.rule(s, one(gotoChain(p.Name)))

	// p: the policy.
	pol := sb.Policy()
	switch pol.Mode() {
	case api.NetworkOpen:
		f.rule(p, ok)
	case api.NetworkAllowlist:
		for _, r := range pol.Nets() {
			if r.Port == netpolicy.AnyPort {
				f.rule(p, daddrIn(r.Prefix), ok)
				continue
			}
			for _, proto := range [][]expr.Any{tcp, udp} {
				f.rule(p, proto, daddrIn(r.Prefix), dport(r.Port), ok)
			}
		}
		// QUIC to a learned address would pass the Host/SNI check by.
		f.rule(p, udp, daddrInSet(b.la), dport(443), deny)
		f.rule(p, udp, daddrInSet(b.la), dport(80), deny)
		f.rule(p, daddrInSet(b.la), ok)
		for _, proto := range [][]expr.Any{tcp, udp} {
			f.rule(p, proto, daddrDportInSet(b.lp), ok)
		}
		// n: HTTP and TLS to learned addresses go to the Host/SNI proxy.
		for _, port := range []struct{ dst, to uint16 }{{80, f.cfg.HTTPPort}, {443, f.cfg.TLSPort}} {
			f.rule(n, tcp, daddrInSet(b.la), dport(port.dst), redirectTo(port.to))
			f.rule(n, tcp, daddrDportInSet(b.lp), dport(port.dst), redirectTo(port.to))
		}
	}
	f.rule(p, deny)
}

// learned adds addresses to the sandbox's sets (in the open batch).
func (f *Firewall) learned(b *box, ls []netpolicy.LearnedAddr) error {
	var la, lp []nftables.SetElement
	now := time.Now()
	for _, l := range ls {
		ttl := l.Expires.Sub(now).Round(time.Second)
		if ttl < time.Second {
			continue
		}
		a := l.Addr.As4()
		if l.AnyPort {
			la = append(la, nftables.SetElement{Key: a[:], Timeout: ttl})
			continue
		}
		for _, port := range l.Ports {
			key := append(a[:], byte(port>>8), byte(port), 0, 0)
			lp = append(lp, nftables.SetElement{Key: key, Timeout: ttl})
		}
	}
	if len(la) > 0 {
		if err := f.c.SetAddElements(b.la, la); err != nil {
			return err
		}
	}
	if len(lp) > 0 {
		if err := f.c.SetAddElements(b.lp, lp); err != nil {
			return err
		}
	}
	return nil
}

// Learn implements netpolicy.Firewall: the sandbox may reach addr (on
// ports) for ttl. A sandbox the firewall does not hold is ignored.
func (f *Firewall) Learn(sb *netpolicy.Sandbox, addr netip.Addr, anyPort bool, ports []uint16, ttl time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.boxes[sb]
	if b == nil {
		return
	}
	l := netpolicy.LearnedAddr{Addr: addr, AnyPort: anyPort, Ports: slices.Clone(ports), Expires: time.Now().Add(ttl)}
	if err := f.learned(b, []netpolicy.LearnedAddr{l}); err == nil {
		err = f.c.Flush()
	}
}

// Delete removes the sandbox's rules; its veth's packets are dropped.
func (f *Firewall) Delete(sb *netpolicy.Sandbox) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.boxes[sb]
	if b == nil {
		return nil
	}
	sName, pName, xName, nName, _, _, dName := names(b.slot)
	key := padIfname(b.ifname)
	var errs []error
	errs = append(errs, f.c.SetDeleteElements(f.fwd, []nftables.SetElement{{Key: key}}))
	errs = append(errs, f.c.SetDeleteElements(f.nat, []nftables.SetElement{{Key: key}}))
	chains := []*nftables.Chain{f.chain(sName), f.chain(pName), f.chain(xName), f.chain(nName)}
	for _, ch := range chains {
		f.c.FlushChain(ch)
	}
	for _, ch := range chains {
		f.c.DelChain(ch)
	}
	f.c.DelSet(b.la)
	f.c.DelSet(b.lp)
	f.c.DeleteObject(&nftables.CounterObj{Table: f.t, Name: dName})
	errs = append(errs, f.c.Flush())
	delete(f.boxes, sb)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nftables: remove sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// Denied returns how many packets the sandbox's rules refused.
func (f *Firewall) Denied(sb *netpolicy.Sandbox) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.boxes[sb]
	if b == nil {
		return 0, nil
	}
	_, _, _, _, _, _, dName := names(b.slot)
	o, err := f.c.GetObject(&nftables.CounterObj{Table: f.t, Name: dName})
	if err != nil {
		return 0, err
	}
	switch c := o.(type) {
	case *nftables.CounterObj:
		return c.Packets, nil
	case *nftables.NamedObj:
		if e, ok := c.Obj.(*expr.Counter); ok {
			return e.Packets, nil
		}
	}
	return 0, fmt.Errorf("nftables: counter %s: unexpected %T", dName, o)
}
