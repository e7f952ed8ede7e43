package e2e

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcdCluster is an etcd cluster of several members in the test process,
// each with its own data dir, peer port and client port. Clients listen on
// every address (0.0.0.0) so that agents in other network namespaces reach
// them through their veth's host address.
type etcdCluster struct {
	members []*embed.Etcd
	ports   []int // client ports
}

func startEtcdCluster(t *testing.T, dir string, n int) *etcdCluster {
	t.Helper()
	peers := make([]string, n)
	clientPorts := make([]int, n)
	var initial []string
	for i := range n {
		peers[i] = "http://" + freeAddr(t)
		_, p, _ := net.SplitHostPort(freeAddr(t))
		fmt.Sscan(p, &clientPorts[i])
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peers[i]))
	}
	c := &etcdCluster{ports: clientPorts}
	errc := make(chan error, n)
	members := make([]*embed.Etcd, n)
	for i := range n {
		go func() {
			cfg := embed.NewConfig()
			cfg.Name = fmt.Sprintf("m%d", i)
			cfg.Dir = filepath.Join(dir, cfg.Name)
			cfg.Logger = "zap"
			cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
			pu, _ := url.Parse(peers[i])
			cu, _ := url.Parse(fmt.Sprintf("http://0.0.0.0:%d", clientPorts[i]))
			au, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPorts[i]))
			cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
			cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*au}
			cfg.InitialCluster = strings.Join(initial, ",")
			cfg.InitialClusterToken = "warren-e2e"
			cfg.TickMs, cfg.ElectionMs = 50, 500
			e, err := embed.StartEtcd(cfg)
			if err != nil {
				errc <- err
				return
			}
			members[i] = e
			select {
			case <-e.Server.ReadyNotify():
				errc <- nil
			case <-time.After(30 * time.Second):
				errc <- fmt.Errorf("etcd member %d not ready", i)
			}
		}()
	}
	for range n {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	c.members = members
	t.Cleanup(func() {
		for _, m := range c.members {
			if m != nil {
				m.Close()
			}
		}
	})
	return c
}

// endpoints returns the client URLs of the members as seen at host.
func (c *etcdCluster) endpoints(host string) string {
	var eps []string
	for _, p := range c.ports {
		eps = append(eps, fmt.Sprintf("http://%s:%d", host, p))
	}
	return strings.Join(eps, ",")
}

// stopLeader stops the member that leads the cluster and returns its
// index: the others must elect a new leader.
func (c *etcdCluster) stopLeader() int {
	for i, m := range c.members {
		if m != nil && m.Server.Leader() == m.Server.MemberID() {
			m.Close()
			c.members[i] = nil
			return i
		}
	}
	return -1
}

// netns is a network namespace joined to the host by a veth pair:
// 10.213.<k>.1 on the host side, 10.213.<k>.2 inside.
type netns struct {
	name, hostIf, nsIf string
	hostIP, nsIP       string
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newNetns makes namespace i of this test process. Its /30 is one no
// interface of the host uses yet (a run that was killed may have left
// some behind).
func newNetns(t *testing.T, i int) *netns {
	t.Helper()
	tag := fmt.Sprintf("%d%d", os.Getpid()%100000, i)
	used, _ := exec.Command("ip", "-4", "-o", "addr").Output()
	sub := -1
	for k := (os.Getpid() + 7*i) % 250; k < (os.Getpid()+7*i)%250+250; k++ {
		if !strings.Contains(string(used), fmt.Sprintf("10.213.%d.", k%250)) {
			sub = k % 250
			break
		}
	}
	if sub < 0 {
		t.Fatal("no free 10.213.x.0/30 for a network namespace")
	}
	n := &netns{
		name: "wrn" + tag, hostIf: "wh" + tag,
		hostIP: fmt.Sprintf("10.213.%d.1", sub), nsIP: fmt.Sprintf("10.213.%d.2", sub),
	}
	nsIf := "wn" + tag
	n.nsIf = nsIf
	run(t, "ip", "netns", "add", n.name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", n.name).Run() })
	run(t, "ip", "link", "add", n.hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { exec.Command("ip", "link", "del", n.hostIf).Run() })
	run(t, "ip", "link", "set", nsIf, "netns", n.name)
	run(t, "ip", "addr", "add", n.hostIP+"/30", "dev", n.hostIf)
	run(t, "ip", "link", "set", n.hostIf, "up")
	in := []string{"ip", "netns", "exec", n.name}
	run(t, append(in, "ip", "addr", "add", n.nsIP+"/30", "dev", nsIf)...)
	run(t, append(in, "ip", "link", "set", nsIf, "up")...)
	run(t, append(in, "ip", "link", "set", "lo", "up")...)
	return n
}

// command runs argv in the namespace's network only (nsenter --net, not
// `ip netns exec`, which also remounts /sys and so hides the cgroup
// hierarchies runc needs).
func (n *netns) command(argv ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + n.name, "--"}, argv...)...)
}

// partition cuts (or restores) the namespace's link to the host. The
// namespace's end goes down, so the host keeps its route to the namespace
// and packets to it are dropped, as on a cut cable (downing the host's end
// would remove the route and send them out the default route instead).
func (n *netns) partition(t *testing.T, cut bool) {
	state := "up"
	if cut {
		state = "down"
	}
	run(t, "ip", "netns", "exec", n.name, "ip", "link", "set", n.nsIf, state)
}
