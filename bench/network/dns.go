package main

// The dns part of bench/network (runDNS): queries per second through the
// node's DNS proxy (internal/netpolicy/dnsproxy) against the same queries
// sent straight to its upstream, in one run on loopback.
//
// The upstream is a github.com/miekg/dns server on 127.0.0.1 that answers
// every A query for a name under bench.example with one address (TTL
// 300). The proxy serves on another 127.0.0.1 port; its one sandbox is
// 127.0.0.1 itself (the clients' source address), with the policy
// *.bench.example and no rate limit. Peers:
//
//   - direct: the queries sent to the upstream itself;
//   - proxy: through the proxy, cache on (after the first round of names,
//     answered from the cache, and every answer still learned for the
//     sandbox);
//   - proxy-nocache: through the proxy with its cache off, so every query
//     also goes upstream: the proxy's whole cost on top of direct.
//
// Each worker holds one connected UDP socket and sends A queries back to
// back (a fresh ID each, names cycling through dnsNames distinct names,
// each worker from its own offset), waiting for each answer (1 s
// timeout, checked for its ID and one address). For every concurrency
// and round, each peer (in an order rotated every round) gets a warm-up
// and then a window; the queries answered in it give queries/s, p50 and
// p99. CPU per query is this process's (clients, proxy and upstream all
// run in it) over the window. Ratios are each round's figure over
// direct's in the same round: their median and spread.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/netpolicy"
	"github.com/warrenhq/warren/internal/netpolicy/dnsproxy"
)

// dnsOptions are runDNS's knobs; dnsDefaults has the usual ones.
type dnsOptions struct {
	rounds    int
	dur, warm time.Duration
	conc      []int
}

func dnsDefaults() dnsOptions {
	return dnsOptions{rounds: 3, dur: 3 * time.Second, warm: 500 * time.Millisecond, conc: []int{1, 8, 64}}
}

// dnsNames is how many distinct names the queries cycle through.
const dnsNames = 1000

type dnsSample struct {
	n, failed int
	window    time.Duration
	rate      float64
	p50, p99  time.Duration
	cpu       time.Duration // per query
}

type dnsPeer struct {
	name, about string
	addr        string
}

// runDNS is the dns part: rounds rounds of dnsDefaults.
func runDNS(rounds int) error {
	o := dnsDefaults()
	o.rounds = rounds
	return runDNSWith(context.Background(), o)
}

// runDNSWith measures the DNS proxy against its upstream and prints the
// figures.
func runDNSWith(ctx context.Context, o dnsOptions) error {
	up, err := dnsUpstream()
	if err != nil {
		return err
	}
	defer up.Shutdown()
	upAddr := up.PacketConn.LocalAddr().String()

	pol, err := netpolicy.Parse(api.NetworkPolicy{Allow: []string{"*.bench.example"}})
	if err != nil {
		return err
	}
	var tb netpolicy.Table
	tb.Add(netpolicy.NewSandbox("bench", netip.MustParseAddr("127.0.0.1"), pol, nil, nil))
	var peers []dnsPeer
	peers = append(peers, dnsPeer{"direct", "A queries straight to the upstream: a miekg/dns server on " + upAddr, upAddr})
	for _, cache := range []int{0, -1} {
		p, err := dnsproxy.New(dnsproxy.Config{Upstream: upAddr, Lookup: tb.Lookup, CacheSize: cache,
			QueryRate: 1e9, QueryBurst: 1 << 30, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		go p.ServeUDP(pc)
		defer p.Close()
		name, about := "proxy", "through dnsproxy on "+pc.LocalAddr().String()+", cache on"
		if cache < 0 {
			name, about = "proxy-nocache", "through dnsproxy on "+pc.LocalAddr().String()+", cache off: every query also upstream"
		}
		peers = append(peers, dnsPeer{name, about, pc.LocalAddr().String()})
	}
	for _, p := range peers { // one query each, so a broken peer says so before any figure
		if err := dnsOnce(p.addr, 0); err != nil {
			return fmt.Errorf("peer %s: %w", p.name, err)
		}
	}

	fmt.Printf("\nbench/network dns: %d rounds; per peer and concurrency a %s window after %s of warm-up; %d names; %s\n",
		o.rounds, o.dur, o.warm, dnsNames, time.Now().UTC().Format(time.RFC3339))
	for _, p := range peers {
		fmt.Printf("peer %-13s %s\n", p.name, p.about)
	}
	res := map[string][]dnsSample{}
	key := func(c int, p dnsPeer) string { return strconv.Itoa(c) + "/" + p.name }
	for r := range o.rounds {
		for _, c := range o.conc {
			for i := range peers {
				p := peers[(i+r)%len(peers)]
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s := dnsDrive(ctx, p.addr, c, o.warm, o.dur)
				res[key(c, p)] = append(res[key(c, p)], s)
				fmt.Fprintf(os.Stderr, "round %d dns c%-3d %-13s %9.0f queries/s p50 %6.3fms p99 %6.3fms failed %d\n",
					r+1, c, p.name, s.rate, dnsMS(s.p50), dnsMS(s.p99), s.failed)
			}
		}
	}
	rate := func(s dnsSample) float64 { return s.rate }
	p50 := func(s dnsSample) float64 { return dnsMS(s.p50) }
	p99 := func(s dnsSample) float64 { return dnsMS(s.p99) }
	cpu := func(s dnsSample) float64 { return float64(s.cpu) / float64(time.Microsecond) }
	for _, c := range o.conc {
		fmt.Printf("\ndns c%-4d %-13s %24s %22s %22s %7s %20s\n", c, "", "queries/s", "p50", "p99", "failed", "cpu/query")
		for _, p := range peers {
			ss := res[key(c, p)]
			failed := 0
			for _, s := range ss {
				failed += s.failed
			}
			fmt.Printf("     %-18s %24s %22s %22s %7d %20s\n", p.name, dnsSpread(ss, rate, "%.0f"),
				dnsSpread(ss, p50, "%.3fms"), dnsSpread(ss, p99, "%.3fms"), failed, dnsSpread(ss, cpu, "%.1fus"))
		}
		base := res[key(c, peers[0])]
		for _, p := range peers[1:] {
			ss := res[key(c, p)]
			fmt.Printf("     %-18s throughput %s   p50 %s   p99 %s   cpu/query %s\n", p.name+"/direct",
				dnsPaired(ss, base, rate), dnsPaired(ss, base, p50), dnsPaired(ss, base, p99), dnsPaired(ss, base, cpu))
		}
	}
	return nil
}

// dnsUpstream starts the upstream on 127.0.0.1.
func dnsUpstream() (*dns.Server, error) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			r.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
				A: net.IPv4(203, 0, 113, byte(len(q.Question[0].Name)))}}
		}
		w.WriteMsg(r)
	})
	s := &dns.Server{PacketConn: pc, Handler: h}
	started := make(chan struct{})
	s.NotifyStartedFunc = func() { close(started) }
	go s.ActivateAndServe()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		return nil, errors.New("dns upstream did not start")
	}
	return s, nil
}

// dnsQueries are the packed queries, one per name (IDs set per send).
var dnsQueries = func() [][]byte {
	out := make([][]byte, dnsNames)
	for i := range out {
		m := new(dns.Msg)
		m.SetQuestion("n"+strconv.Itoa(i)+".bench.example.", dns.TypeA)
		out[i], _ = m.Pack()
	}
	return out
}()

// dnsOnce sends query i on a new socket and checks the answer.
func dnsOnce(addr string, i int) error {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = dnsAsk(c, make([]byte, 1500), i, 1)
	return err
}

// dnsAsk sends query i with id on c and waits for its answer.
func dnsAsk(c net.Conn, buf []byte, i int, id uint16) (time.Duration, error) {
	q := append([]byte(nil), dnsQueries[i%dnsNames]...)
	q[0], q[1] = byte(id>>8), byte(id)
	start := time.Now()
	c.SetDeadline(start.Add(time.Second))
	if _, err := c.Write(q); err != nil {
		return 0, err
	}
	for {
		n, err := c.Read(buf)
		if err != nil {
			return 0, err
		}
		if n < 12 || buf[0] != q[0] || buf[1] != q[1] {
			continue // a late answer to an earlier, timed-out query
		}
		if buf[3]&0xF != 0 || buf[6] != 0 || buf[7] != 1 {
			return 0, fmt.Errorf("answer rcode %d, %d records", buf[3]&0xF, int(buf[6])<<8|int(buf[7]))
		}
		return time.Since(start), nil
	}
}

// dnsDrive runs conc workers querying addr back to back: warm, then a
// window of dur.
func dnsDrive(ctx context.Context, addr string, conc int, warm, dur time.Duration) dnsSample {
	var (
		mu       sync.Mutex
		lat      []time.Duration
		s        dnsSample
		counting atomic.Bool
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("udp4", addr)
			if err != nil {
				mu.Lock()
				s.failed++
				mu.Unlock()
				return
			}
			defer c.Close()
			buf := make([]byte, 1500)
			var mine []time.Duration
			failed := 0
			for i := w * (dnsNames / max(conc, 1)); !stop.Load() && ctx.Err() == nil; i++ {
				d, err := dnsAsk(c, buf, i, uint16(i))
				if !counting.Load() {
					continue
				}
				if err != nil {
					failed++
					continue
				}
				mine = append(mine, d)
			}
			mu.Lock()
			lat = append(lat, mine...)
			s.failed += failed
			mu.Unlock()
		}()
	}
	time.Sleep(warm)
	cpu0, t0 := dnsCPU(), time.Now()
	counting.Store(true)
	time.Sleep(dur)
	counting.Store(false)
	cpu1, t1 := dnsCPU(), time.Now()
	stop.Store(true)
	wg.Wait()
	s.n, s.window = len(lat), t1.Sub(t0)
	s.rate = float64(s.n) / s.window.Seconds()
	if s.n > 0 {
		s.cpu = (cpu1 - cpu0) / time.Duration(s.n)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		s.p50, s.p99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return s
}

// dnsCPU is this process's user and system time so far.
func dnsCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func dnsMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func dnsValues(ss []dnsSample, f func(dnsSample) float64) []float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	sort.Float64s(v)
	return v
}

// dnsMedian is the middle of sorted v, or the mean of the two middle
// ones.
func dnsMedian(v []float64) float64 {
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}

// dnsSpread prints "median (min-max)".
func dnsSpread(ss []dnsSample, f func(dnsSample) float64, format string) string {
	if len(ss) == 0 {
		return "-"
	}
	v := dnsValues(ss, f)
	return fmt.Sprintf(format+" ("+format+"-"+format+")", dnsMedian(v), v[0], v[len(v)-1])
}

// dnsPaired prints the median and spread of ss's figures over base's,
// round by round ("0.81x (0.78-0.84)").
func dnsPaired(ss, base []dnsSample, f func(dnsSample) float64) string {
	if len(ss) == 0 || len(ss) != len(base) {
		return "-"
	}
	r := make([]float64, len(ss))
	for i := range ss {
		r[i] = f(ss[i]) / f(base[i])
	}
	sort.Float64s(r)
	if len(r) == 1 {
		return fmt.Sprintf("%.2fx", r[0])
	}
	return fmt.Sprintf("%.2fx (%.2f-%.2f)", dnsMedian(r), r[0], r[len(r)-1])
}
