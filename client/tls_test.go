package client_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/client"
)

// TestCAFile: a client given the server's CA (WithCAFile) reaches it over
// https; one without it gets a *TLSError that says to pass the CA; a
// missing CA file fails every call.
func TestCAFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"nodes": []}`))
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.crt")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(ca, pemBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := client.New(srv.URL, "t", client.WithCAFile(ca)).ListNodes(ctx); err != nil {
		t.Fatalf("with the CA: %v", err)
	}
	_, err := client.New(srv.URL, "t").ListNodes(ctx)
	var te *client.TLSError
	var ua x509.UnknownAuthorityError
	if !errors.As(err, &te) || !errors.As(err, &ua) || !strings.Contains(err.Error(), "WARREN_CA") {
		t.Errorf("without the CA: %v, want a *TLSError naming WARREN_CA", err)
	}
	if _, err := client.New(srv.URL, "t", client.WithCAFile(filepath.Join(t.TempDir(), "none"))).ListNodes(ctx); err == nil || !strings.Contains(err.Error(), "CA file") {
		t.Errorf("missing CA file: %v", err)
	}
}
