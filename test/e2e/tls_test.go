package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestClusterTLS runs an apiserver and agents as separate processes over
// TLS on loopback, with a CA and certificates made by `warren cert`: the
// agent registers through the apiserver over https and serves its node API
// over https, which the apiserver verifies with the CA; a client with the
// CA creates, execs in and deletes a sandbox through it. A client without
// the CA is refused with a clear error, and so is one that dials a name
// the certificate does not carry; an agent whose certificate is for
// another name is never reached.
func TestClusterTLS(t *testing.T) {
	testutil.RequireBinary(t, "go", "mkfs.erofs", "busybox")
	dir := t.TempDir()
	bin := warrenBin(t, "warrenfake") // its agents run the fake backend
	run := func(env []string, args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String(), errb.String(), code
	}
	must := func(env []string, args ...string) string {
		t.Helper()
		out, errs, code := run(env, args...)
		if code != 0 {
			t.Fatalf("warren %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
		}
		return out
	}
	pki := filepath.Join(dir, "pki")
	must(nil, "cert", "init", pki)
	if _, _, code := run(nil, "cert", "init", pki); code == 0 {
		t.Errorf("a second cert init over an existing CA succeeded")
	}
	must(nil, "cert", "issue", pki, "127.0.0.1")
	must(nil, "cert", "issue", pki, "agent0", "127.0.0.1")
	must(nil, "cert", "issue", pki, "wrong.example")
	if st, err := os.Stat(filepath.Join(pki, "ca.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key: %v, %v; want mode 0600", st, err)
	}
	ca := filepath.Join(pki, "ca.crt")
	crt := func(name string) []string {
		return []string{"--tls-cert", filepath.Join(pki, name+".crt"), "--tls-key", filepath.Join(pki, name+".key")}
	}
	caPEM, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	waitTLS := func(p *proc, url string, hc *http.Client) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) && p.alive() {
			if resp, err := hc.Get(url); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					if resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
						t.Errorf("%s answered without TLS 1.2+: %+v", url, resp.TLS)
					}
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s did not come up at %s:\n%s", p.name, url, p.logs())
	}

	etcd := startEtcdCluster(t, filepath.Join(dir, "etcd"), 1)
	m := &multi{t: t, bin: bin, dir: dir}
	var procs []*proc
	t.Cleanup(func() {
		for i := len(procs) - 1; i >= 0; i-- {
			p := procs[i]
			p.stop()
			if t.Failed() {
				t.Logf("--- %s log:\n%s", p.name, p.logs())
			}
		}
	})
	apiAddr := freeAddr(t)
	procs = append(procs, m.start("apiserver", exec.Command(bin, append([]string{"apiserver",
		"--etcd", etcd.endpoints("127.0.0.1"), "--listen", apiAddr, "--ca", ca,
		"--data-dir", filepath.Join(dir, "api"), "--blobs", filepath.Join(dir, "blobs"), "--poll-interval", "300ms"},
		crt("127.0.0.1")...)...)))
	apiURL := "https://" + apiAddr
	waitTLS(procs[0], apiURL+"/healthz", hc)
	admin := strings.TrimSpace(string(readFile(t, filepath.Join(dir, "api", "admin-token"))))
	nodeTok := strings.TrimSpace(string(readFile(t, filepath.Join(dir, "api", "node-token"))))

	agent := func(name, certName string, hc *http.Client) *proc {
		listen := freeAddr(t)
		p := m.start(name, exec.Command(bin, append([]string{"agent", "--apiserver", apiURL, "--ca", ca,
			"--token", nodeTok, "--listen", listen, "--backend", "fake",
			"--data-dir", filepath.Join(dir, name), "--blobs", filepath.Join(dir, "blobs")}, crt(certName)...)...))
		procs = append(procs, p)
		waitTLS(p, "https://"+listen+"/healthz", hc)
		return p
	}
	agent("agent0", "agent0", hc)

	env := []string{"WARREN_ADDR=" + apiURL, "WARREN_TOKEN=" + admin, "WARREN_CA=" + ca}
	var nodes api.NodeList
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := json.Unmarshal([]byte(must(env, "node", "ls", "-o", "json")), &nodes); err != nil {
			t.Fatal(err)
		}
		if len(nodes.Nodes) == 1 && nodes.Nodes[0].Healthy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent over TLS not healthy after 20s: %+v", nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if a := nodes.Nodes[0].Address; !strings.HasPrefix(a, "https://127.0.0.1:") {
		t.Errorf("agent with a certificate registered address %q, want https://127.0.0.1:port", a)
	}

	// Create, exec, delete over TLS end to end.
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(must(env, "sandbox", "create", "--image", "busybox", "-o", "json")), &sb); err != nil {
		t.Fatal(err)
	}
	if out := must(env, "exec", sb.ID, "--", "sh", "-c", "echo hi over tls"); !strings.HasPrefix(out, "hi") {
		t.Errorf("exec over TLS: %q", out)
	}
	must(env, "sandbox", "rm", sb.ID)
	if _, _, code := run(env, "sandbox", "get", sb.ID); code == 0 {
		t.Errorf("sandbox %s still there after rm", sb.ID)
	}

	// Without the CA: refused, and the message says why and what to do.
	noCA := []string{"WARREN_ADDR=" + apiURL, "WARREN_TOKEN=" + admin, "WARREN_CA="}
	_, errs, code := run(noCA, "sandbox", "ls")
	if code == 0 || !strings.Contains(errs, "not signed by a CA this client trusts") || !strings.Contains(errs, "WARREN_CA") {
		t.Errorf("client without the CA: exit %d, %q; want refused naming --ca/WARREN_CA", code, errs)
	}
	// A name the certificate does not carry: refused.
	_, errs, code = run([]string{"WARREN_ADDR=https://localhost:" + portOf(apiAddr), "WARREN_TOKEN=" + admin, "WARREN_CA=" + ca}, "sandbox", "ls")
	if code == 0 || !strings.Contains(errs, "not valid for the name dialed") {
		t.Errorf("client dialing a name not on the certificate: exit %d, %q; want refused", code, errs)
	}
	// Plain HTTP to a TLS apiserver: refused too.
	if _, _, code := run([]string{"WARREN_ADDR=http://" + apiAddr, "WARREN_TOKEN=" + admin}, "sandbox", "ls"); code == 0 {
		t.Errorf("plain HTTP to a TLS apiserver succeeded")
	}

	// An agent whose certificate is for another name registers, but the
	// apiserver, verifying it, never reaches it.
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	bad := agent("agent-wrong", "wrong.example", insecure)
	time.Sleep(3 * time.Second)
	if err := json.Unmarshal([]byte(must(env, "node", "ls", "-o", "json")), &nodes); err != nil {
		t.Fatal(err)
	}
	unhealthy := 0
	for _, n := range nodes.Nodes {
		if !n.Healthy {
			unhealthy++
		}
	}
	if len(nodes.Nodes) != 2 || unhealthy != 1 || !strings.Contains(procs[0].logs(), "x509: cannot validate certificate for 127.0.0.1") {
		t.Errorf("nodes %+v: want the agent with a wrong-name certificate registered and unhealthy\n%s", nodes.Nodes, bad.logs())
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func portOf(addr string) string {
	_, p, _ := strings.Cut(addr, ":")
	return p
}

// warren up given a certificate serves its API over TLS only: the CLI with
// the cluster CA creates, runs and removes a sandbox through it; without
// the CA it is refused with a TLS error, never served in clear.
func TestUpTLS(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	bin := warrenBin(t)
	pkiDir := t.TempDir()
	for _, args := range [][]string{{"cert", "init", pkiDir}, {"cert", "issue", pkiDir, "127.0.0.1"}} {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("warren %v: %v\n%s", args, err, out)
		}
	}
	addr := freeAddr(t)
	c := &cluster{T: t, Bin: bin, DataDir: t.TempDir(), Addr: addr,
		Args: []string{"--no-fn", "--stop-sandboxes",
			"--tls-cert", filepath.Join(pkiDir, "127.0.0.1.crt"), "--tls-key", filepath.Join(pkiDir, "127.0.0.1.key")},
		Env: []string{"WARREN_ADDR=https://" + addr, "WARREN_CA=" + filepath.Join(pkiDir, "ca.crt")}}
	c.Start()
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			t.Logf("warren up log:\n%s", c.Log)
		}
	})
	id := strings.TrimSpace(c.MustRun("sandbox", "create", "--image", "busybox"))
	if out := c.MustRun("exec", id, "--sh", "echo over tls"); out != "over tls\n" {
		t.Errorf("exec over TLS: %q", out)
	}
	c.MustRun("sandbox", "rm", id)

	c.Env = []string{"WARREN_ADDR=https://" + addr, "WARREN_CA="}
	if _, stderr, code := c.Run("node", "ls"); code == 0 || !strings.Contains(strings.ToLower(stderr), "certificate") {
		t.Errorf("a client without the CA: exit %d, %q; want a refusal naming the certificate", code, stderr)
	}
	c.Env = []string{"WARREN_ADDR=http://" + addr}
	if _, _, code := c.Run("node", "ls"); code == 0 {
		t.Errorf("plain HTTP to warren up over TLS was served")
	}
}
