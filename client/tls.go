package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
)

// WithCAFile makes the client trust the CA certificates in file (PEM), and
// only them, for an https API: the cluster CA of `warren cert init`. A file
// that cannot be read or holds no certificate makes every call fail with
// that error. It applies to the client's own transport, not to one given
// by WithHTTPClient.
func WithCAFile(file string) Option {
	return func(c *Client) {
		b, err := os.ReadFile(file)
		if err != nil {
			c.err = fmt.Errorf("warren client: CA file: %w", err)
			return
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			c.err = fmt.Errorf("warren client: CA file %s holds no PEM certificate", file)
			return
		}
		c.tls = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
}

// WithTLSConfig sets the TLS configuration of the client's own transport
// (trusted roots, a client certificate). It applies to the client's own
// transport, not to one given by WithHTTPClient.
func WithTLSConfig(cfg *tls.Config) Option { return func(c *Client) { c.tls = cfg.Clone() } }

// TLSError is a call refused by the TLS handshake: the server's
// certificate is not signed by a CA the client trusts, is not valid for the
// name the client dialed, or the server does not speak TLS at all. Nothing
// reached the server. Unwrap gives the crypto/x509 or crypto/tls error.
type TLSError struct {
	Addr string
	Err  error
}

func (e *TLSError) Error() string {
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var rh tls.RecordHeaderError
	hint := ""
	switch {
	case errors.As(e.Err, &ua):
		hint = "the server's certificate is not signed by a CA this client trusts: give the cluster's CA (warren --ca or WARREN_CA; in Go, client.WithCAFile)"
	case errors.As(e.Err, &hn):
		hint = "the server's certificate is not valid for the name dialed: use an address on its certificate, or issue one for this name (warren cert issue)"
	case errors.As(e.Err, &rh):
		hint = "the server does not speak TLS: use an http:// address"
	default:
		hint = "TLS handshake failed"
	}
	return fmt.Sprintf("TLS to %s: %s: %v", e.Addr, hint, e.Err)
}

func (e *TLSError) Unwrap() error { return e.Err }

// tlsErr classifies a transport error from the TLS handshake as *TLSError.
func (c *Client) tlsErr(err error) error {
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	var rh tls.RecordHeaderError
	var ve *tls.CertificateVerificationError
	if errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) || errors.As(err, &rh) || errors.As(err, &ve) {
		return &TLSError{Addr: c.base, Err: err}
	}
	return err
}

// httpClientTLS is the default http.Client over cfg.
func httpClientTLS(cfg *tls.Config) *http.Client {
	hc := defaultHTTPClient()
	hc.Transport.(*http.Transport).TLSClientConfig = cfg
	return hc
}
