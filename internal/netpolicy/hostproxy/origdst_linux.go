package hostproxy

import (
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// OrigDst is where a connection the nat table redirected (redirect or
// dnat, IPv4) was going: getsockopt(SOL_IP, SO_ORIGINAL_DST), which reads
// the connection's conntrack entry.
func OrigDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errorf("original destination: %T is not a socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, errorf("original destination: %w", err)
	}
	var dst netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		// A sockaddr_in fits the larger IPv6Mreq: family, port, address.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), uint16(b[2])<<8|uint16(b[3]))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, errorf("original destination (SO_ORIGINAL_DST): %w", err)
	}
	return dst, nil
}
