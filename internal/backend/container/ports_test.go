package container

import (
	"context"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// NetNS is the namespace the sandbox's own processes are in, as they see
// it from inside (readlink /proc/self/ns/net).
func TestNetNSIsTheSandboxes(t *testing.T) {
	h := newHarness(t)
	spec := h.spec("ns-" + randomHex(4))
	h.start(spec)
	ns, err := h.c.NetNS(context.Background(), spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(ns.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	inside := h.sh(spec.ID, "readlink /proc/self/ns/net")
	if want := fmt.Sprintf("net:[%d]", st.Ino); inside != want {
		t.Errorf("inside the sandbox: %s; NetNS gave %s", inside, want)
	}
	// A port out of range never gets as far as the namespace.
	if _, err := h.c.DialPort(context.Background(), spec.ID, 0); err == nil {
		t.Error("DialPort to port 0 succeeded")
	}
}
