//go:build !linux

package hostproxy

import (
	"net"
	"net/netip"

	"github.com/warrenhq/warren/internal/errdefs"
)

// OrigDst needs Linux's SO_ORIGINAL_DST.
func OrigDst(c net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errdefs.Unavailable("hostproxy: SO_ORIGINAL_DST needs Linux")
}
