// Package pki makes and loads the certificates of a warren cluster with the
// standard library alone, so that a cluster is set up over TLS without
// another tool: a cluster CA (InitCA), certificates it signs for a role's
// names (Issue), and the tls.Configs every role serves and dials with
// (ServerConfig, ClientConfig). Keys are ECDSA P-256; connections are
// TLS 1.2 or later (1.3 when both ends have it).
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// File names under a CA directory.
const (
	CACert = "ca.crt"
	CAKey  = "ca.key"
)

// Lifetimes of what InitCA and Issue make.
const (
	CALifetime   = 10 * 365 * 24 * time.Hour
	CertLifetime = 2 * 365 * 24 * time.Hour
)

// InitCA makes a cluster CA in dir: dir/ca.crt and dir/ca.key (mode 0600).
// An existing CA is never overwritten: ErrConflict.
func InitCA(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []string{CACert, CAKey} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return errdefs.New(errdefs.ErrConflict, "ca_exists", "%s already exists: a CA is never overwritten", filepath.Join(dir, f))
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "warren cluster CA", Organization: []string{"warren"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	// The key first: a ca.crt without its key would block a retry.
	if err := writeKey(filepath.Join(dir, CAKey), key); err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, CACert), "CERTIFICATE", der, 0o644)
}

// namePattern: what a certificate may be issued for besides IP addresses,
// DNS names (also wildcards, one label) and localhost.
var namePattern = regexp.MustCompile(`^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

// Issue makes a certificate signed by the CA in dir for names (DNS names
// and IP addresses, all of them subject alternative names), usable as a
// server and as a client certificate. Its files are dir/<first>.crt and
// dir/<first>.key (0600); existing ones are replaced. It returns the
// certificate's path. Errors: ErrInvalid (no names, a malformed one),
// ErrNotFound (no CA in dir).
func Issue(dir string, names ...string) (string, error) {
	if len(names) == 0 {
		return "", errdefs.Invalid("a certificate needs at least one name")
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: names[0], Organization: []string{"warren"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(CertLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			continue
		}
		if len(n) > 253 || !namePattern.MatchString(n) {
			return "", errdefs.Invalid("certificate name %q: want a DNS name or an IP address", n)
		}
		tmpl.DNSNames = append(tmpl.DNSNames, n)
	}
	base := strings.ReplaceAll(names[0], "*", "_")
	if strings.ContainsAny(base, `/\`) || base == "ca" {
		return "", errdefs.Invalid("certificate name %q cannot name a file next to the CA", names[0])
	}
	ca, caKey, err := loadCA(dir)
	if err != nil {
		return "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	crt := filepath.Join(dir, base+".crt")
	if err := writeKey(filepath.Join(dir, base+".key"), key); err != nil {
		return "", err
	}
	return crt, writePEM(crt, "CERTIFICATE", der, 0o644)
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, err := os.ReadFile(filepath.Join(dir, CACert))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, errdefs.New(errdefs.ErrNotFound, "ca_not_found", "no CA in %s: run `warren cert init %s` first", dir, dir)
	}
	if err != nil {
		return nil, nil, err
	}
	kb, err := os.ReadFile(filepath.Join(dir, CAKey))
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	p, _ := pem.Decode(cb)
	if p == nil || p.Type != "CERTIFICATE" {
		return nil, nil, errdefs.Invalid("%s: not a PEM certificate", filepath.Join(dir, CACert))
	}
	ca, err := x509.ParseCertificate(p.Bytes)
	if err != nil {
		return nil, nil, err
	}
	k, _ := pem.Decode(kb)
	if k == nil {
		return nil, nil, errdefs.Invalid("%s: not a PEM key", filepath.Join(dir, CAKey))
	}
	key, err := x509.ParseECPrivateKey(k.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	return ca, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

// writePEM replaces path atomically, with mode.
func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// CAPool reads a PEM file of one or more CA certificates.
func CAPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errdefs.Invalid("CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// ServerConfig is the tls.Config of a role serving with certFile and
// keyFile. If caFile is set, clients that present a certificate must have
// one it signed (none is required: callers authenticate with tokens and
// node secrets).
func ServerConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errdefs.Invalid("TLS needs both a certificate (--tls-cert) and its key (--tls-key)")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, errdefs.Invalid("TLS certificate %s / key %s: %v", certFile, keyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if caFile != "" {
		pool, err := CAPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// ClientConfig is the tls.Config of a role that dials TLS peers: it trusts
// caFile's CAs (the system's when caFile is ""), and presents certFile, if
// set, as its client certificate.
func ClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := CAPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if certFile != "" && keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, errdefs.Invalid("TLS certificate %s / key %s: %v", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
