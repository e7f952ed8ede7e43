package nft

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The expressions the firewall's rules are made of, one function per
// nft(8) phrase it would print, so that a rule reads like its nft line.
// Every match loads into register 1 and compares there.

const ifnameLen = unix.IFNAMSIZ

// padIfname pads a device name as nftables keys and compares them.
func padIfname(n string) []byte {
	b := make([]byte, ifnameLen)
	copy(b, n)
	return b
}

// iifnamePrefix is `iifname "p*"`, oifnamePrefix `oifname "p*"`.
func iifnamePrefix(p string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(p)}}
}

func oifnamePrefix(p string, op expr.CmpOp) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: []byte(p)}}
}

// iifVmap is `iifname vmap @m`.
func iifVmap(m *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
	}
}

// nfproto is `meta nfproto ipv4` (op Eq) or `!= ipv4` (op Neq).
func nfprotoIs(proto byte, op expr.CmpOp) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: []byte{proto}}}
}

// l4proto is `meta l4proto tcp`.
func l4proto(proto byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}}}
}

const (
	offSaddr = 12
	offDaddr = 16
)

func loadAddr(off uint32) expr.Any {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}
}

func loadDport(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// addrIs is `ip saddr|daddr (!=) A`.
func addrIs(off uint32, a netip.Addr, op expr.CmpOp) []expr.Any {
	b := a.As4()
	return []expr.Any{loadAddr(off), &expr.Cmp{Op: op, Register: 1, Data: b[:]}}
}

// daddrIn is `ip daddr P`.
func daddrIn(p netip.Prefix) []expr.Any {
	if p.Bits() == 32 {
		return addrIs(offDaddr, p.Addr(), expr.CmpOpEq)
	}
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	net := p.Masked().Addr().As4()
	return []expr.Any{
		loadAddr(offDaddr),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net[:]},
	}
}

// daddrInSet is `ip daddr @s`.
func daddrInSet(s *nftables.Set) []expr.Any {
	return []expr.Any{loadAddr(offDaddr), &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}}
}

// daddrDportInSet is `ip daddr . th dport @s`, for a concatenated set.
func daddrDportInSet(s *nftables.Set) []expr.Any {
	return []expr.Any{loadAddr(offDaddr), loadDport(9), &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}}
}

// dport is `th dport P` (the caller has matched tcp or udp).
func dport(p uint16) []expr.Any {
	return []expr.Any{loadDport(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)}}
}

// ctStateIn is `ct state established,related`.
func ctEstablished() []expr.Any {
	bits := binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: bits, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

// ctMarkIs is `ct mark M`, ctMarkSet `ct mark set M`.
func ctMarkIs(m uint32) []expr.Any {
	return []expr.Any{&expr.Ct{Key: expr.CtKeyMARK, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(m)}}
}

func ctMarkSet(m uint32) []expr.Any {
	return []expr.Any{&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(m)}, &expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true}}
}

// counter is `counter name "n"`.
func counter(name string) expr.Any {
	return &expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name}
}

// redirectTo is `redirect to :port`.
func redirectTo(port uint16) []expr.Any {
	return []expr.Any{&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)}, &expr.Redir{RegisterProtoMin: 1}}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func gotoChain(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain} }

func rejectTCP() expr.Any { return &expr.Reject{Type: unix.NFT_REJECT_TCP_RST} }

func rejectAdmin() expr.Any {
	return &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func one(e ...expr.Any) []expr.Any { return e }
