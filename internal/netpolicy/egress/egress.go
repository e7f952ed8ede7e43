// Package egress gives a node's sandboxes their network: a veth per
// networked sandbox (none for policy none, which keeps the loopback-only
// namespace its runtime made), addresses from the node's pool, the
// nftables firewall (package nft), and the DNS and Host/SNI proxies on
// the gateway address every sandbox routes through. Policies change at
// run time: Update is one nftables transaction, and the proxies close the
// connections the new policy refuses.
//
// Several agents may share a host (tests do): each Manager owns a table,
// an interface prefix and a pool of its own, named by Config.Name and
// locked on the host, so two agents given the same name or pool get a
// clear error instead of each other's sandboxes.
package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/netpolicy"
	"github.com/warrenhq/warren/internal/netpolicy/nft"
)

// Gateway is every sandbox's next hop and DNS server: the host end of
// each veth carries it, the proxies listen on it.
var Gateway = netip.MustParseAddr("169.254.1.1")

// DefaultPool is where sandbox addresses come from unless configured.
var DefaultPool = netip.MustParsePrefix("10.213.0.0/16")

// Config is a node's network.
type Config struct {
	// Name tells this agent's table, interfaces and lock apart from other
	// agents' on the host: 1-8 letters or digits. Default "0".
	Name string
	// Pool holds sandbox addresses, one /32 each: at most a /16, at least
	// a /24. Default DefaultPool. It must not overlap the host's networks.
	Pool netip.Prefix
	// DNSUpstream is the resolver the DNS proxy asks ("host:port"); empty:
	// the host's /etc/resolv.conf.
	DNSUpstream string
	// Fence adds the platform's own addresses to what no sandbox reaches
	// and exempts what the operator allows explicitly.
	Fence netpolicy.Fence
	// LockDir holds the host-wide locks. Default /run/warren.
	LockDir string
	// DoH are public DNS-over-HTTPS resolvers, refused on 443 whatever
	// the policy; default the well-known ones.
	DoH []netip.Addr
	// StateDir keeps what the sandboxes' names resolved to across a
	// restart of the agent (answers.json, written every SaveInterval and
	// by Close): without it a restarted agent would reset their
	// connections to those addresses. Empty: not kept.
	StateDir string
	Log      *slog.Logger
}

// Manager is one node's sandbox network.
type Manager struct {
	cfg   Config
	fw    *nft.Firewall
	table netpolicy.Table
	locks []*os.File

	listeners []closer

	mu    sync.Mutex
	boxes map[string]*attached // by sandbox id
	slots map[int]string       // slot -> sandbox id
	next  int
	saved map[string][]netpolicy.Answer // an earlier process's, by sandbox id, until adopted

	stop chan struct{} // ends saveLoop
	done chan struct{}
}

// SaveInterval is how often the sandboxes' DNS answers are saved, so that
// even an agent killed without a clean stop loses at most this much.
const SaveInterval = 15 * time.Second

type closer interface{ Close() error }

type attached struct {
	sb   *netpolicy.Sandbox
	slot int
	host string // host end of the veth
}

func (c *Config) defaults() error {
	if c.Name == "" {
		c.Name = "0"
	}
	if len(c.Name) > 8 || strings.IndexFunc(c.Name, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') }) >= 0 {
		return fmt.Errorf("network name %q: 1-8 lower-case letters or digits", c.Name)
	}
	if !c.Pool.IsValid() {
		c.Pool = DefaultPool
	}
	if !c.Pool.Addr().Is4() || c.Pool.Bits() < 16 || c.Pool.Bits() > 24 {
		return fmt.Errorf("network pool %s: an IPv4 prefix from /16 to /24", c.Pool)
	}
	c.Pool = c.Pool.Masked()
	if c.DoH == nil {
		c.DoH = dohAddrs
	}
	if c.LockDir == "" {
		c.LockDir = "/run/warren"
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

func unavailable(format string, args ...any) error {
	return errdefs.New(errdefs.ErrUnavailable, api.CodeNetworkUnavailable, format, args...)
}

// New sets the node's network up: takes the host locks for its name and
// pool, turns IPv4 forwarding on, opens the proxies' sockets on the
// gateway and installs a fresh firewall table (replacing one an earlier
// process of this agent left). Errors are ErrUnavailable with
// CodeNetworkUnavailable, saying what is missing.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if err := cfg.defaults(); err != nil {
		return nil, errdefs.New(errdefs.ErrInvalid, api.CodeInvalid, "%v", err)
	}
	m := &Manager{cfg: cfg, boxes: map[string]*attached{}, slots: map[int]string{}, next: 2}
	fail := func(err error) (*Manager, error) {
		m.Close()
		return nil, err
	}
	for _, key := range []string{"name-" + cfg.Name, "pool-" + strings.ReplaceAll(cfg.Pool.String(), "/", "_")} {
		f, err := lock(filepath.Join(cfg.LockDir, "net-"+key+".lock"))
		if err != nil {
			return fail(unavailable("network %s (%s): %v", cfg.Name, cfg.Pool, err))
		}
		m.locks = append(m.locks, f)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0); err != nil {
		return fail(unavailable("network: turn on IPv4 forwarding: %v", err))
	}
	ports, err := m.listen(ctx)
	if err != nil {
		return fail(unavailable("network: proxies on %s: %v", Gateway, err))
	}
	fw, err := nft.Open(nft.Config{
		Table:    "warren_" + cfg.Name,
		IfPrefix: m.ifPrefix(),
		Pool:     cfg.Pool,
		Gateway:  Gateway,
		DNSPort:  ports[0], HTTPPort: ports[1], TLSPort: ports[2],
		Fence: &m.cfg.Fence,
		DoH:   cfg.DoH,
	})
	if err != nil {
		return fail(unavailable("network: %v", err))
	}
	m.fw = fw
	m.saved = loadAnswers(cfg.StateDir, cfg.Log)
	if cfg.StateDir != "" {
		m.stop, m.done = make(chan struct{}), make(chan struct{})
		go m.saveLoop()
	}
	return m, nil
}

func (m *Manager) saveLoop() {
	defer close(m.done)
	t := time.NewTicker(SaveInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			if err := m.saveAnswers(); err != nil {
				m.cfg.Log.Warn("network: save DNS answers", "err", err)
			}
		}
	}
}

// lock takes an exclusive flock on path, or says who holds it.
func lock(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("in use by another agent on this host (pid %s)", strings.TrimSpace(string(b)))
		}
		return nil, err
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// ifPrefix starts this manager's host interface names: "w<name>-".
func (m *Manager) ifPrefix() string { return "w" + m.cfg.Name + "-" }

// listen opens the proxies' sockets on the gateway, with IP_FREEBIND
// (the address exists only while some veth carries it): DNS on UDP and
// TCP, HTTP and TLS. It returns the DNS, HTTP and TLS ports.
func (m *Manager) listen(ctx context.Context) ([3]uint16, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
		})
		return errors.Join(err, serr)
	}}
	var ports [3]uint16
	at := netip.AddrPortFrom(Gateway, 0).String()
	dnsTCP, err := lc.Listen(ctx, "tcp4", at)
	if err != nil {
		return ports, err
	}
	m.listeners = append(m.listeners, dnsTCP)
	ports[0] = uint16(dnsTCP.Addr().(*net.TCPAddr).Port)
	dnsUDP, err := lc.ListenPacket(ctx, "udp4", netip.AddrPortFrom(Gateway, ports[0]).String())
	if err != nil {
		return ports, err
	}
	m.listeners = append(m.listeners, dnsUDP)
	httpLn, err := lc.Listen(ctx, "tcp4", at)
	if err != nil {
		return ports, err
	}
	m.listeners = append(m.listeners, httpLn)
	tlsLn, err := lc.Listen(ctx, "tcp4", at)
	if err != nil {
		return ports, err
	}
	m.listeners = append(m.listeners, tlsLn)
	ports[1] = uint16(httpLn.Addr().(*net.TCPAddr).Port)
	ports[2] = uint16(tlsLn.Addr().(*net.TCPAddr).Port)
	if err := m.serve(dnsUDP, dnsTCP, httpLn, tlsLn); err != nil {
		return ports, err
	}
	return ports, nil
}

// Close stops the proxies and saves the sandboxes' answers
// (Config.StateDir). The firewall's rules stay in force and the veths stay
// with the sandboxes, which keep their policies while no agent runs: a
// restarted agent replaces the rules in one transaction and re-adopts the
// sandboxes (Adopt). Teardown removes the rules too.
func (m *Manager) Close() error {
	var errs []error
	if m.stop != nil {
		close(m.stop)
		<-m.done
		m.stop = nil
	}
	if m.fw != nil {
		errs = append(errs, m.saveAnswers())
	}
	for _, l := range m.listeners {
		errs = append(errs, l.Close())
	}
	m.listeners = nil
	if m.fw != nil {
		errs = append(errs, m.fw.Close())
		m.fw = nil
	}
	for _, f := range m.locks {
		f.Close()
	}
	m.locks = nil
	return errors.Join(errs...)
}

// Teardown is Close, and deletes the firewall table (tests, and hosts
// giving up sandbox networks): sandboxes still attached lose their
// network.
func (m *Manager) Teardown() error {
	fw := m.fw
	err := m.Close()
	if fw != nil {
		err = errors.Join(err, fw.Destroy())
	}
	return err
}

// Lookup finds a networked sandbox by its address (for the proxies).
func (m *Manager) Lookup(src netip.Addr) *netpolicy.Sandbox { return m.table.Lookup(src) }

// addr is slot's address in the pool.
func (m *Manager) addr(slot int) netip.Addr {
	b := m.cfg.Pool.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(slot)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func (m *Manager) slotOf(a netip.Addr) (int, bool) {
	if !m.cfg.Pool.Contains(a) {
		return 0, false
	}
	b, p := a.As4(), m.cfg.Pool.Addr().As4()
	slot := int(uint32(b[2])<<8|uint32(b[3])) - int(uint32(p[2])<<8|uint32(p[3]))
	return slot, slot >= 2 && slot < m.size()-1
}

func (m *Manager) size() int { return 1 << (32 - m.cfg.Pool.Bits()) }

// allocLocked picks a free slot: 2 up to the pool's last address but one
// (.0 and .1 are never used, nor the broadcast).
func (m *Manager) allocLocked() (int, error) {
	for range m.size() {
		s := m.next
		m.next++
		if m.next >= m.size()-1 {
			m.next = 2
		}
		if _, used := m.slots[s]; !used && s >= 2 {
			return s, nil
		}
	}
	return 0, errdefs.New(errdefs.ErrExhausted, api.CodeNodeFull, "network pool %s is full", m.cfg.Pool)
}

// Attach gives sandbox id, whose network namespace is ns, a veth and
// policy p (which must be networked), at address want if valid (a
// recovered sandbox's, or its own from an earlier attach) or a free one.
// It returns the address.
func (m *Manager) Attach(ctx context.Context, id string, ns *os.File, p *netpolicy.Policy, want netip.Addr) (netip.Addr, error) {
	if !p.Networked() {
		return netip.Addr{}, fmt.Errorf("attach %s: policy %s has no network", id, p.Mode())
	}
	m.mu.Lock()
	if a := m.boxes[id]; a != nil {
		m.mu.Unlock()
		return a.sb.Addr, m.Update(id, p)
	}
	slot, ok := m.slotOf(want)
	if !ok || m.slots[slot] != "" {
		var err error
		if slot, err = m.allocLocked(); err != nil {
			m.mu.Unlock()
			return netip.Addr{}, err
		}
	}
	m.slots[slot] = id
	m.mu.Unlock()

	a := &attached{slot: slot, host: m.ifPrefix() + strconv.Itoa(slot)}
	a.sb = netpolicy.NewSandbox(id, m.addr(slot), p, &m.cfg.Fence, m.fw)
	release := func(err error) (netip.Addr, error) {
		m.fw.Delete(a.sb)
		unplug(a.host)
		m.mu.Lock()
		delete(m.slots, slot)
		m.mu.Unlock()
		return netip.Addr{}, err
	}
	// Rules first: the veth never carries a packet they have not seen.
	if err := m.fw.Put(a.sb, slot, a.host); err != nil {
		return release(err)
	}
	if err := plug(ns, a.host, a.sb.Addr, Gateway); err != nil {
		return release(fmt.Errorf("sandbox %s: %w", id, err))
	}
	m.table.Add(a.sb)
	m.mu.Lock()
	m.boxes[id] = a
	m.mu.Unlock()
	m.restoreAnswers(a.sb)
	return a.sb.Addr, nil
}

// Adopt takes over a sandbox an earlier process of the agent attached
// (its veth survives the agent): if its host end is still there, the
// firewall gets its rules back; else it is attached afresh through ns
// (nil: fail).
func (m *Manager) Adopt(ctx context.Context, id string, ns func() (*os.File, error), p *netpolicy.Policy, addr netip.Addr) (netip.Addr, error) {
	slot, ok := m.slotOf(addr)
	host := m.ifPrefix() + strconv.Itoa(slot)
	if ok && plugged(host) {
		m.mu.Lock()
		if m.slots[slot] == "" {
			m.slots[slot] = id
			a := &attached{slot: slot, host: host, sb: netpolicy.NewSandbox(id, addr, p, &m.cfg.Fence, m.fw)}
			m.mu.Unlock()
			if err := m.fw.Put(a.sb, slot, host); err != nil {
				m.mu.Lock()
				delete(m.slots, slot)
				m.mu.Unlock()
				return netip.Addr{}, err
			}
			m.table.Add(a.sb)
			m.mu.Lock()
			m.boxes[id] = a
			m.mu.Unlock()
			m.restoreAnswers(a.sb)
			return addr, nil
		}
		m.mu.Unlock()
	}
	f, err := ns()
	if err != nil {
		return netip.Addr{}, err
	}
	defer f.Close()
	unplug(host)
	return m.Attach(ctx, id, f, p, addr)
}

// Update puts policy p in force for sandbox id. A sandbox without a veth
// cannot be updated to a networked policy here (the caller attaches).
func (m *Manager) Update(id string, p *netpolicy.Policy) error {
	m.mu.Lock()
	a := m.boxes[id]
	m.mu.Unlock()
	if a == nil {
		return errdefs.New(errdefs.ErrNotFound, api.CodeSandboxNotFound, "sandbox %s has no network", id)
	}
	a.sb.SetPolicy(p)
	return m.fw.Put(a.sb, a.slot, a.host)
}

// Detach removes sandbox id's veth, rules and proxy state; the sandbox is
// back to loopback. Unknown ids are not an error.
func (m *Manager) Detach(id string) error {
	m.mu.Lock()
	a := m.boxes[id]
	delete(m.boxes, id)
	if a != nil {
		delete(m.slots, a.slot)
	}
	m.mu.Unlock()
	if a == nil {
		return nil
	}
	m.table.Remove(a.sb)
	a.sb.SetPolicy(netpolicy.None) // closes its proxied connections
	return errors.Join(unplug(a.host), m.fw.Delete(a.sb))
}

// Status is sandbox id's address and denial counts (zero if it has no
// veth).
func (m *Manager) Status(id string) (addr netip.Addr, deniedConns, deniedQueries uint64) {
	m.mu.Lock()
	a := m.boxes[id]
	m.mu.Unlock()
	if a == nil {
		return netip.Addr{}, 0, 0
	}
	conns, queries := a.sb.Denied()
	if n, err := m.fw.Denied(a.sb); err == nil {
		conns += n
	}
	return a.sb.Addr, conns, queries
}

// Sweep deletes host ends of this manager's veths that belong to no
// attached sandbox (left by sandboxes that died while no agent ran).
func (m *Manager) Sweep() error {
	ends, err := hostEnds(m.ifPrefix())
	if err != nil {
		return err
	}
	m.mu.Lock()
	live := map[string]bool{}
	for _, a := range m.boxes {
		live[a.host] = true
	}
	m.mu.Unlock()
	var errs []error
	for _, e := range ends {
		if !live[e] {
			m.cfg.Log.Info("network: removing a stale veth", "interface", e)
			errs = append(errs, unplug(e))
		}
	}
	return errors.Join(errs...)
}

// DNS is the nameserver sandboxes are given: the gateway.
func (m *Manager) DNS() string { return Gateway.String() }

// Config is the manager's configuration, defaults filled in: a later
// process of the agent starts its network again from it.
func (m *Manager) Config() Config { return m.cfg }
