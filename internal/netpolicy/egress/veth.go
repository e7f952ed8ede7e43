package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sandboxIf is the sandbox's end of its veth.
const sandboxIf = "eth0"

func hostNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}
}

// plug makes the veth host<->eth0 with eth0 in the network namespace ns,
// addresses it, and routes addr to host; the sandbox's default route is
// gw, which every host end carries. It does nothing the sandbox could
// undo: the sandbox holds no CAP_NET_ADMIN. On error it leaves nothing.
func plug(ns *os.File, host string, addr, gw netip.Addr) (err error) {
	// A host end left by a crash in the middle goes first.
	if old, err := netlink.LinkByName(host); err == nil {
		netlink.LinkDel(old)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = host
	v := &netlink.Veth{LinkAttrs: attrs, PeerName: sandboxIf, PeerNamespace: netlink.NsFd(int(ns.Fd()))}
	if err := netlink.LinkAdd(v); err != nil {
		return fmt.Errorf("veth %s: %w", host, err)
	}
	defer func() {
		if err != nil {
			if l, lerr := netlink.LinkByName(host); lerr == nil {
				netlink.LinkDel(l)
			}
		}
	}()
	hl, err := netlink.LinkByName(host)
	if err != nil {
		return fmt.Errorf("veth %s: %w", host, err)
	}
	// No IPv6 on the host end: no link-local address the sandbox could
	// talk to. (Absent when the host has IPv6 off altogether.)
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+host+"/disable_ipv6", []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("veth %s: disable IPv6: %w", host, err)
	}
	if err := netlink.AddrAdd(hl, &netlink.Addr{IPNet: hostNet(gw), Scope: unix.RT_SCOPE_LINK}); err != nil {
		return fmt.Errorf("veth %s: gateway address: %w", host, err)
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		return fmt.Errorf("veth %s: up: %w", host, err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: hl.Attrs().Index, Dst: hostNet(addr), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("veth %s: route to %s: %w", host, addr, err)
	}

	h, err := netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
	if err != nil {
		return fmt.Errorf("sandbox netns: %w", err)
	}
	defer h.Close()
	sl, err := h.LinkByName(sandboxIf)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sandboxIf, err)
	}
	if err := h.AddrAdd(sl, &netlink.Addr{IPNet: hostNet(addr)}); err != nil {
		return fmt.Errorf("sandbox %s: address: %w", sandboxIf, err)
	}
	if err := h.LinkSetUp(sl); err != nil {
		return fmt.Errorf("sandbox %s: up: %w", sandboxIf, err)
	}
	idx := sl.Attrs().Index
	if err := h.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: hostNet(gw), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("sandbox route to the gateway: %w", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: idx, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("sandbox default route: %w", err)
	}
	return nil
}

// unplug deletes the veth by its host end (the sandbox's end goes with
// it). A missing one is not an error.
func unplug(host string) error {
	l, err := netlink.LinkByName(host)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return netlink.LinkDel(l)
}

// plugged reports whether the host end exists and is up.
func plugged(host string) bool {
	l, err := netlink.LinkByName(host)
	return err == nil && l.Attrs().Flags&net.FlagUp != 0
}

// hostEnds lists the host interfaces whose names start with prefix.
func hostEnds(prefix string) ([]string, error) {
	ls, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range ls {
		if n := l.Attrs().Name; strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out, nil
}
