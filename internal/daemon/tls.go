package daemon

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"

	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/pki"
)

// TLSConfig is a role's TLS: the certificate it serves with, and the CA it
// trusts for the peers it calls. Without Cert and Key the role serves plain
// HTTP (`warren up` on loopback); without CA it trusts the system's roots.
// pki (`warren cert init`, `warren cert issue`) makes all three.
type TLSConfig struct {
	Cert, Key string // --tls-cert, --tls-key
	CA        string // --ca ($WARREN_CA)
}

// Enabled reports whether the role serves TLS.
func (c TLSConfig) Enabled() bool { return c.Cert != "" || c.Key != "" }

// listen opens addr, over TLS when c is Enabled, and names the scheme
// callers use.
func (c TLSConfig) listen(addr string) (net.Listener, string, error) {
	var cfg *tls.Config
	if c.Enabled() {
		var err error
		if cfg, err = pki.ServerConfig(c.Cert, c.Key, c.CA); err != nil {
			return nil, "", err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("listen: %w", err)
	}
	if cfg == nil {
		return ln, "http", nil
	}
	return tls.NewListener(ln, cfg), "https", nil
}

// client is the tls.Config to dial peers with: CA's roots (the system's
// without one), and this role's certificate as its client certificate.
func (c TLSConfig) client() (*tls.Config, error) {
	return pki.ClientConfig(c.CA, c.Cert, c.Key)
}

// nodeHTTP is the http.Client an apiserver calls nodes with: over TLS
// to the agents that registered an https address, verified by c's CA.
func (c TLSConfig) nodeHTTP() (*http.Client, error) {
	tc, err := c.client()
	if err != nil {
		return nil, err
	}
	t := nodeapi.NewTransport()
	t.TLSClientConfig = tc
	return &http.Client{Transport: t}, nil
}
