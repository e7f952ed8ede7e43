package api

import (
	"fmt"
	"strconv"
)

// A sandbox's TCP ports are reached from outside through the API, also
// when the sandbox has no network: the node connects to 127.0.0.1:port
// inside the sandbox's network namespace.
//
//	ANY /v1/sandboxes/{id}/ports/{port}/{path...}   HTTP to the sandbox's server (WebSocket upgrades too)
//	GET /v1/sandboxes/{id}/portforward/{port}       Connection: Upgrade, Upgrade: tcp -> 101, then raw bytes
//
// Both need the rights of exec.

// CodePortUnreachable (502) says that nothing in the sandbox accepted the
// connection on that port, or its server answered nothing.
const CodePortUnreachable = "port_unreachable"

// PortResponseHeader is on every answer that a sandbox's own server gave
// through /ports, whatever its status: an answer without it is warren's
// own (an ErrorBody with its code).
const PortResponseHeader = "X-Warren-Port-Response"

// TunnelUpgrade is the Upgrade token of a port-forward tunnel: after the
// 101, the connection carries the bytes of one TCP connection to the
// sandbox's port both ways, and a half-close (FIN) in either direction
// is passed on.
const TunnelUpgrade = "tcp"

// ParsePort reads a TCP port number: 1 to 65535.
func ParsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 || s != strconv.Itoa(p) {
		return 0, fmt.Errorf("port %q: want a number from 1 to 65535", s)
	}
	return p, nil
}
