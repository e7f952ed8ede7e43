package egress

import (
	"net"

	"github.com/warrenhq/warren/internal/netpolicy"
	"github.com/warrenhq/warren/internal/netpolicy/dnsproxy"
	"github.com/warrenhq/warren/internal/netpolicy/hostproxy"
)

// dohAddrs are refused on 443 and 853 whatever the policy.
var dohAddrs = netpolicy.DoHAddrs

// serve starts the DNS proxy and the Host/SNI proxy on their sockets;
// Close stops them and their live connections.
func (m *Manager) serve(dnsUDP net.PacketConn, dnsTCP, httpLn, tlsLn net.Listener) error {
	up := m.cfg.DNSUpstream
	if up == "" {
		var err error
		if up, err = dnsproxy.SystemUpstream(); err != nil {
			return err
		}
	}
	dp, err := dnsproxy.New(dnsproxy.Config{Upstream: up, Lookup: m.table.Lookup, Log: m.cfg.Log})
	if err != nil {
		return err
	}
	hp, err := hostproxy.New(hostproxy.Config{Lookup: m.table.Lookup, Log: m.cfg.Log})
	if err != nil {
		dp.Close()
		return err
	}
	m.listeners = append(m.listeners, dp, hp)
	go dp.ServeUDP(dnsUDP)
	go dp.ServeTCP(dnsTCP)
	go hp.ServeHTTP(httpLn)
	go hp.ServeTLS(tlsLn)
	return nil
}
