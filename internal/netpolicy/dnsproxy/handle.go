package dnsproxy

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenhq/warren/internal/netpolicy"
)

const headerLen = 12

// Texts of the Extended DNS Errors on refusals.
const (
	textPolicy  = "not in the sandbox's network policy"
	textSource  = "not a sandbox of this node"
	textRate    = "query rate limit of the sandbox"
	textClass   = "only class IN"
	textEscape  = "a label holds a dot or a byte names do not"
	textNetwork = "upstream resolver did not answer"
)

// answer returns the reply to the query raw that src sent over UDP or
// TCP, or nil to send none. It is the whole request path: everything
// after it is I/O.
func (p *Proxy) answer(ctx context.Context, src netip.Addr, raw []byte, tcp bool) []byte {
	if len(raw) < headerLen || len(raw) > MaxQuery || raw[2]&0x80 != 0 {
		return nil // too short for an ID, too long, or a response
	}
	q := new(dns.Msg)
	if err := q.Unpack(raw); err != nil {
		return formErr(raw)
	}
	r := p.reply(ctx, src, q)
	size := dns.MaxMsgSize
	if !tcp {
		size = dns.MinMsgSize
		if opt := q.IsEdns0(); opt != nil {
			size = min(max(int(opt.UDPSize()), dns.MinMsgSize), maxUDPReply)
		}
	}
	r.Truncate(size)
	r.Compress = true
	out, err := r.Pack()
	if err == nil && len(r.Answer)+len(r.Ns) > 0 {
		// Records from upstream that unpacked may still pack into ones
		// that do not (empty RDATA, say): never pass on a broken answer.
		err = new(dns.Msg).Unpack(out)
	}
	if err != nil {
		p.log.Debug("dns reply does not pack", "err", err)
		r.Answer, r.Ns, r.Rcode = nil, nil, dns.RcodeServerFailure
		if out, err = r.Pack(); err != nil {
			return formErr(raw)
		}
	}
	return out
}

// formErr is a FORMERR for a query that does not parse, from its header.
func formErr(raw []byte) []byte {
	r := &dns.Msg{MsgHdr: dns.MsgHdr{
		Id:               uint16(raw[0])<<8 | uint16(raw[1]),
		Response:         true,
		Opcode:           int(raw[2]>>3) & 0xF,
		RecursionDesired: raw[2]&1 != 0,
		Rcode:            dns.RcodeFormatError,
	}}
	out, err := r.Pack()
	if err != nil {
		return nil
	}
	return out
}

// reply is the answer to the parsed query q from src.
func (p *Proxy) reply(ctx context.Context, src netip.Addr, q *dns.Msg) *dns.Msg {
	r := &dns.Msg{MsgHdr: dns.MsgHdr{
		Id:                 q.Id,
		Response:           true,
		Opcode:             q.Opcode,
		RecursionDesired:   q.RecursionDesired,
		RecursionAvailable: true,
		CheckingDisabled:   q.CheckingDisabled,
	}}
	opt := q.IsEdns0()
	if opt != nil {
		r.SetEdns0(upstreamUDP, false)
	}
	if q.Opcode != dns.OpcodeQuery {
		r.Rcode = dns.RcodeNotImplemented
		return r
	}
	if len(q.Question) != 1 {
		r.Rcode = dns.RcodeFormatError
		return r
	}
	r.Question = q.Question
	if opt != nil && opt.Version() != 0 {
		r.Rcode = dns.RcodeBadVers
		return r
	}
	refuse := func(code uint16, text string) *dns.Msg {
		r.Rcode = dns.RcodeRefused
		if opt := r.IsEdns0(); opt != nil {
			opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: code, ExtraText: text})
		}
		return r
	}
	sb := p.cfg.Lookup(src)
	if sb == nil {
		p.log.Debug("dns query from an unknown source refused", "src", src)
		return refuse(dns.ExtendedErrorCodeProhibited, textSource)
	}
	qs := q.Question[0]
	name := canonName(qs.Name)
	deny := func(code uint16, text string) *dns.Msg {
		sb.DenyQuery()
		p.log.Debug("dns query refused", "sandbox", sb.ID, "name", name, "type", dns.Type(qs.Qtype).String(), "why", text)
		return refuse(code, text)
	}
	if !p.limits.allow(sb, time.Now()) {
		return deny(dns.ExtendedErrorCodeOther, textRate)
	}
	if qs.Qclass != dns.ClassINET {
		return deny(dns.ExtendedErrorCodeNotSupported, textClass)
	}
	// An escape in the presentation form (a dot, space or control byte
	// inside a label) would make "x\.allowed.example" look like a name
	// under allowed.example while it is one under example: no real name
	// has one.
	if strings.IndexByte(name, '\\') >= 0 {
		return deny(dns.ExtendedErrorCodeBlocked, textEscape)
	}
	if ok, _, _ := sb.Policy().NamePorts(name); !ok {
		return deny(dns.ExtendedErrorCodeBlocked, textPolicy)
	}
	switch t := qs.Qtype; {
	case t == dns.TypeAAAA || t == dns.TypeHTTPS || t == dns.TypeSVCB:
		return r // NODATA
	case t == dns.TypeOPT || t >= 128 && t <= 255: // ANY, AXFR, IXFR, TSIG, ...
		r.Rcode = dns.RcodeNotImplemented
		return r
	}
	resp, err := p.resolve(ctx, qs)
	if err != nil {
		p.warnUpstream(err)
		r.Rcode = dns.RcodeServerFailure
		if opt := r.IsEdns0(); opt != nil {
			opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeNetworkError, ExtraText: textNetwork})
		}
		return r
	}
	r.Rcode = resp.Rcode
	if resp.Rcode != dns.RcodeSuccess && resp.Rcode != dns.RcodeNameError {
		return r
	}
	r.Answer = keepChain(resp.Answer, qs)
	for _, rr := range resp.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			r.Ns = append(r.Ns, soa) // for negative caching
		}
	}
	if len(r.Answer) == 0 {
		return r
	}
	ttl := r.Answer[0].Header().Ttl
	for _, rr := range r.Answer {
		ttl = min(ttl, rr.Header().Ttl)
	}
	ttl = min(ttl, uint32(netpolicy.MaxLearnTTL/time.Second))
	kept := r.Answer[:0]
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			addr, _ := netip.AddrFromSlice(a.A)
			if !sb.Learn(name, addr.Unmap(), time.Duration(ttl)*time.Second) {
				p.log.Debug("dns answer stripped", "sandbox", sb.ID, "name", name, "addr", addr)
				continue
			}
		}
		rr.Header().Ttl = ttl
		if strings.EqualFold(rr.Header().Name, qs.Name) {
			rr.Header().Name = qs.Name
		}
		kept = append(kept, rr)
	}
	r.Answer = kept
	return r
}

// maxChain bounds the CNAMEs followed from a question.
const maxChain = 16

// keepChain returns the CNAME chain from q's name in rrs and the records
// of q's type at its end: nothing else, whatever upstream added.
func keepChain(rrs []dns.RR, q dns.Question) []dns.RR {
	var out []dns.RR
	target := q.Name
	for range maxChain {
		next := ""
		for _, rr := range rrs {
			if c, ok := rr.(*dns.CNAME); ok && strings.EqualFold(c.Hdr.Name, target) {
				out = append(out, c)
				next = c.Target
				break
			}
		}
		if next == "" || q.Qtype == dns.TypeCNAME {
			break
		}
		target = next
	}
	if q.Qtype == dns.TypeCNAME {
		return out
	}
	for _, rr := range rrs {
		h := rr.Header()
		if h.Rrtype == q.Qtype && h.Class == dns.ClassINET && strings.EqualFold(h.Name, target) {
			out = append(out, rr)
		}
	}
	return out
}

// resolve answers q from the cache or upstream. The answer is the
// caller's to change.
func (p *Proxy) resolve(ctx context.Context, q dns.Question) (*dns.Msg, error) {
	key := cacheKey{name: canonName(q.Name), qtype: q.Qtype}
	now := time.Now()
	if p.cache != nil {
		if m := p.cache.get(key, now); m != nil {
			return m, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(p.cfg.Attempts)*2*p.cfg.Timeout)
	defer cancel()
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.Question = []dns.Question{{Name: q.Name, Qtype: q.Qtype, Qclass: dns.ClassINET}}
	m.SetEdns0(upstreamUDP, false)
	resp, err := p.exchange(ctx, m)
	if err != nil {
		return nil, err
	}
	if p.cache != nil {
		p.cache.put(key, resp, now)
	}
	return resp, nil
}

// warnUpstream logs an upstream failure at most every 10 seconds.
func (p *Proxy) warnUpstream(err error) {
	now := time.Now().UnixNano()
	last := p.warned.Load()
	if now-last < int64(10*time.Second) || !p.warned.CompareAndSwap(last, now) {
		return
	}
	p.log.Warn("dns upstream failed", "upstream", p.cfg.Upstream, "err", err)
}

// canonName is a name as policies spell it: lower case, no trailing dot.
func canonName(n string) string {
	return strings.TrimSuffix(strings.ToLower(n), ".")
}
