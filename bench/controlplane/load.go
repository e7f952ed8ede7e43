package main

import (
	"context"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// sdkDefaultTransport makes newClient use the SDK's default HTTP client
// (-sdk-default-transport), to see what it costs.
var sdkDefaultTransport bool

// newClient returns a Go SDK client that keeps one connection per worker
// alive (client.New's default, http.DefaultTransport, keeps 2 idle per
// host, so 256 workers would dial a new connection for most calls) and
// does not retry refusals: a 429 is counted as an error, not hidden in a
// latency.
func newClient(addr, token string, conc int) *client.Client {
	if sdkDefaultTransport {
		return client.New(addr, token, client.WithCreateRetry(client.RetryPolicy{}))
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        conc + 16,
		MaxIdleConnsPerHost: conc + 16,
		IdleConnTimeout:     90 * time.Second,
	}
	return client.New(addr, token, client.WithHTTPClient(&http.Client{Transport: tr}),
		client.WithCreateRetry(client.RetryPolicy{}))
}

// createReq is every create of the run: a small sandbox of the busybox
// environment, resolved by name (its latest version) on every create.
var createReq = api.CreateSandboxRequest{
	Image:     "busybox",
	Resources: api.Resources{CPU: 0.25, Memory: 256 << 20},
	Labels:    map[string]string{"bench": "controlplane"},
}

// sample is one peer's figures at one concurrency in one round.
type sample struct {
	n        int           // creates completed in the window
	errs     int           // creates failed in the window
	firstErr string        // one of those errors
	window   time.Duration // the measured window
	rate     float64       // creates/s
	p50, p99 time.Duration
	cpu      map[string]time.Duration // CPU each process used in the window
	others   time.Duration            // CPU the other peers' processes used
	busy     time.Duration            // CPU the whole machine used
	perNode  map[string]int           // creates per node, warm-up included
}

// drive runs conc workers that create back to back for warm+dur and
// measures the creates that complete within [warm, warm+dur]. The CPU
// time of procs (name -> pid) is read at both ends of the window.
//
// others are the pids of the run's other processes (the other peers'):
// their CPU in the window is what the peer did not get of the machine
// from the benchmark itself.
func drive(ctx context.Context, c *client.Client, conc int, warm, dur time.Duration, procs map[string]int, others []int) sample {
	start := time.Now()
	from, to := start.Add(warm), start.Add(warm+dur)
	cpu0 := make(chan map[string]time.Duration, 1)
	cpu1 := make(chan map[string]time.Duration, 1)
	var others0, others1, busy0, busy1 time.Duration
	go func() {
		time.Sleep(time.Until(from))
		others0, busy0 = sumCPU(others), machineBusy()
		cpu0 <- cpuTimes(procs)
		time.Sleep(time.Until(to))
		others1, busy1 = sumCPU(others), machineBusy()
		cpu1 <- cpuTimes(procs)
	}()

	var (
		mu       sync.Mutex
		lat      []time.Duration
		s        = sample{perNode: map[string]int{}}
		firstErr error
	)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			nodes := map[string]int{}
			errs := 0
			var werr error
			for {
				t := time.Now()
				if !t.Before(to) || ctx.Err() != nil {
					break
				}
				sb, err := c.CreateSandbox(ctx, createReq)
				end := time.Now()
				in := !end.Before(from) && !end.After(to)
				if err != nil {
					if in {
						errs++
						if werr == nil {
							werr = err
						}
					}
					continue
				}
				nodes[sb.Node]++
				if in {
					mine = append(mine, end.Sub(t))
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			for n, k := range nodes {
				s.perNode[n] += k
			}
			s.errs += errs
			if firstErr == nil && werr != nil {
				firstErr = werr
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	c0, c1 := <-cpu0, <-cpu1
	s.others = others1 - others0
	s.busy = busy1 - busy0
	s.cpu = map[string]time.Duration{}
	for name := range procs {
		s.cpu[name] = c1[name] - c0[name]
	}
	s.window = dur
	s.n = len(lat)
	s.rate = float64(s.n) / dur.Seconds()
	if firstErr != nil {
		s.firstErr = firstErr.Error()
	}
	if len(lat) > 0 {
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		s.p50 = lat[len(lat)/2]
		s.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return s
}

func sumCPU(pids []int) time.Duration {
	var t time.Duration
	for _, pid := range pids {
		t += cpuTime(pid)
	}
	return t
}

func cpuTimes(procs map[string]int) map[string]time.Duration {
	m := make(map[string]time.Duration, len(procs))
	for name, pid := range procs {
		m[name] = cpuTime(pid)
	}
	return m
}

// createN makes n creates through c, conc at a time, and returns how many
// went to each node; the first error ends it.
func createN(ctx context.Context, c *client.Client, conc, n int) (map[string]int, error) {
	var (
		mu      sync.Mutex
		perNode = map[string]int{}
		left    = n
		first   error
	)
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				mu.Lock()
				if left == 0 || first != nil {
					mu.Unlock()
					return
				}
				left--
				mu.Unlock()
				sb, err := c.CreateSandbox(ctx, createReq)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				} else if err == nil {
					perNode[sb.Node]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return perNode, first
}

// imbalance is max/mean of the creates per node over all n nodes (nodes
// that got none count as 0).
func imbalance(perNode map[string]int, n int) float64 {
	total, most := 0, 0
	for _, k := range perNode {
		total += k
		most = max(most, k)
	}
	if total == 0 {
		return 0
	}
	return float64(most) / (float64(total) / float64(n))
}
