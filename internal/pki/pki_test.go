package pki_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/pki"
)

func TestInitAndIssue(t *testing.T) {
	dir := t.TempDir()
	if err := pki.InitCA(dir); err != nil {
		t.Fatal(err)
	}
	if err := pki.InitCA(dir); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second InitCA: %v, want ErrConflict", err)
	}
	crt, err := pki.Issue(dir, "node1.example", "127.0.0.1", "::1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if crt != filepath.Join(dir, "node1.example.crt") {
		t.Fatalf("cert at %s", crt)
	}
	for _, f := range []string{"ca.key", "node1.example.key"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	b, _ := os.ReadFile(crt)
	p, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(p.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", c.PublicKey)
	}
	if strings.Join(c.DNSNames, ",") != "node1.example,localhost" || len(c.IPAddresses) != 2 {
		t.Errorf("SANs %v %v", c.DNSNames, c.IPAddresses)
	}
	pool, err := pki.CAPool(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: "node1.example", KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("verify for %v: %v", u, err)
		}
	}
	for _, bad := range [][]string{nil, {"a b"}, {"ca"}, {"x/y"}, {"-x"}} {
		if _, err := pki.Issue(dir, bad...); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Issue(%q): %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := pki.Issue(t.TempDir(), "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Issue without a CA: %v, want ErrNotFound", err)
	}
}

// TestHandshake: a client with the CA reaches a server by a name on its
// certificate; one without the CA, or by a name not on it, is refused.
func TestHandshake(t *testing.T) {
	dir := t.TempDir()
	if err := pki.InitCA(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Issue(dir, "srv", "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Issue(dir, "other.example"); err != nil {
		t.Fatal(err)
	}
	serve := func(name string) string {
		cfg, err := pki.ServerConfig(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), "")
		if err != nil {
			t.Fatal(err)
		}
		s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(tls.CipherSuiteName(r.TLS.CipherSuite)))
		}))
		s.TLS = cfg
		s.StartTLS()
		t.Cleanup(s.Close)
		return s.URL
	}
	good, wrong := serve("srv"), serve("other.example")
	get := func(caFile, url string) error {
		cfg, err := pki.ClientConfig(caFile, "", "")
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.TLS.Version != tls.VersionTLS13 {
				t.Errorf("TLS version %x, want 1.3", resp.TLS.Version)
			}
		}
		return err
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := get(ca, good); err != nil {
		t.Fatalf("with the CA: %v", err)
	}
	var ua x509.UnknownAuthorityError
	if err := get("", good); !errors.As(err, &ua) {
		t.Errorf("without the CA: %v, want x509.UnknownAuthorityError", err)
	}
	var hn x509.HostnameError
	if err := get(ca, wrong); !errors.As(err, &hn) {
		t.Errorf("wrong name: %v, want x509.HostnameError", err)
	}
}
