package python_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/pki"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestPipInstallOffline: `pip install ./sdk/python` into a fresh venv
// with no package index at all (the in-tree PEP 517 backend needs
// nothing), after which the venv imports warren from its site-packages,
// not from the tree.
func TestPipInstallOffline(t *testing.T) {
	testutil.RequireBinary(t, "python3")
	dir := t.TempDir()
	venv := filepath.Join(dir, "venv")
	if out, err := exec.Command("python3", "-m", "venv", venv).CombinedOutput(); err != nil {
		testutil.Unavailable(t, "python3 -m venv (Debian: python3-venv): %v\n%s", err, out)
	}
	src, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	pip := exec.Command(filepath.Join(venv, "bin", "python"), "-m", "pip", "install", "--no-index", "--no-cache-dir", src)
	// No index, and no proxy that could reach one: the build must need nothing.
	pip.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "https_proxy=http://127.0.0.1:9", "http_proxy=http://127.0.0.1:9")
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install %s: %v\n%s", src, err, out)
	}
	check := exec.Command(filepath.Join(venv, "bin", "python"), "-c",
		"import warren, sys; c = warren.Client('127.0.0.1:1', token='x'); print(warren.__file__); print(c.addr)")
	check.Dir = dir // not the source tree
	check.Env = append(os.Environ(), "PYTHONPATH=")
	out, err := check.CombinedOutput()
	if err != nil {
		t.Fatalf("import after install: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), filepath.Join(venv, "lib")) || !strings.Contains(string(out), "http://127.0.0.1:1") {
		t.Errorf("warren imported from %q; want the venv's site-packages", out)
	}
	if _, err := os.Stat(filepath.Join(src, "build")); err == nil {
		t.Errorf("pip install left a build/ directory in the tree")
	}
}

// TestPythonTLS: the Python SDK trusts the CA given as ca= or WARREN_CA,
// and raises TLSError with a stable code for a server it cannot verify
// (no CA given) or one whose certificate is for another name.
func TestPythonTLS(t *testing.T) {
	testutil.RequireBinary(t, "python3")
	dir := t.TempDir()
	if err := pki.InitCA(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Issue(dir, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	cfg, err := pki.ServerConfig(filepath.Join(dir, "127.0.0.1.crt"), filepath.Join(dir, "127.0.0.1.key"), "")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"nodes": [{"id": "n1"}]}`))
	}))
	srv.TLS = cfg
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(dir, "ca.crt")
	script := `
import os, sys
sys.path.insert(0, os.getcwd())
from warren import Client, TLSError
addr, ca = sys.argv[1], sys.argv[2]
assert Client(addr, token="t", ca=ca).list_nodes()[0]["id"] == "n1"
os.environ["WARREN_CA"] = ca
assert Client(addr, token="t").list_nodes()[0]["id"] == "n1"
del os.environ["WARREN_CA"]
for a, c, want in ((addr, "", "tls_untrusted"), (addr.replace("127.0.0.1", "localhost"), ca, "tls_wrong_name")):
    try:
        Client(a, token="t", ca=c).list_nodes()
    except TLSError as e:
        assert e.code == want, (a, e.code, str(e))
        if want == "tls_untrusted":
            assert "WARREN_CA" in str(e), str(e)
    else:
        raise AssertionError("no TLSError for %s" % a)
print("ok")
`
	cmd := exec.Command("python3", "-c", script, srv.URL, ca)
	cmd.Env = append(os.Environ(), "WARREN_CA=", "SSL_CERT_FILE=/nonexistent", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("python TLS checks: %v\n%s", err, out)
	}
}
