package backendtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/netns"
	"github.com/warrenhq/warren/internal/testutil"
)

// testPorts checks a backend.PortDialer against a real server started
// inside the sandbox (busybox httpd, on 127.0.0.1 only): nothing listening
// is ECONNREFUSED, the server answers once it runs, a stopped sandbox is
// ErrConflict. An isolated backend reaches the sandbox's own loopback: not
// the host's, and not another sandbox's on the same port.
func (s *suite) testPorts(t *testing.T) {
	pd, ok := s.b.(backend.PortDialer)
	if !ok {
		t.Skip("backend has no DialPort")
	}
	needs(t, s.caps.Exec, "Exec")
	c := ctx(t)
	if _, err := pd.DialPort(c, "bt-missing", 80); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DialPort of an unknown id: %v, want ErrNotFound", err)
	}
	id := s.running(t)
	port := freePort(t) // free on the host too: the fake's servers listen there
	if _, err := pd.DialPort(c, id, port); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("DialPort with nothing listening: %v, want ECONNREFUSED", err)
	}
	s.serve(t, id, port, "page of "+id)
	if got := s.get(t, pd, id, port); !strings.Contains(got, "page of "+id) {
		t.Errorf("GET through DialPort: %q, want the sandbox's page", got)
	}

	if s.caps.Isolated {
		// A server on the host's loopback is not the sandbox's.
		host, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		hostPort := host.Addr().(*net.TCPAddr).Port
		if conn, err := pd.DialPort(c, id, hostPort); !errors.Is(err, syscall.ECONNREFUSED) {
			if conn != nil {
				conn.Close()
			}
			t.Errorf("DialPort to a port only the host listens on: %v, want ECONNREFUSED", err)
		}
		// Another sandbox on the same port answers with its own page.
		other := s.running(t)
		s.serve(t, other, port, "page of "+other)
		if got := s.get(t, pd, other, port); !strings.Contains(got, "page of "+other) {
			t.Errorf("second sandbox, same port: %q, want its own page", got)
		}
		if got := s.get(t, pd, id, port); !strings.Contains(got, "page of "+id) {
			t.Errorf("first sandbox after the second started: %q, want its own page", got)
		}
	}

	if nn, ok := s.b.(backend.NetNSer); ok {
		ns, err := nn.NetNS(c, id)
		if err != nil {
			t.Fatalf("NetNS: %v", err)
		}
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		same, err := netns.Same(ns, host)
		ns.Close()
		host.Close()
		if err != nil || same {
			t.Errorf("NetNS is the host's namespace (%v)", err)
		}
		if _, err := nn.NetNS(c, "bt-missing"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("NetNS of an unknown id: %v, want ErrNotFound", err)
		}
	}

	if err := s.b.Stop(c, id, time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := pd.DialPort(c, id, port); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("DialPort of a stopped sandbox: %v, want ErrConflict", err)
	}
	if nn, ok := s.b.(backend.NetNSer); ok {
		if _, err := nn.NetNS(c, id); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("NetNS of a stopped sandbox: %v, want ErrConflict", err)
		}
	}
}

// serve starts busybox httpd in the background in sandbox id, serving page
// on 127.0.0.1:port, and waits until it accepts.
func (s *suite) serve(t *testing.T, id string, port int, page string) {
	t.Helper()
	out := s.sh(t, id, fmt.Sprintf("mkdir -p www && echo '%s' > www/index.html && "+
		"(busybox httpd -f -p 127.0.0.1:%d -h www </dev/null >/dev/null 2>&1 &) && busybox true", page, port))
	if out.ExitCode == 127 {
		testutil.Unavailable(t, "needs busybox (with httpd) where the sandbox's commands run: %s", out.stderr)
	}
	if out.ExitCode != 0 {
		t.Fatalf("start httpd: exit %d, %s", out.ExitCode, out.stderr)
	}
	pd := s.b.(backend.PortDialer)
	if !eventually(10*time.Second, func() bool {
		c, err := pd.DialPort(ctx(t), id, port)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		t.Fatalf("httpd in %s never accepted on port %d", id, port)
	}
}

// get fetches / over a connection DialPort makes and returns the answer.
func (s *suite) get(t *testing.T, pd backend.PortDialer, id string, port int) string {
	t.Helper()
	c, err := pd.DialPort(ctx(t), id, port)
	if err != nil {
		t.Fatalf("DialPort(%s, %d): %v", id, port, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testutil.Scale(30 * time.Second)))
	if _, err := io.WriteString(c, "GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	return string(b)
}

// freePort returns a TCP port nothing listens on on the host's loopback.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
