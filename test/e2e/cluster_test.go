package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// proc is one warren server process of a multi-node cluster.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  bytes.Buffer
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Write(b)
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func (p *proc) alive() bool { return p.cmd.ProcessState == nil }

func (p *proc) kill9() {
	if p.alive() {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
	}
}

func (p *proc) stop() {
	if !p.alive() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		p.kill9()
	}
}

// multi is a warren cluster of separate processes: apiservers and agents
// over an etcd cluster, sharing one blob directory. Agents run on loopback,
// or each in its own network namespace behind a veth pair.
type multi struct {
	t       *testing.T
	bin     string
	dir     string
	etcd    *etcdCluster
	blobs   string
	backend string
	apis    []*proc
	addrs   []string // of apis, as the host dials them
	agents  []*proc
	modes   []string // per agent: "etcd" or "apiserver", how it registers
	nets    []*netns // per agent, when in network namespaces
	token   string   // admin
	nodeTok []string // per agent: its node token
}

func (m *multi) start(name string, cmd *exec.Cmd) *proc {
	m.t.Helper()
	p := &proc{name: name, cmd: cmd}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	return p
}

func waitHTTP(t *testing.T, p *proc, url string) {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if !p.alive() {
			break
		}
		if resp, err := hc.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not come up at %s:\n%s", p.name, url, p.logs())
}

// startAPIServer starts apiserver i, on its earlier port if it ran
// before. It listens on every address, for agents in namespaces.
func (m *multi) startAPIServer(i int) {
	m.t.Helper()
	var addr string
	if i < len(m.addrs) {
		addr = m.addrs[i]
	} else {
		addr = freeAddr(m.t)
	}
	_, port, _ := net.SplitHostPort(addr)
	p := m.start(fmt.Sprintf("apiserver-%d", i), exec.Command(m.bin, "apiserver",
		"--etcd", m.etcd.endpoints("127.0.0.1"), "--listen", ":"+port,
		"--data-dir", filepath.Join(m.dir, fmt.Sprintf("api%d", i)), "--blobs", m.blobs,
		"--poll-interval", "300ms", "--list-refresh", "500ms"))
	// Recorded first, so the cleanup stops it whatever happens next.
	if i < len(m.apis) {
		m.apis[i] = p
	} else {
		m.apis, m.addrs = append(m.apis, p), append(m.addrs, addr)
	}
	waitHTTP(m.t, p, "http://"+addr+"/healthz")
}

// startAgent starts agent i with node token tok, registering by mode
// ("etcd" or "apiserver"); or as it did before when mode is "".
func (m *multi) startAgent(i int, mode, tok string, args ...string) {
	m.t.Helper()
	if mode == "" {
		mode, tok = m.modes[i], m.nodeTok[i]
	} else {
		m.modes, m.nodeTok = append(m.modes, mode), append(m.nodeTok, tok)
	}
	host, listen := "127.0.0.1", freeAddr(m.t)
	var ns *netns
	if i < len(m.nets) {
		ns = m.nets[i]
		// Its own network: the same port on every node.
		host, listen = ns.hostIP, ns.nsIP+":7444"
	}
	full := []string{m.bin, "agent", "--listen", listen, "--token", tok, "--backend", m.backend,
		"--data-dir", filepath.Join(m.dir, fmt.Sprintf("agent%d", i)), "--blobs", m.blobs,
		// Requests up to 4x the cores, not the default 50x: the fork
		// test needs a node that cannot take 10 one-core branches.
		"--cpu-overcommit", "4"}
	if mode == "etcd" {
		full = append(full, "--etcd", m.etcd.endpoints(host))
	} else {
		var urls []string
		for _, a := range m.addrs {
			_, port, _ := net.SplitHostPort(a)
			urls = append(urls, "http://"+net.JoinHostPort(host, port))
		}
		full = append(full, "--apiserver", strings.Join(urls, ","))
	}
	full = append(full, args...)
	cmd := exec.Command(full[0], full[1:]...)
	if ns != nil {
		cmd = ns.command(full...)
	}
	p := m.start(fmt.Sprintf("agent-%d", i), cmd)
	if i < len(m.agents) {
		m.agents[i] = p
	} else {
		m.agents = append(m.agents, p)
	}
	waitHTTP(m.t, p, "http://"+listen+"/healthz")
}

// cli runs a client verb against apiserver i.
func (m *multi) cli(i int, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.bin, args...)
	cmd.Env = append(os.Environ(), "WARREN_ADDR=http://"+m.addrs[i], "WARREN_TOKEN="+m.token)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		// A hung call: dump the apiserver's goroutines into its log.
		m.apis[i].cmd.Process.Signal(syscall.SIGQUIT)
		time.Sleep(time.Second)
		m.t.Fatalf("warren %s (via apiserver %d) hung", strings.Join(args, " "), i)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		m.t.Fatalf("%v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func (m *multi) mustCLI(i int, args ...string) string {
	m.t.Helper()
	out, errs, code := m.cli(i, args...)
	if code != 0 {
		m.t.Fatalf("warren %s (via apiserver %d): exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), i, code, out, errs)
	}
	return out
}

func (m *multi) nodes(i int) []api.Node {
	m.t.Helper()
	var l api.NodeList
	if err := json.Unmarshal([]byte(m.mustCLI(i, "node", "ls", "-o", "json")), &l); err != nil {
		m.t.Fatal(err)
	}
	return l.Nodes
}

// nodeOf returns the node id of agent i, from its log.
func (m *multi) nodeOf(i int) string {
	m.t.Helper()
	for _, line := range strings.Split(m.agents[i].logs(), "\n") {
		if !strings.Contains(line, "warren agent is up") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if id, ok := strings.CutPrefix(f, "node="); ok {
				return id
			}
		}
	}
	m.t.Fatalf("agent %d logged no node id:\n%s", i, m.agents[i].logs())
	return ""
}

// state is the state apiserver i reports for sandbox id, or the error
// code it answers.
func (m *multi) state(i int, id string) string {
	m.t.Helper()
	out, errs, code := m.cli(i, "sandbox", "get", id, "-o", "json")
	if code != 0 {
		return strings.TrimSpace(errs)
	}
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		m.t.Fatal(err)
	}
	return sb.State
}

func (m *multi) create(i int, args ...string) api.Sandbox {
	m.t.Helper()
	var sb api.Sandbox
	out := m.mustCLI(i, append([]string{"sandbox", "create", "--image", "busybox", "--memory", "64Mi", "-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		m.t.Fatalf("create: %v\n%s", err, out)
	}
	return sb
}

// revokedTokenRefused mints a node token, revokes it, and checks that an
// agent started with it is refused: it exits, saying so, without joining.
func (m *multi) revokedTokenRefused() {
	m.t.Helper()
	var created api.CreatedToken
	if err := json.Unmarshal([]byte(m.mustCLI(0, "token", "create", "--role", "node", "-o", "json")), &created); err != nil {
		m.t.Fatal(err)
	}
	m.mustCLI(1, "token", "revoke", created.Token.ID)
	before := len(m.nodes(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.bin, "agent", "--apiserver", "http://"+m.addrs[0], "--token", created.Secret,
		"--listen", freeAddr(m.t), "--backend", "fake", "--data-dir", filepath.Join(m.dir, "revoked-agent"))
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil || err == nil || !strings.Contains(string(out), "registration refused") {
		m.t.Errorf("agent with a revoked node token: %v (%v), want it to exit refused:\n%s", err, ctx.Err(), out)
	}
	if n := len(m.nodes(0)); n != before {
		m.t.Errorf("nodes: %d after an agent with a revoked token tried to join, want %d", n, before)
	}
}

func waitCond(t *testing.T, what string, d time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// TestClusterEndToEnd runs warren as separate processes: a 3-member etcd
// cluster, 2 apiservers, and 3 agents each in its own network namespace
// (two registering in etcd, one through the apiservers). It creates
// sandboxes through both apiservers; kills -9 an agent (its sandboxes turn
// lost within seconds, creates avoid it) and restarts it (they come back);
// cuts another agent's link (lost, then back); stops an etcd member (work
// goes on); kills an apiserver (the other serves).
func TestClusterEndToEnd(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "ip", "nsenter")
	runCluster(t, clusterOpts{backend: "container", netns: true})
}

// TestClusterFakeNodes is TestClusterEndToEnd on loopback over simulated
// nodes (the fake backend): the same control plane, without root or runc.
func TestClusterFakeNodes(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs", "busybox")
	runCluster(t, clusterOpts{backend: "fake"})
}

type clusterOpts struct {
	backend string
	netns   bool // agents in network namespaces (root)
}

func runCluster(t *testing.T, o clusterOpts) {
	testutil.RequireBinary(t, "go")
	dir := t.TempDir()
	m := &multi{t: t, bin: warrenBin(t, "warrenfake"), dir: dir, blobs: filepath.Join(dir, "blobs"), backend: o.backend}
	m.etcd = startEtcdCluster(t, filepath.Join(dir, "etcd"), 3)
	if o.netns {
		for i := range 3 {
			m.nets = append(m.nets, newNetns(t, i))
		}
	}

	t.Cleanup(func() {
		// Leave nothing running: sandboxes outlive their agent.
		for _, ns := range m.nets {
			ns.partition(t, false)
		}
		for i, a := range m.agents {
			if !a.alive() {
				m.startAgent(i, "", "")
			}
		}
		for i, p := range m.apis {
			if !p.alive() {
				continue
			}
			if ids, _, code := m.cli(i, "sandbox", "ls", "-o", "id"); code == 0 && strings.TrimSpace(ids) != "" {
				m.cli(i, append([]string{"sandbox", "rm"}, strings.Fields(ids)...)...)
			}
			break
		}
		for _, p := range append(slices.Clone(m.agents), m.apis...) {
			p.stop()
			if t.Failed() {
				t.Logf("--- %s log:\n%s", p.name, p.logs())
			}
		}
	})
	m.startAPIServer(0)
	m.startAPIServer(1)
	admin, err := os.ReadFile(filepath.Join(dir, "api0", "admin-token"))
	if err != nil {
		t.Fatalf("first apiserver wrote no admin token: %v", err)
	}
	m.token = strings.TrimSpace(string(admin))
	if _, err := os.Stat(filepath.Join(dir, "api1", "admin-token")); err == nil {
		t.Errorf("the second apiserver wrote an admin token too")
	}
	// The first apiserver mints a node token for its node-token file, the
	// second none; more come from `warren token create --role node`.
	nt0, _ := os.ReadFile(filepath.Join(dir, "api0", "node-token"))
	if len(nt0) == 0 {
		t.Fatalf("the first apiserver wrote no node token")
	}
	if _, err := os.Stat(filepath.Join(dir, "api1", "node-token")); err == nil {
		t.Errorf("the second apiserver wrote a node token too")
	}
	bootTok := strings.TrimSpace(string(nt0))
	agentTok := strings.TrimSpace(m.mustCLI(1, "token", "create", "--role", "node", "--name", "agent-2"))

	m.startAgent(0, "etcd", bootTok, "--label", "rack=r0")
	m.startAgent(1, "etcd", bootTok, "--label", "rack=r1")
	m.startAgent(2, "apiserver", agentTok, "--pool", "onprem", "--label", "rack=r2")
	for i := range m.apis {
		waitCond(t, fmt.Sprintf("3 healthy nodes via apiserver %d", i), 20*time.Second, func() bool {
			n := 0
			for _, nd := range m.nodes(i) {
				if nd.Healthy {
					n++
				}
			}
			return n == 3
		})
	}
	table := m.mustCLI(1, "node", "ls")
	for _, want := range []string{"POOL", "onprem", "ADDRESS", ":"} {
		if !strings.Contains(table, want) {
			t.Errorf("node ls lacks %q:\n%s", want, table)
		}
	}
	m.revokedTokenRefused()

	// Creates through either apiserver land on several nodes; every call
	// routes through either.
	var sbs []api.Sandbox
	perNode := map[string][]string{}
	for i := range 6 {
		sb := m.create(i%2, "--label", "job=e2e")
		sbs = append(sbs, sb)
		perNode[sb.Node] = append(perNode[sb.Node], sb.ID)
	}
	if len(perNode) < 2 {
		t.Errorf("6 creates all went to %v", perNode)
	}
	// Placement constraints: --node-selector finds the one node with that
	// label (agent --label), and one no node matches is a 503 that says so.
	rack1 := ""
	for _, nd := range m.nodes(0) {
		if nd.Labels["rack"] == "r1" {
			rack1 = nd.ID
		}
	}
	for i := range 3 {
		sb := m.create(i%2, "--node-selector", "rack=r1", "--pool", "onprem")
		if sb.Node != rack1 {
			t.Errorf("--node-selector rack=r1: placed on %s, want %s", sb.Node, rack1)
		}
		m.mustCLI(0, "sandbox", "rm", sb.ID)
	}
	if _, stderr, code := m.cli(1, "sandbox", "create", "--image", "busybox", "--node-selector", "rack=r9"); code != 1 ||
		!strings.Contains(stderr, "no node matches node_selector rack=r9") || !strings.Contains(stderr, api.CodeNoMatchingNode) {
		t.Errorf("--node-selector rack=r9: exit %d, stderr %q; want 1 and %s", code, stderr, api.CodeNoMatchingNode)
	}
	for i, sb := range sbs {
		out := m.mustCLI((i+1)%2, "exec", sb.ID, "--", "sh", "-c", "echo hi from $(hostname)")
		if out != "hi from "+sb.ID+"\n" && o.backend == "container" || !strings.HasPrefix(out, "hi from") {
			t.Errorf("exec in %s: %q", sb.ID, out)
		}
	}
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "in.txt"), []byte("payload\n"), 0o644)
	m.mustCLI(0, "cp", filepath.Join(local, "in.txt"), sbs[0].ID+":/root/in.txt")
	m.mustCLI(1, "cp", sbs[0].ID+":/root/in.txt", filepath.Join(local, "out.txt"))
	if b, _ := os.ReadFile(filepath.Join(local, "out.txt")); string(b) != "payload\n" {
		t.Errorf("cp in via one apiserver, out via the other: %q", b)
	}
	var list api.SandboxList
	json.Unmarshal([]byte(m.mustCLI(1, "sandbox", "ls", "--label", "job=e2e", "-o", "json")), &list)
	if len(list.Sandboxes) != len(sbs) {
		t.Errorf("ls: %d sandboxes, want %d", len(list.Sandboxes), len(sbs))
	}

	// A fork too wide for its parent's node: the branches that do not fit
	// there go to other nodes, which fetch the snapshot's layers from the
	// shared blob store; every branch sees the parent's files (with the
	// container backend: the fake one ignores layers).
	var fork api.ForkResponse
	if err := json.Unmarshal([]byte(m.mustCLI(0, "sandbox", "fork", sbs[0].ID, "--count", "10", "--all-or-none", "-o", "json")), &fork); err != nil {
		t.Fatal(err)
	}
	where := map[string]int{}
	var branches []string
	for _, b := range fork.Sandboxes {
		where[b.Node]++
		branches = append(branches, b.ID)
		if o.backend != "container" {
			continue // the fake backend ignores layers
		}
		if out := m.mustCLI(1, "exec", b.ID, "-w", "/root", "--", "cat", "in.txt"); out != "payload\n" {
			t.Errorf("branch %s on %s sees %q, want the parent's file", b.ID, b.Node, out)
		}
	}
	if len(fork.Sandboxes) != 10 || where[sbs[0].Node] == 0 || len(where) < 2 {
		t.Errorf("a fork of 10 from a sandbox on %s: placed %v, want some there and the rest spread", sbs[0].Node, where)
	}
	if len(branches) > 0 {
		m.mustCLI(0, append([]string{"sandbox", "rm"}, branches...)...)
	}

	// kill -9 the agent of the first sandbox: its sandboxes turn lost
	// within seconds, through either apiserver, and creates avoid it.
	victimNode := sbs[0].Node
	victim := -1
	for i := range m.agents {
		if m.nodeOf(i) == victimNode {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("no agent logs node %s", victimNode)
	}
	time.Sleep(time.Second) // a list refresh: the apiservers cache what it holds
	m.agents[victim].kill9()
	took := waitCond(t, "a lost sandbox", 15*time.Second, func() bool {
		return m.state(1, sbs[0].ID) == api.StateLost
	})
	t.Logf("sandbox reported lost %v after kill -9 of its agent", took.Round(100*time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("lost after %v; want within seconds", took)
	}
	waitCond(t, "lost via the other apiserver", 5*time.Second, func() bool {
		return m.state(0, sbs[0].ID) == api.StateLost
	})
	json.Unmarshal([]byte(m.mustCLI(0, "sandbox", "ls", "--label", "job=e2e", "-o", "json")), &list)
	lost := 0
	for _, sb := range list.Sandboxes {
		if sb.Node == victimNode {
			if sb.State != api.StateLost {
				t.Errorf("ls shows %s on the dead node as %s", sb.ID, sb.State)
			}
			lost++
		}
	}
	if lost != len(perNode[victimNode]) {
		t.Errorf("ls shows %d lost sandboxes, want %d", lost, len(perNode[victimNode]))
	}
	if _, errs, code := m.cli(0, "exec", sbs[0].ID, "--", "true"); code == 0 || !strings.Contains(errs, api.CodeSandboxLost) {
		t.Errorf("exec on a lost sandbox: exit %d, %q", code, errs)
	}
	for i := range 4 {
		if sb := m.create(i % 2); sb.Node == victimNode {
			t.Errorf("created %s on the dead node", sb.ID)
		} else {
			sbs = append(sbs, sb)
		}
	}
	for _, n := range m.nodes(1) {
		if n.ID == victimNode && n.Healthy {
			t.Errorf("node ls shows the dead node healthy")
		}
	}

	// The agent comes back on its data dir: it re-adopts its sandboxes,
	// which run again.
	m.startAgent(victim, "", "")
	waitCond(t, "the sandbox back from lost", 20*time.Second, func() bool {
		return m.state(0, sbs[0].ID) == api.StateRunning && m.state(1, sbs[0].ID) == api.StateRunning
	})
	if out := m.mustCLI(0, "exec", sbs[0].ID, "-w", "/root", "--", "cat", "in.txt"); out != "payload\n" {
		t.Errorf("after the agent's restart: %q", out)
	}

	// A network partition (agents in namespaces): an agent's link goes
	// down. It lives on, unreachable: its sandboxes are lost. The link
	// comes back within the registration TTL: they run again.
	if len(m.nets) > 0 {
		for j := range m.agents {
			id := m.nodeOf(j)
			if j == victim || len(perNode[id]) == 0 {
				continue
			}
			sb := perNode[id][0]
			m.nets[j].partition(t, true)
			took := waitCond(t, "a partitioned node's sandbox lost", 15*time.Second, func() bool {
				return m.state(0, sb) == api.StateLost
			})
			t.Logf("sandbox reported lost %v after its node's link went down", took.Round(100*time.Millisecond))
			m.nets[j].partition(t, false)
			waitCond(t, "the partitioned node back", 15*time.Second, func() bool {
				return m.state(0, sb) == api.StateRunning && m.state(1, sb) == api.StateRunning
			})
			if out := m.mustCLI(1, "exec", sb, "--", "echo", "healed"); out != "healed\n" {
				t.Errorf("exec after the partition healed: %q", out)
			}
			break
		}
	}

	// Stop the etcd leader: the other two elect another, and work goes on.
	t.Logf("stopped etcd member %d, the leader", m.etcd.stopLeader())
	for i := range 2 {
		sb := m.create(i)
		sbs = append(sbs, sb)
		if out := m.mustCLI(1-i, "exec", sb.ID, "--", "echo", "quorum"); out != "quorum\n" {
			t.Errorf("exec with an etcd member down: %q", out)
		}
	}

	// kill -9 an apiserver: the other serves everything.
	m.apis[0].kill9()
	sb := m.create(1)
	if out := m.mustCLI(1, "exec", sb.ID, "--", "echo", "still here"); out != "still here\n" {
		t.Errorf("exec after an apiserver died: %q", out)
	}
	m.mustCLI(1, "sandbox", "rm", sb.ID)
	json.Unmarshal([]byte(m.mustCLI(1, "sandbox", "ls", "-o", "json")), &list)
	if len(list.Sandboxes) != len(sbs) {
		t.Errorf("ls via the surviving apiserver: %d sandboxes, want %d", len(list.Sandboxes), len(sbs))
	}
	// The agent that registered through the dead apiserver renews through
	// the other: past its registration TTL (10 s) it is still healthy.
	time.Sleep(12 * time.Second)
	for _, n := range m.nodes(1) {
		if !n.Healthy {
			t.Errorf("node %s unhealthy after an apiserver died: %v", n.ID, n.Problems)
		}
	}
	m.startAPIServer(0)
	if _, err := os.ReadFile(filepath.Join(dir, "api0", "admin-token")); err != nil {
		t.Errorf("restarted apiserver lost its admin token file: %v", err)
	}

	// Delete everything through the restarted apiserver: nothing is left
	// on the host of any sandbox, on any node.
	ids := strings.Fields(m.mustCLI(0, "sandbox", "ls", "-o", "id"))
	if len(ids) != len(sbs) {
		t.Errorf("ls via the restarted apiserver: %d sandboxes, want %d", len(ids), len(sbs))
	}
	m.mustCLI(0, append([]string{"sandbox", "rm"}, ids...)...)
	if out := strings.TrimSpace(m.mustCLI(1, "sandbox", "ls", "-o", "id")); out != "" {
		t.Errorf("ls after rm: %q", out)
	}
	if o.backend == "container" {
		for _, id := range ids {
			assertNoTrace(t, dir, id)
		}
	}
}
