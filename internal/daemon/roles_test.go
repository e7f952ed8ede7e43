package daemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/store"
)

func TestBootstrapAdminOnce(t *testing.T) {
	ctx := context.Background()
	st := store.Memory()
	first := filepath.Join(t.TempDir(), AdminTokenFile)
	second := filepath.Join(t.TempDir(), AdminTokenFile)

	secret, err := bootstrapAdmin(ctx, st, first)
	if err != nil || len(secret) < 32 {
		t.Fatalf("first apiserver: %q, %v", secret, err)
	}
	if b, _ := os.ReadFile(first); string(b) != secret+"\n" {
		t.Errorf("admin-token file holds %q", b)
	}
	if s, err := bootstrapAdmin(ctx, st, second); err != nil || s != "" {
		t.Errorf("second apiserver: %q, %v; want no token", s, err)
	}
	if _, err := os.Stat(second); !os.IsNotExist(err) {
		t.Errorf("second apiserver wrote a token file")
	}
	// A restart of the first keeps its token.
	if s, err := bootstrapAdmin(ctx, st, first); err != nil || s != secret {
		t.Errorf("restart: %q, %v; want the same token", s, err)
	}
}

func TestBootstrapNodeTokenOnce(t *testing.T) {
	ctx := context.Background()
	st := store.Memory()
	m := iam.New(st, iam.Options{})
	first := filepath.Join(t.TempDir(), NodeTokenFile)
	second := filepath.Join(t.TempDir(), NodeTokenFile)

	if minted, err := bootstrapNodeToken(ctx, st, m, first); err != nil || !minted {
		t.Fatalf("first apiserver: minted %v, %v", minted, err)
	}
	b, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimSpace(string(b))
	p, err := m.Authenticate(ctx, secret)
	if err != nil || p.Role != iam.RoleNode || p.Project != "" {
		t.Fatalf("the node-token file's token: %+v, %v; want a root node token", p, err)
	}
	if minted, err := bootstrapNodeToken(ctx, st, m, second); err != nil || minted {
		t.Errorf("second apiserver: minted %v, %v; want no token", minted, err)
	}
	if _, err := os.Stat(second); !os.IsNotExist(err) {
		t.Errorf("second apiserver wrote a node token file")
	}
	// A restart keeps the file, and does not bring a revoked token back.
	if err := m.RevokeToken(ctx, iam.SystemPrincipal(), p.TokenID); err != nil {
		t.Fatal(err)
	}
	if minted, err := bootstrapNodeToken(ctx, st, m, first); err != nil || minted {
		t.Errorf("restart: minted %v, %v; want the file kept", minted, err)
	}
	if _, err := m.Authenticate(ctx, secret); err == nil {
		t.Errorf("a revoked bootstrap node token authenticates after a restart")
	}
}

func TestAdvertise(t *testing.T) {
	for _, tc := range []struct{ endpoint, want string }{
		{"http://10.0.0.1:2379", "10.0.0.1:2379"},
		{"https://api.example", "api.example:443"},
		{"http://api.example", "api.example:80"},
		{"10.0.0.1:2379", "10.0.0.1:2379"},
	} {
		if got := hostPort(tc.endpoint); got != tc.want {
			t.Errorf("hostPort(%q) = %q, want %q", tc.endpoint, got, tc.want)
		}
	}
	if got := advertise(&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 7444}, "127.0.0.1:1"); got != "10.1.2.3:7444" {
		t.Errorf("specific listen address advertised as %q", got)
	}
	if got := advertise(&net.TCPAddr{IP: net.IPv4zero, Port: 7444}, "127.0.0.1:2379"); got != "127.0.0.1:7444" {
		t.Errorf("unspecified listen address, control plane on loopback: advertised %q", got)
	}
}
