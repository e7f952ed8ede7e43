// Command controlplane measures how many sandbox creates per second one
// apiserver sustains over a fleet of 160 simulated nodes on this machine,
// at what latency, and how evenly placement spreads them.
//
//	go run ./bench/controlplane          # 3 rounds of 5 s per level and peer, ~4 min
//	go run ./bench/controlplane -short   # 1 round of 2 s, under a minute
//
// Every part runs in its own process (this binary re-executed in a role),
// so that each one's CPU time is its own, and every hop is real HTTP on a
// real listener. Peers, measured in the same run, in rotated order:
//
//   - warren: an embedded etcd member; `warren apiserver` over it; one
//     process of -nodes `warren agent`s with the fake backend, each on its
//     own listener and data dir (on /dev/shm), registered through etcd.
//     The load generator (this process) creates through the Go SDK with a
//     runner token of a project with a large quota and rate limit, so each
//     create takes the normal path: authentication, rate limit, quota
//     reservation, image resolution, power-of-k placement, the node API
//     call, the node's admission, records and backend.
//   - warren-bn: the same apiserver code over its own etcd and -nodes bare
//     nodes: listeners that register like agents, answer polls and
//     changes, and answer a create with a made-up sandbox, no disk. What
//     is left is the apiserver and the load generator.
//   - relay: a bare relay over the same bare nodes: it checks one bearer
//     secret, decodes the create, posts it to a random node and relays the
//     answer. Two hops of HTTP/1.1 and JSON and nothing else: the floor
//     under any control plane of this shape.
//
// Each level is a warm-up and a measured window of back-to-back creates
// from c workers; the CPU time of each process is read at both ends of the
// window. The agents' sandboxes stay (deleting them costs the fake backend
// a /proc scan each); the bare nodes forget theirs after each level.
//
// Balance: placement.Simulate (random, k=2, k=3 and the all-nodes oracle
// over the same arrivals, one seed per round); the creates per node of
// each warren level; and, on a real fleet view, warren-bn's apiserver
// restarted with each strategy and filled from empty nodes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/placement"
)

func main() {
	var f roleFlags
	role := flag.String("role", "", "internal: run as this role (etcd, apiserver, agents, relay, barenodes)")
	flag.StringVar(&f.dir, "dir", "", "internal: the role's directory")
	flag.StringVar(&f.etcd, "etcd", "", "internal: etcd client URL")
	flag.StringVar(&f.token, "token", "", "internal: node token or relay secret")
	flag.StringVar(&f.addrs, "addrs", "", "internal: node addresses of the relay")
	flag.StringVar(&f.blobs, "blobs", "", "internal: the shared blob store directory")

	nodes := flag.Int("nodes", 160, "simulated nodes (one DSec unit: 160)")
	levels := flag.String("c", "16,64,256", "client concurrencies, comma-separated")
	rounds := flag.Int("rounds", 3, "rounds (median and spread over them)")
	dur := flag.Duration("duration", 5*time.Second, "measured window per level and peer")
	warm := flag.Duration("warm", time.Second, "unmeasured warm-up before each window")
	short := flag.Bool("short", false, "quick run: 1 round, 2 s windows, 500 ms warm-up, 20 sandboxes per node for balance (under a minute)")
	strategy := flag.String("strategy", string(placement.PowerOfK), "the apiserver's placement strategy (power-of-k, oracle, random)")
	k := flag.Int("k", 2, "nodes sampled per placement (power-of-k)")
	profile := flag.String("profile", "", "after the rounds, run the highest level once more through warren and warren-bn and write CPU profiles of their apiservers and nodes here")
	nodeDir := flag.String("node-dir", defaultNodeDir(), "where the simulated nodes keep their state (a tmpfs: their disks are not what is measured)")
	simPlacements := flag.Int("sim-placements", 50_000, "arrivals per placement simulation")
	balancePerNode := flag.Int("balance-per-node", 50, "sandboxes per node in each strategy's run on the real fleet view")
	keep := flag.Bool("keep", false, "keep the temp dir (logs)")
	flag.BoolVar(&sdkDefaultTransport, "sdk-default-transport", false, "load through client.New's default HTTP client (2 idle connections per host) instead of one connection per worker")
	flag.IntVar(&f.nodes, "n", 0, "internal: nodes of this role")
	flag.StringVar(&f.strategy, "s", "", "internal: placement strategy")
	flag.IntVar(&f.k, "kk", 0, "internal: placement k")
	flag.Parse()

	if *role != "" {
		os.Exit(runRole(*role, f))
	}
	if *short {
		*rounds, *dur, *warm, *balancePerNode = 1, 2*time.Second, 500*time.Millisecond, 20
	}
	var conc []int
	for _, s := range strings.Split(*levels, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 {
			fmt.Fprintf(os.Stderr, "bench/controlplane: -c %q: want positive integers\n", *levels)
			os.Exit(2)
		}
		conc = append(conc, c)
	}
	cfg := config{nodes: *nodes, conc: conc, rounds: *rounds, dur: *dur, warm: *warm,
		strategy: *strategy, k: *k, profile: *profile, nodeDir: *nodeDir, simPlacements: *simPlacements, balancePerNode: *balancePerNode, keep: *keep}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench/controlplane:", err)
		os.Exit(1)
	}
}

type config struct {
	nodes          int
	conc           []int
	rounds         int
	dur, warm      time.Duration
	strategy       string
	k              int
	profile        string
	nodeDir        string
	simPlacements  int
	balancePerNode int
	keep           bool
}

// peer is one system under load: where the load generator sends creates,
// and which processes do the work.
type peer struct {
	name   string
	client func(conc int) *client.Client
	procs  map[string]int // name -> pid, the driver included
	server string         // the process that takes the HTTP edge
	// reset, if set, empties its nodes after each level (the bare nodes);
	// the agents' sandboxes stay (see run).
	reset func() error
}

func run(cfg config) error {
	began := time.Now()
	dir, err := os.MkdirTemp("", "warren-bench-controlplane-")
	if err != nil {
		return err
	}
	if cfg.keep {
		fmt.Println("temp dir (kept):", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	nodeDir := dir
	if cfg.nodeDir != "" {
		if nodeDir, err = os.MkdirTemp(cfg.nodeDir, "warren-bench-nodes-"); err != nil {
			return err
		}
		if !cfg.keep {
			defer os.RemoveAll(nodeDir)
		}
	}
	blobs := filepath.Join(dir, "blobs")
	// An interrupted run still stops its children and removes its dirs.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var children []*child
	defer func() {
		for i := len(children) - 1; i >= 0; i-- {
			children[i].stop()
		}
	}()
	start := func(d, role string, args ...string) (*child, error) {
		c, err := startChild(d, role, 2*time.Minute, args...)
		if err == nil {
			children = append(children, c)
		}
		return c, err
	}

	etcd, err := start(dir, "etcd")
	if err != nil {
		return err
	}
	apisrv, err := start(dir, "apiserver", "-etcd", etcd.ready.Addr, "-blobs", blobs, "-s", cfg.strategy, "-kk", strconv.Itoa(cfg.k))
	if err != nil {
		return err
	}
	admin, err := readSecret(filepath.Join(dir, "apiserver", "admin-token"))
	if err != nil {
		return err
	}
	nodeTok, err := readSecret(filepath.Join(dir, "apiserver", "node-token"))
	if err != nil {
		return err
	}
	agents, err := start(nodeDir, "agents", "-etcd", etcd.ready.Addr, "-token", nodeTok, "-blobs", blobs, "-n", strconv.Itoa(cfg.nodes))
	if err != nil {
		return err
	}
	// The second fleet: the same apiserver over its own etcd and bare
	// nodes, which the relay shares.
	bareDir := filepath.Join(dir, "bare")
	if err := os.MkdirAll(bareDir, 0o700); err != nil {
		return err
	}
	etcd2, err := start(bareDir, "etcd")
	if err != nil {
		return err
	}
	apisrv2, err := start(bareDir, "apiserver", "-etcd", etcd2.ready.Addr, "-blobs", filepath.Join(bareDir, "blobs"),
		"-s", cfg.strategy, "-kk", strconv.Itoa(cfg.k))
	if err != nil {
		return err
	}
	admin2, err := readSecret(filepath.Join(bareDir, "apiserver", "admin-token"))
	if err != nil {
		return err
	}
	relaySecret := "wrn_relay_" + randomSuffix()
	bare, err := start(bareDir, "barenodes", "-token", relaySecret, "-etcd", etcd2.ready.Addr, "-n", strconv.Itoa(cfg.nodes))
	if err != nil {
		return err
	}
	relay, err := start(bareDir, "relay", "-token", relaySecret, "-addrs", strings.Join(bare.ready.Addrs, ","))
	if err != nil {
		return err
	}

	apiURL, apiURL2 := "http://"+apisrv.ready.Addr, "http://"+apisrv2.ready.Addr
	runner, err := setupProject(ctx, apiURL, admin, cfg.nodes)
	if err != nil {
		return err
	}
	runner2, err := setupProject(ctx, apiURL2, admin2, cfg.nodes)
	if err != nil {
		return err
	}

	setup := time.Since(began)
	me := os.Getpid()
	peers := []peer{
		{name: "warren", server: "apiserver",
			client: func(c int) *client.Client { return newClient(apiURL, runner, c) },
			procs:  map[string]int{"driver": me, "apiserver": apisrv.pid(), "agents": agents.pid(), "etcd": etcd.pid()}},
		{name: "warren-bn", server: "apiserver", reset: func() error { return resetBare(bare.ready.Addrs, relaySecret) },
			client: func(c int) *client.Client { return newClient(apiURL2, runner2, c) },
			procs:  map[string]int{"driver": me, "apiserver": apisrv2.pid(), "barenodes": bare.pid(), "etcd": etcd2.pid()}},
		{name: "relay", server: "relay",
			client: func(c int) *client.Client { return newClient("http://"+relay.ready.Addr, relaySecret, c) },
			procs:  map[string]int{"driver": me, "relay": relay.pid(), "barenodes": bare.pid()}},
	}

	fmt.Printf("bench/controlplane: %d nodes, concurrency %v, %d rounds of %v (+%v warm-up) per level and peer, %s\n",
		cfg.nodes, cfg.conc, cfg.rounds, cfg.dur, cfg.warm, time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("placement %s k=%d; node state in %s; setup took %v\n", cfg.strategy, cfg.k, nodeDir, setup.Round(100*time.Millisecond))
	fmt.Println("peers: warren    = Go SDK -> apiserver (runner token, rate limit, quota, image, placement) -> node API -> agent (fake backend)")
	fmt.Println("       warren-bn = the same apiserver, over its own etcd and bare nodes (made-up answers, no disk)")
	fmt.Println("       relay     = Go SDK -> bare relay (bearer check, JSON) -> the same bare nodes: two hops, nothing else")

	// Warm-up, unmeasured: every node fetches the busybox layer into its
	// cache on its first create, and connections get made.
	//
	// The agents' sandboxes are never deleted during the run: a delete on
	// the fake backend scans /proc for the sandbox's processes (~6 ms
	// here), so deleting a level's sandboxes would take longer than making
	// them. They stay, as a fleet's live sandboxes do (a full run leaves
	// ~100k); the bare nodes forget theirs after each level.
	for _, p := range peers {
		s := drive(ctx, p.client(64), 64, 0, 2*time.Second, nil, nil)
		if s.n == 0 {
			return fmt.Errorf("warm-up through %s created nothing: %s", p.name, s.firstErr)
		}
		if p.reset != nil {
			if err := p.reset(); err != nil {
				return err
			}
		}
	}

	results := map[string][]sample{} // peer/level -> one per round
	for r := range cfg.rounds {
		for _, c := range cfg.conc {
			for i := range peers {
				p := peers[(i+r)%len(peers)] // rotate who goes first
				s := drive(ctx, p.client(c), c, cfg.warm, cfg.dur, p.procs, otherPids(peers, p))
				if err := ctx.Err(); err != nil {
					return err
				}
				key := fmt.Sprintf("%s/%d", p.name, c)
				results[key] = append(results[key], s)
				fmt.Printf("round %d  c%-4d %-9s %6.0f creates/s  p50 %7s  p99 %7s  errors %d  imbalance %.3f  cores %s\n",
					r+1, c, p.name, s.rate, fmtDur(s.p50), fmtDur(s.p99), s.errs, imbalance(s.perNode, cfg.nodes), cores(s))
				if s.firstErr != "" {
					fmt.Printf("           first error: %s\n", s.firstErr)
				}
				if p.reset != nil {
					if err := p.reset(); err != nil {
						return err
					}
				}
			}
		}
	}

	if cfg.profile != "" {
		if err := profileRun(ctx, cfg, peers[0], "", apisrv, agents); err != nil {
			return err
		}
		if err := profileRun(ctx, cfg, peers[1], "bn-", apisrv2, bare); err != nil {
			return err
		}
	}
	// Placement on a real fleet view: the bare nodes' apiserver restarted
	// with each strategy in turn, from empty nodes.
	apiArgs := []string{"-etcd", etcd2.ready.Addr, "-blobs", filepath.Join(bareDir, "blobs")}
	balance, err := strategyRuns(ctx, cfg, apisrv2, func(strategy string, k int) (*child, error) {
		if err := resetBare(bare.ready.Addrs, relaySecret); err != nil {
			return nil, err
		}
		return start(bareDir, "apiserver", append(apiArgs, "-s", strategy, "-kk", strconv.Itoa(k))...)
	}, func(addr string) *client.Client { return newClient("http://"+addr, runner2, 64) },
		func() error { return resetBare(bare.ready.Addrs, relaySecret) })
	if err != nil {
		return err
	}
	for i := len(children) - 1; i >= 0; i-- {
		children[i].stop()
	}
	children = nil

	report(cfg, peers, results)
	reportBalance(cfg, balance)
	if err := simulate(cfg); err != nil {
		return err
	}
	fmt.Printf("\nwhole run %v\n", time.Since(began).Round(time.Second))
	return nil
}

// strategies are the placement strategies compared, in placement.Simulate
// and on the real fleet.
var strategies = []struct {
	name     string
	strategy placement.Strategy
	k        int
}{
	{"random", placement.Random, 1},
	{"k=2", placement.PowerOfK, 2},
	{"k=3", placement.PowerOfK, 3},
	{"oracle", placement.Oracle, 1},
}

// fleetBalance is one strategy's sandboxes per node on the real fleet
// view, one figure per round.
type fleetBalance struct {
	name      string
	imbalance []float64 // max/mean
}

// strategyRuns stops the apiserver cur and, for each strategy, starts one
// with it (restart, which also empties the nodes), and creates
// cfg.balancePerNode sandboxes per node through it, 64 at a time, once per
// round (emptying the nodes in between).
func strategyRuns(ctx context.Context, cfg config, cur *child, restart func(string, int) (*child, error),
	newC func(addr string) *client.Client, reset func() error) ([]fleetBalance, error) {
	out := make([]fleetBalance, len(strategies))
	for i, st := range strategies {
		cur.stop()
		var err error
		if cur, err = restart(string(st.strategy), st.k); err != nil {
			return nil, err
		}
		c := newC(cur.ready.Addr)
		if err := waitNodes(ctx, c, cfg.nodes, time.Minute); err != nil {
			return nil, err
		}
		out[i].name = st.name
		for r := range cfg.rounds {
			if r > 0 {
				if err := reset(); err != nil {
					return nil, err
				}
				time.Sleep(1500 * time.Millisecond) // a poll: the fleet view sees them empty
			}
			perNode, err := createN(ctx, c, 64, cfg.balancePerNode*cfg.nodes)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if err != nil {
				return nil, fmt.Errorf("placement %s: %w", st.name, err)
			}
			out[i].imbalance = append(out[i].imbalance, imbalance(perNode, cfg.nodes))
		}
	}
	return out, nil
}

func reportBalance(cfg config, bs []fleetBalance) {
	fmt.Printf("\nbalance on a real fleet view (warren-bn's apiserver restarted with each strategy): %d sandboxes per node from empty nodes, 64 creates at a time, %d rounds\n",
		cfg.balancePerNode, cfg.rounds)
	fmt.Printf("  %-8s %22s\n", "", "max/mean")
	med := map[string]float64{}
	for _, b := range bs {
		imb := slices.Clone(b.imbalance)
		sort.Float64s(imb)
		med[b.name] = imb[len(imb)/2]
		fmt.Printf("  %-8s %22s\n", b.name, showSpread(imb, "%.3f"))
	}
	fmt.Printf("  k=2 max/mean is %.3fx the oracle's (target <= 1.10: %s)\n", med["k=2"]/med["oracle"], verdict(med["k=2"]/med["oracle"] <= 1.10))
}

// showSpread prints sorted v as "median (min-max)", or its one value.
func showSpread(v []float64, format string) string {
	if len(v) == 1 {
		return fmt.Sprintf(format, v[0])
	}
	return fmt.Sprintf(format+" ("+format+"-"+format+")", v[len(v)/2], v[0], v[len(v)-1])
}

// defaultNodeDir is /dev/shm when there is one. On this machine's root
// filesystem (ext4 without a journal) creating files just after deleting
// many is slow (see bench/layers), and the simulated nodes' record writes
// would be what the run measures.
func defaultNodeDir() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return ""
}

func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// setupProject waits until the apiserver at url sees n healthy nodes, then
// makes the runner's project, with room for far more than a run creates
// and a rate limit (so that the bucket is on the path) far above what it
// reaches, and returns a runner token of it.
func setupProject(ctx context.Context, url, admin string, n int) (string, error) {
	c := client.New(url, admin)
	if err := waitNodes(ctx, c, n, time.Minute); err != nil {
		return "", err
	}
	if _, err := c.CreateProject(ctx, api.CreateProjectRequest{Path: "bench", Quota: api.Quota{
		Sandboxes: 1 << 40, CPU: 1 << 40, Memory: 1 << 60, CreatesPerSec: 1e6,
	}}); err != nil {
		return "", fmt.Errorf("create project: %w", err)
	}
	tok, err := c.CreateToken(ctx, api.CreateTokenRequest{Project: "bench", Role: "runner", Name: "bench"})
	if err != nil {
		return "", fmt.Errorf("create runner token: %w", err)
	}
	return tok.Secret, nil
}

// waitNodes waits until the apiserver sees n healthy nodes.
func waitNodes(ctx context.Context, c *client.Client, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	healthy := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		nodes, err := c.ListNodes(ctx)
		if err == nil {
			healthy = 0
			for _, nd := range nodes {
				if nd.Healthy {
					healthy++
				}
			}
			if healthy >= n {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the apiserver sees %d healthy nodes after %v, want %d", healthy, timeout, n)
}

// profileRun drives the highest level once more through p while it takes
// CPU profiles of the apiserver and the nodes, and one of what the
// apiserver allocates, into files named prefix+role.
func profileRun(ctx context.Context, cfg config, p peer, prefix string, apisrv, agents *child) error {
	if err := os.MkdirAll(cfg.profile, 0o755); err != nil {
		return err
	}
	c := cfg.conc[len(cfg.conc)-1]
	secs := max(int(cfg.dur/time.Second), 1)
	errc := make(chan error, 3)
	for _, ch := range []*child{apisrv, agents} {
		go func() {
			time.Sleep(cfg.warm)
			errc <- fetchProfile(ch.ready.Pprof, "profile", secs, filepath.Join(cfg.profile, prefix+ch.name+".pprof"))
		}()
	}
	go func() {
		time.Sleep(cfg.warm)
		errc <- fetchProfile(apisrv.ready.Pprof, "allocs", secs, filepath.Join(cfg.profile, prefix+"apiserver.allocs.pprof"))
	}()
	s := drive(ctx, p.client(c), c, cfg.warm, time.Duration(secs)*time.Second+time.Second, p.procs, nil)
	err := errors.Join(<-errc, <-errc, <-errc)
	if p.reset != nil {
		err = errors.Join(err, p.reset())
	}
	fmt.Printf("profile run, %s c%d: %.0f creates/s (profiling on); profiles in %s\n", p.name, c, s.rate, cfg.profile)
	return err
}

// fetchProfile writes the named profile of the last secs seconds.
func fetchProfile(addr, name string, secs int, path string) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", addr, name, secs))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile from %s: %s", addr, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
}

// otherPids returns the pids of the processes of peers other than p.
func otherPids(peers []peer, p peer) []int {
	mine := map[int]bool{}
	for _, pid := range p.procs {
		mine[pid] = true
	}
	var out []int
	for _, q := range peers {
		for _, pid := range q.procs {
			if !mine[pid] && !slices.Contains(out, pid) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// cores formats each process's CPU use in the window, in cores, then the
// other peers' processes' ("idle peers") and the whole machine's: what is
// left of the 2 cores went to other work on this shared machine.
func cores(s sample) string {
	names := make([]string, 0, len(s.cpu))
	for n := range s.cpu {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.2f", n, s.cpu[n].Seconds()/s.window.Seconds()))
	}
	w := s.window.Seconds()
	return strings.Join(parts, " ") + fmt.Sprintf(" | idle peers %.2f | machine %.2f", s.others.Seconds()/w, s.busy.Seconds()/w)
}

// median and spread over the rounds of one figure.
func stat(ss []sample, f func(sample) float64) (med, lo, hi float64) {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	sort.Float64s(v)
	return v[len(v)/2], v[0], v[len(v)-1]
}

func spread(ss []sample, f func(sample) float64, format string) string {
	m, lo, hi := stat(ss, f)
	if len(ss) == 1 {
		return fmt.Sprintf(format, m)
	}
	return fmt.Sprintf(format+" ("+format+"-"+format+")", m, lo, hi)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// report prints, per level, each peer's median and spread and the ratio
// of each warren peer to the relay; then each warren peer's saturation
// point and where its CPU went there.
func report(cfg config, peers []peer, results map[string][]sample) {
	rate := func(s sample) float64 { return s.rate }
	get := func(p string, c int) []sample { return results[fmt.Sprintf("%s/%d", p, c)] }
	fmt.Printf("\n%-5s %-9s %22s %22s %22s %7s %20s %20s\n", "", "", "creates/s", "p50", "p99", "errors",
		"server CPU/create", "all CPU/create")
	for _, c := range cfg.conc {
		for _, p := range peers {
			ss := get(p.name, c)
			errs := 0
			for _, s := range ss {
				errs += s.errs
			}
			fmt.Printf("c%-4d %-9s %22s %22s %22s %7d %20s %20s\n", c, p.name,
				spread(ss, rate, "%.0f"),
				spread(ss, func(s sample) float64 { return ms(s.p50) }, "%.1fms"),
				spread(ss, func(s sample) float64 { return ms(s.p99) }, "%.1fms"),
				errs, spread(ss, func(s sample) float64 { return perCreate(s, p.server) }, "%.0fµs"),
				spread(ss, func(s sample) float64 { return perCreate(s, "") }, "%.0fµs"))
		}
		rl, _, _ := stat(get("relay", c), rate)
		var parts []string
		for _, p := range peers[:len(peers)-1] {
			w, _, _ := stat(get(p.name, c), rate)
			parts = append(parts, fmt.Sprintf("%s/relay %.2fx", p.name, w/rl))
		}
		fmt.Printf("      throughput %s\n", strings.Join(parts, ", "))
	}
	fmt.Println()
	for _, p := range peers[:len(peers)-1] {
		bestC, best := 0, 0.0
		for _, c := range cfg.conc {
			if w, _, _ := stat(get(p.name, c), rate); w > best {
				bestC, best = c, w
			}
		}
		ss := get(p.name, bestC)
		p50, _, _ := stat(ss, func(s sample) float64 { return ms(s.p50) })
		p99, _, _ := stat(ss, func(s sample) float64 { return ms(s.p99) })
		fmt.Printf("saturation, %s: peaks at c%d: %.0f creates/s, p50 %.1fms, p99 %.1fms (target >= 5000/s: %s)\n",
			p.name, bestC, best, p50, p99, verdict(best >= 5000))
		var names []string
		for n := range p.procs {
			names = append(names, n)
		}
		sort.Strings(names)
		var parts []string
		total := 0.0
		for _, n := range names {
			m, _, _ := stat(ss, func(s sample) float64 { return s.cpu[n].Seconds() / s.window.Seconds() })
			us, _, _ := stat(ss, func(s sample) float64 { return perCreate(s, n) })
			parts = append(parts, fmt.Sprintf("%s %.2f (%.0fµs)", n, m, us))
			total += m
		}
		all, _, _ := stat(ss, func(s sample) float64 { return perCreate(s, "") })
		srv, _, _ := stat(ss, func(s sample) float64 { return perCreate(s, p.server) })
		fmt.Printf("  cores (CPU per create): %s; these processes %.2f of 2\n", strings.Join(parts, ", "), total)
		fmt.Printf("  two cores' worth of CPU (2 s/s) buys %.0f creates/s at %.0fµs for all of it, %.0f/s at the %s's %.0fµs alone\n",
			2e6/all, all, 2e6/srv, p.server, srv)
	}
	fmt.Printf("anchors: Nomad C1M ~3,750 placements/s (5 servers); kube-scheduler ~100 pods/s at 5,000 nodes; self-hosted E2B shed load at 30-70 creates/s\n")
	fmt.Printf("real fleet (warren), creates per node max/mean (%s k=%d), by level:", cfg.strategy, cfg.k)
	for _, c := range cfg.conc {
		fmt.Printf(" c%d %s", c, spread(get("warren", c), func(s sample) float64 { return imbalance(s.perNode, cfg.nodes) }, "%.3f"))
	}
	fmt.Println()
}

// perCreate is the CPU process name (all processes: "") used per create
// completed in the window, in µs.
func perCreate(s sample, name string) float64 {
	var t time.Duration
	for n, d := range s.cpu {
		if name == "" || n == name {
			t += d
		}
	}
	return float64(t) / float64(time.Microsecond) / float64(max(s.n, 1))
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// simulate prints placement.Simulate's balance, one seed per round.
func simulate(cfg config) error {
	var runs [][]placement.SimResult
	for r := range cfg.rounds {
		res, err := placement.Simulate(placement.SimConfig{Nodes: cfg.nodes, Placements: cfg.simPlacements, Seed: uint64(r + 1)})
		if err != nil {
			return err
		}
		runs = append(runs, res)
	}
	fmt.Printf("\nbalance, placement.Simulate: %d nodes (64 CPU, 256 GiB, 500 sandboxes each), %d arrivals at 0.7 utilisation, %d seeds\n",
		cfg.nodes, cfg.simPlacements, cfg.rounds)
	fmt.Printf("  %-8s %22s %22s %22s %10s\n", "", "max/mean", "max load", "worst load", "rejected")
	med := map[string]float64{}
	for i, st := range runs[0] {
		col := func(f func(placement.SimResult) float64) []float64 {
			v := make([]float64, len(runs))
			for r := range runs {
				v[r] = f(runs[r][i])
			}
			sort.Float64s(v)
			return v
		}
		show := func(v []float64) string {
			if len(v) == 1 {
				return fmt.Sprintf("%.3f", v[0])
			}
			return fmt.Sprintf("%.3f (%.3f-%.3f)", v[len(v)/2], v[0], v[len(v)-1])
		}
		imb := col(func(r placement.SimResult) float64 { return r.Imbalance })
		rej := col(func(r placement.SimResult) float64 { return float64(r.Rejected) })
		med[st.Name] = imb[len(imb)/2]
		fmt.Printf("  %-8s %22s %22s %22s %10.0f\n", st.Name, show(imb),
			show(col(func(r placement.SimResult) float64 { return r.MaxLoad })),
			show(col(func(r placement.SimResult) float64 { return r.WorstLoad })), rej[len(rej)/2])
	}
	ratio := med["k=2"] / med["oracle"]
	fmt.Printf("  k=2 max/mean is %.3fx the oracle's (target <= 1.10: %s); random %.3fx, k=3 %.3fx\n",
		ratio, verdict(ratio <= 1.10), med["random"]/med["oracle"], med["k=3"]/med["oracle"])
	return nil
}
