// Package egresstest starts sandbox networks for tests: each with a name
// and a pool of its own, so tests in other packages and a warren agent on
// the same host are left alone.
package egresstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/netpolicy"
	"github.com/warrenhq/warren/internal/netpolicy/egress"
	"github.com/warrenhq/warren/internal/testutil"
)

// Config returns a config with a free-looking name and pool (pools
// 10.213.100.0/24 to 10.213.249.0/24; New retries on collisions) whose
// DNS proxy asks a dead loopback port: a test that resolves names points
// DNSUpstream at a resolver of its fake internet, so that no query ever
// leaves the machine.
func Config(fence netpolicy.Fence) egress.Config {
	n, _ := rand.Int(rand.Reader, big.NewInt(150))
	b := make([]byte, 2)
	rand.Read(b)
	return egress.Config{
		Name:        "t" + hex.EncodeToString(b),
		Pool:        netip.MustParsePrefix(fmt.Sprintf("10.213.%d.0/24", 100+n.Int64())),
		Fence:       fence,
		DNSUpstream: DeadUpstream,
	}
}

// DeadUpstream is a loopback port nothing listens on.
const DeadUpstream = "127.0.0.1:1"

// New starts a Manager from Config, closed when the test ends. Without
// root, nftables or veth it skips (fails under WARREN_TEST_STRICT).
func New(t testing.TB, fence netpolicy.Fence, mod ...func(*egress.Config)) *egress.Manager {
	t.Helper()
	testutil.RequireRoot(t)
	for range 20 {
		cfg := Config(fence)
		for _, f := range mod {
			f(&cfg)
		}
		m, err := egress.New(context.Background(), cfg)
		if err != nil && strings.Contains(err.Error(), "in use") {
			continue
		}
		if err != nil {
			testutil.Unavailable(t, "network: %v", err)
		}
		t.Cleanup(func() { m.Teardown() })
		return m
	}
	t.Fatal("no free test network pool")
	return nil
}
