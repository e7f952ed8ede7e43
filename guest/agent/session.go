package main

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest/boot"
	"github.com/warrenhq/warren/guest/proto"
)

// findPort returns the device of the agent's virtio-serial port.
func findPort() (string, error) {
	var dev string
	err := boot.WaitFor("port "+proto.PortName, 30*time.Second, func() bool {
		ents, _ := os.ReadDir(portsClass)
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(portsClass, e.Name(), "name"))
			if err == nil && strings.TrimSpace(string(b)) == proto.PortName {
				dev = "/dev/" + e.Name()
				return true
			}
		}
		return false
	})
	return dev, err
}

// serve runs sessions on the port forever, one at a time.
func (a *agent) serve() {
	dev, err := findPort()
	if err != nil {
		boot.Logf("error: %v", err)
		boot.PowerOff()
	}
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		boot.Logf("error: open %s: %v", dev, err)
		boot.PowerOff()
	}
	port := os.NewFile(uintptr(fd), dev) // blocking: plain read(2) and write(2)
	// HTTP/2's smallest largest frame (16 KiB; Go's server allows 1 MiB by
	// default) matters: a hello from the host that finds the guest still
	// in an earlier session (restored from a saved state) reads as a frame
	// header of at least 640 KiB, and ends that session at once instead of
	// waiting for its payload.
	h2 := &http2.Server{MaxReadFrameSize: 16 << 10}
	mux := a.handler()
	// Each session's start and end go to the console (the host keeps it
	// beside the sandbox; the workload cannot read it): what a stuck
	// channel is diagnosed from.
	for n := 1; ; n++ {
		waitHost(fd)
		r := bufio.NewReaderSize(port, 64<<10)
		if err := proto.GuestHandshake(r, port, a.cfg.Secret); err != nil {
			boot.Logf("session %d: handshake: %v", n, err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		boot.Logf("session %d: started", n)
		h2.ServeConn(&portConn{r: r, f: port}, &http2.ServeConnOpts{Handler: mux})
		boot.Logf("session %d: ended", n)
	}
}

// waitHost waits until a host is connected to the port: until then poll
// reports POLLHUP (and reads return end of file).
func waitHost(fd int) {
	for {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLOUT}}
		n, err := unix.Poll(p, 1000)
		if err == nil && n == 1 && p[0].Revents&unix.POLLHUP == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// portConn is the port as a net.Conn for the HTTP/2 server; reads go
// through the handshake's buffered reader.
type portConn struct {
	r *bufio.Reader
	f *os.File
}

func (c *portConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n == 0 && err == nil {
		return 0, errors.New("host disconnected")
	}
	return n, err
}
func (c *portConn) Write(p []byte) (int, error)      { return c.f.Write(p) }
func (c *portConn) Close() error                     { return nil } // the port stays open for the next session
func (c *portConn) LocalAddr() net.Addr              { return portAddr{} }
func (c *portConn) RemoteAddr() net.Addr             { return portAddr{} }
func (c *portConn) SetDeadline(time.Time) error      { return nil }
func (c *portConn) SetReadDeadline(time.Time) error  { return nil }
func (c *portConn) SetWriteDeadline(time.Time) error { return nil }

type portAddr struct{}

func (portAddr) Network() string { return "virtio-serial" }
func (portAddr) String() string  { return proto.PortName }

var _ http.Handler = (*http.ServeMux)(nil)
