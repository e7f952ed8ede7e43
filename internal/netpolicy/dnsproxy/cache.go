package dnsproxy

import (
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenhq/warren/internal/netpolicy"
)

// cache holds upstream answers (before any sandbox's policy is applied)
// by lower-case name and type, for the smallest TTL in them.
type cache struct {
	mu  sync.Mutex
	max int
	m   map[cacheKey]*entry
}

type cacheKey struct {
	name  string
	qtype uint16
}

type entry struct {
	rcode   int
	answer  []dns.RR
	ns      []dns.RR
	stored  time.Time
	expires time.Time
}

func newCache(max int) *cache { return &cache{max: max, m: map[cacheKey]*entry{}} }

// get returns a copy of the answer under k with its TTLs lowered by the
// time it was held, or nil.
func (c *cache) get(k cacheKey, now time.Time) *dns.Msg {
	c.mu.Lock()
	e := c.m[k]
	if e != nil && !now.Before(e.expires) {
		delete(c.m, k)
		e = nil
	}
	c.mu.Unlock()
	if e == nil {
		return nil
	}
	age := uint32(now.Sub(e.stored) / time.Second)
	m := &dns.Msg{MsgHdr: dns.MsgHdr{Response: true, Rcode: e.rcode}}
	m.Answer = copyRRs(e.answer, age)
	m.Ns = copyRRs(e.ns, age)
	return m
}

func copyRRs(rrs []dns.RR, age uint32) []dns.RR {
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		out[i] = dns.Copy(rr)
		h := out[i].Header()
		h.Ttl -= min(h.Ttl, age)
	}
	return out
}

// put stores a copy of r, if it is an answer or a name error with a TTL.
// A negative answer is held for its SOA's TTL (RFC 2308).
func (c *cache) put(k cacheKey, r *dns.Msg, now time.Time) {
	if r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError || r.Truncated {
		return
	}
	ttl, ok := uint32(0), false
	for _, rr := range r.Answer {
		if !ok || rr.Header().Ttl < ttl {
			ttl, ok = rr.Header().Ttl, true
		}
	}
	var ns []dns.RR
	for _, rr := range r.Ns {
		soa, isSOA := rr.(*dns.SOA)
		if !isSOA {
			continue
		}
		ns = append(ns, soa)
		if len(r.Answer) == 0 {
			t := min(soa.Hdr.Ttl, soa.Minttl)
			if !ok || t < ttl {
				ttl, ok = t, true
			}
		}
	}
	if !ok || ttl == 0 {
		return
	}
	d := min(time.Duration(ttl)*time.Second, MaxCacheTTL)
	e := &entry{rcode: r.Rcode, answer: copyRRs(r.Answer, 0), ns: copyRRs(ns, 0), stored: now, expires: now.Add(d)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		c.evictLocked(now)
	}
	c.m[k] = e
}

// evictLocked drops the expired entries, and if that is not enough, an
// eighth of the others (the map's order is random enough).
func (c *cache) evictLocked(now time.Time) {
	for k, e := range c.m {
		if !now.Before(e.expires) {
			delete(c.m, k)
		}
	}
	if len(c.m) < c.max {
		return
	}
	drop := len(c.m) - c.max + max(1, c.max/8)
	for k := range c.m {
		if drop <= 0 {
			break
		}
		delete(c.m, k)
		drop--
	}
}

// limiter is a token bucket per sandbox.
type limiter struct {
	rate, burst float64

	mu        sync.Mutex
	m         map[*netpolicy.Sandbox]*bucket
	lastSweep time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

// allow takes a token of sb's bucket, if it has one.
func (l *limiter) allow(sb *netpolicy.Sandbox, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[*netpolicy.Sandbox]*bucket{}
	}
	// A bucket idle long enough to be full again is like none: drop it,
	// so that removed sandboxes are forgotten.
	full := time.Duration(l.burst / l.rate * float64(time.Second))
	if now.Sub(l.lastSweep) > max(full, time.Minute) {
		for s, b := range l.m {
			if now.Sub(b.last) > full {
				delete(l.m, s)
			}
		}
		l.lastSweep = now
	}
	b := l.m[sb]
	if b == nil {
		b = &bucket{tokens: l.burst, last: now}
		l.m[sb] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
