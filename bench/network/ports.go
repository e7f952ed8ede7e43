package main

// The ports part: HTTP requests to a server inside a sandbox with no
// network, by three peers over kept-alive connections, measured in the
// same rounds:
//
//   - direct: this process connects to the server itself, from inside the
//     sandbox's network namespace (internal/netns, as the node does):
//     the server's own cost, and the floor of the other two.
//   - ports: through the API, GET /v1/sandboxes/{id}/ports/8000/... (the
//     apiserver, the node's reverse proxy and its kept connections into
//     the sandbox).
//   - port-forward: through a local port that client.ForwardPort serves
//     (what `warren port-forward` runs): each kept connection is one
//     tunnel through the API to the server.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/internal/netns"
)

const serverPort = 8000

type portPeer struct {
	name string
	url  string
	hc   *http.Client
	auth string // Authorization header, if any
}

// The ports part's own flags (main parses them).
var (
	portsDur  = flag.Duration("ports-dur", 5*time.Second, "ports: measured window per peer, concurrency and round")
	portsWarm = flag.Duration("ports-warm", time.Second, "ports: warm-up before each window")
	portsConc = flag.String("ports-conc", "1,8", "ports: concurrencies (workers sending requests back to back)")
	portsSize = flag.Int("ports-size", 64, "ports: response body size in bytes")
	portsKeep = flag.Bool("ports-keep", false, "ports: keep the temporary dir")
)

type config struct {
	rounds    int
	dur, warm time.Duration
	conc      []int
	size      int // response body, bytes
	keep      bool
}

func runPorts(rounds int) error {
	cfg := config{rounds: rounds, dur: *portsDur, warm: *portsWarm, size: *portsSize, keep: *portsKeep}
	for _, s := range strings.Split(*portsConc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-ports-conc %q: want positive numbers", *portsConc)
		}
		cfg.conc = append(cfg.conc, n)
	}
	if os.Geteuid() != 0 {
		return errors.New("ports: needs root (containers, network namespaces)")
	}
	dir, err := benchup.TempDir("warren-bench-network-")
	if err != nil {
		return err
	}
	if !cfg.keep {
		defer os.RemoveAll(dir)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	server := filepath.Join(dir, "portserver")
	build := exec.Command("go", "build", "-o", server, "github.com/warrenhq/warren/bench/network/portserver")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build portserver: %v: %s", err, out)
	}
	c, err := upWarren(ctx, filepath.Join(dir, "warren"), nil)
	if err != nil {
		return err
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{CPU: 2, Memory: 256 << 20}})
	if err != nil {
		return err
	}
	defer c.DeleteSandbox(context.Background(), sb.ID)
	bin, err := os.ReadFile(server)
	if err != nil {
		return err
	}
	if err := c.WriteFile(ctx, sb.ID, "/portserver", 0o755, strings.NewReader(string(bin))); err != nil {
		return err
	}
	tag := fmt.Sprintf("bench-%d", os.Getpid())
	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: fmt.Sprintf("(/portserver 127.0.0.1:%d %s </dev/null >/dev/null 2>&1 &)", serverPort, tag)})
	if err != nil || res.ExitCode != 0 {
		return fmt.Errorf("start portserver: %v %+v", err, res)
	}
	ns, err := netnsOf(tag)
	if err != nil {
		return err
	}
	defer ns.Close()

	path := "/bytes?n=" + strconv.Itoa(cfg.size)
	transport := func(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
		return &http.Client{Transport: &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 1024, DisableCompression: true}}
	}
	plain := (&net.Dialer{}).DialContext
	direct := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return netns.Dial(ctx, ns, "tcp", "127.0.0.1:"+strconv.Itoa(serverPort))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go c.ForwardPort(ctx, ln, sb.ID, serverPort, func(err error) { fmt.Fprintln(os.Stderr, "port-forward:", err) })
	token, err := os.ReadFile(filepath.Join(dir, "warren", "admin-token"))
	if err != nil {
		return err
	}
	peers := []portPeer{
		{"direct", "http://sandbox" + path, transport(direct), ""},
		{"ports", c.PortURL(sb.ID, serverPort, path), transport(plain), "Bearer " + strings.TrimSpace(string(token))},
		{"port-forward", "http://" + ln.Addr().String() + path, transport(plain), ""},
	}
	for _, p := range peers { // each answers before anything is timed
		if err := p.get(ctx, cfg.size); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}

	fmt.Printf("bench/network ports: %d rounds, %v windows (%v warm-up), concurrency %v, %d-byte answers, %s\n",
		cfg.rounds, cfg.dur, cfg.warm, cfg.conc, cfg.size, time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("server: portserver (Go net/http) in a container sandbox with no network; every peer keeps its connections alive\n" +
		"peers: direct = this process, from inside the sandbox's network namespace; ports = GET /v1/sandboxes/ID/ports/8000/...;\n" +
		"       port-forward = a local port served by client.ForwardPort (warren port-forward), a tunnel per connection\n")
	results := map[string][]portSample{}
	for r := 0; r < cfg.rounds; r++ {
		for _, conc := range cfg.conc {
			for i := range peers {
				p := peers[(i+r)%len(peers)] // rotated: drift favours nobody
				s := p.drive(ctx, conc, cfg.warm, cfg.dur, cfg.size)
				if s.failed > 0 {
					return fmt.Errorf("%s c%d: %d requests failed, the first: %s", p.name, conc, s.failed, s.firstErr)
				}
				k := fmt.Sprintf("%s c%d", p.name, conc)
				results[k] = append(results[k], s)
			}
		}
	}
	rate := func(s portSample) float64 { return s.rate }
	p50 := func(s portSample) float64 { return us(s.p50) }
	p99 := func(s portSample) float64 { return us(s.p99) }
	for _, conc := range cfg.conc {
		fmt.Printf("\nc%-3d %-13s %22s %22s %22s\n", conc, "", "requests/s", "p50", "p99")
		for _, p := range peers {
			ss := results[fmt.Sprintf("%s c%d", p.name, conc)]
			fmt.Printf("     %-13s %22s %22s %22s\n", p.name, medianSpread(of(ss, rate), "%.0f"),
				medianSpread(of(ss, p50), "%.0fµs"), medianSpread(of(ss, p99), "%.0fµs"))
		}
		d := results[fmt.Sprintf("direct c%d", conc)]
		for _, p := range peers[1:] {
			ss := results[fmt.Sprintf("%s c%d", p.name, conc)]
			ratio := func(f func(portSample) float64) float64 { return median(of(ss, f)) / median(of(d, f)) }
			fmt.Printf("     %-13s / direct: requests/s %.2fx   p50 %.2fx   p99 %.2fx\n", p.name, ratio(rate), ratio(p50), ratio(p99))
		}
	}
	return nil
}

// of is f of each sample.
func of(ss []portSample, f func(portSample) float64) []float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	return v
}

// netnsOf opens the network namespace of the process whose command line
// holds tag.
func netnsOf(tag string) (*os.File, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, err := os.ReadFile(p)
			if err == nil && strings.Contains(string(b), "\x00"+tag) {
				return os.Open(filepath.Join(filepath.Dir(p), "ns", "net"))
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no process tagged %s: portserver did not start", tag)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p portPeer) get(ctx context.Context, size int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return err
	}
	if p.auth != "" {
		req.Header.Set("Authorization", p.auth)
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || n != int64(size) {
		return fmt.Errorf("status %d, %d bytes; want 200 and %d", resp.StatusCode, n, size)
	}
	return nil
}

// portSample is one peer's figures at one concurrency in one round.
type portSample struct {
	rate     float64 // requests that ended in the window, per second
	p50, p99 time.Duration
	failed   int
	firstErr string
}

// drive runs conc workers sending requests back to back: a warm-up, then
// a window of dur whose requests give the figures (those that end in it).
func (p portPeer) drive(ctx context.Context, conc int, warm, dur time.Duration, size int) portSample {
	var (
		mu       sync.Mutex
		lat      []time.Duration
		s        portSample
		measure  atomic.Bool
		stop     atomic.Bool
		wg       sync.WaitGroup
		inWindow atomic.Int64
	)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for !stop.Load() {
				t := time.Now()
				err := p.get(ctx, size)
				d := time.Since(t)
				if err != nil {
					mu.Lock()
					if s.failed++; s.firstErr == "" {
						s.firstErr = err.Error()
					}
					mu.Unlock()
					continue
				}
				if measure.Load() && !stop.Load() {
					mine = append(mine, d)
					inWindow.Add(1)
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	time.Sleep(warm)
	measure.Store(true)
	from := time.Now()
	time.Sleep(dur)
	stop.Store(true)
	window := time.Since(from)
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	s.rate = float64(inWindow.Load()) / window.Seconds()
	if len(lat) > 0 {
		s.p50 = lat[len(lat)/2]
		s.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return s
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
