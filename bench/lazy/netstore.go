package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/internal/blob/s3test"
)

// The store's link: a veth pair between the host and a network namespace
// the run makes, on addresses of TEST-NET-3 (203.0.113.0/24, never routed
// on the internet); the store listens on storeIP in the namespace.
const (
	hostIP  = "203.0.113.201"
	storeIP = "203.0.113.202"
	linkNet = "/30"
	bucket  = "warren-bench-lazy"
)

// netStore is an S3 store (SeaweedFS) across a link whose bandwidth and
// latency the run sets: a shared remote store as a node sees one.
type netStore struct {
	ns, hostIf, nsIf string
	srv              *s3test.Server
}

func run1(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startNetStore makes the namespace and link, checks that the route to
// storeIP leaves by the link (before any packet is sent to it), and
// starts weed there with its data in dir.
func startNetStore(ctx context.Context, dir string) (*netStore, error) {
	id := strconv.Itoa(os.Getpid() % 100000)
	s := &netStore{ns: "wbl-" + id, hostIf: "wbl" + id + "h", nsIf: "wbl" + id + "s"}
	steps := [][]string{
		{"ip", "netns", "add", s.ns},
		{"ip", "link", "add", s.hostIf, "type", "veth", "peer", "name", s.nsIf},
		{"ip", "link", "set", s.nsIf, "netns", s.ns},
		{"ip", "addr", "add", hostIP + linkNet, "dev", s.hostIf},
		{"ip", "link", "set", s.hostIf, "up"},
		{"ip", "-n", s.ns, "addr", "add", storeIP + linkNet, "dev", s.nsIf},
		{"ip", "-n", s.ns, "link", "set", s.nsIf, "up"},
		{"ip", "-n", s.ns, "link", "set", "lo", "up"},
	}
	for _, st := range steps {
		if err := run1(ctx, st[0], st[1:]...); err != nil {
			s.close()
			return nil, err
		}
	}
	out, err := exec.CommandContext(ctx, "ip", "route", "get", storeIP).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev "+s.hostIf+" ") {
		s.close()
		return nil, fmt.Errorf("the route to %s does not leave by %s: %s %v", storeIP, s.hostIf, out, err)
	}
	wd := filepath.Join(dir, "weed")
	if err := os.MkdirAll(wd, 0o755); err != nil {
		s.close()
		return nil, err
	}
	if s.srv, err = s3test.Run(s3test.Options{Dir: wd, Netns: s.ns, IP: storeIP, Volumes: 1000}); err != nil {
		s.close()
		return nil, err
	}
	if err := s.srv.MakeBucket(ctx, bucket); err != nil {
		s.close()
		return nil, err
	}
	os.Setenv("AWS_ACCESS_KEY_ID", s.srv.AccessKey)
	os.Setenv("AWS_SECRET_ACCESS_KEY", s.srv.SecretKey)
	return s, nil
}

// spec is the store as warren's --blobs takes it.
func (s *netStore) spec() string {
	return fmt.Sprintf("s3://%s/blobs?endpoint=http://%s", bucket, s.srv.Endpoint)
}

// shape limits the link to rate each way (tc tbf; "" lifts the limit).
// This kernel has no netem, so no latency is added: a fetch's latency is
// the store's own (weed's S3 gateway, filer and volume server: a few ms
// per GET, printed as the chunk cache's mean fetch time).
func (s *netStore) shape(ctx context.Context, rate string) error {
	for _, pre := range [][]string{{"tc"}, {"ip", "netns", "exec", s.ns, "tc"}} {
		ifc := s.hostIf
		if len(pre) > 1 {
			ifc = s.nsIf
		}
		cmd := func(args ...string) error {
			return run1(ctx, pre[0], append(append([]string{}, pre[1:]...), args...)...)
		}
		cmd("qdisc", "del", "dev", ifc, "root") // none yet: fine
		if rate == "" {
			continue
		}
		if err := cmd("qdisc", "add", "dev", ifc, "root", "tbf", "rate", rate, "burst", "512kb", "latency", "100ms"); err != nil {
			return err
		}
	}
	return nil
}

// received is what the host has received over the link so far: the bytes
// fetched from the store, headers and all.
func (s *netStore) received() (int64, error) {
	b, err := os.ReadFile("/sys/class/net/" + s.hostIf + "/statistics/rx_bytes")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func (s *netStore) close() {
	if s.srv != nil {
		s.srv.Stop()
	}
	exec.Command("ip", "link", "del", s.hostIf).Run()
	exec.Command("ip", "netns", "del", s.ns).Run()
}
