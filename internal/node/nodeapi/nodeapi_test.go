package nodeapi_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/node/nodetest"
)

const token = "node-secret"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// serve starts an agent behind a node API server and returns a client.
func serve(t *testing.T, mod func(*node.Config)) (*nodeapi.Client, *node.Agent, *httptest.Server) {
	t.Helper()
	agent := nodetest.New(t, mod)
	srv := httptest.NewServer(nodeapi.NewServer(agent, nodeapi.Secret(token), quiet))
	t.Cleanup(srv.Close)
	return nodeapi.NewClient(agent.ID(), srv.URL, token, nil), agent, srv
}

func mustCreate(t *testing.T, c *nodeapi.Client, req api.CreateSandboxRequest) api.Sandbox {
	t.Helper()
	if req.Image == "" && len(req.Layers) == 0 {
		req.Image = "busybox"
	}
	sb, err := c.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

func TestLifecycle(t *testing.T) {
	c, _, _ := serve(t, nil)
	ctx := context.Background()

	st, err := c.Status(ctx)
	if err != nil || st.ID != "n1" || !st.Healthy || len(st.Backends) != 1 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	sb := mustCreate(t, c, api.CreateSandboxRequest{Labels: map[string]string{"task": "a"}, Resources: api.Resources{CPU: 0.5}})
	if sb.State != api.StateRunning || sb.Node != "n1" || sb.Resources.CPU != 0.5 {
		t.Fatalf("created %+v", sb)
	}
	// An image resolved by the caller: the node takes it as given.
	img := api.Image{Name: "custom@7", Env: map[string]string{"FROM_IMAGE": "yes"}}
	other, err := c.CreateFrom(ctx, api.CreateSandboxRequest{Image: "custom@7"}, img)
	if err != nil || other.Image != "custom@7" || other.Env["FROM_IMAGE"] != "yes" {
		t.Fatalf("create from a resolved image: %+v, %v", other, err)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.Labels["task"] != "a" {
		t.Fatalf("get: %+v, %v", got, err)
	}
	list, err := c.List(ctx, node.Filter{Labels: map[string]string{"task": "a"}})
	if err != nil || len(list) != 1 || list[0].ID != sb.ID {
		t.Fatalf("list task=a: %+v, %v", list, err)
	}
	list, err = c.List(ctx, node.Filter{State: api.StateStopped})
	if err != nil || len(list) != 0 || list == nil {
		t.Fatalf("list state=stopped: %#v, %v", list, err)
	}
	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Errorf("second delete: %v, want nil", err)
	}
	_, err = c.Get(ctx, sb.ID)
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != api.CodeSandboxNotFound {
		t.Errorf("get deleted: %v (code %q), want ErrNotFound sandbox_not_found", err, errdefs.Code(err))
	}
}

// The node API's sandbox calls are REST v1's: the public Go SDK speaks to
// a node directly (with the node's secret), as an apiserver forwards them.
func sdk(srv *httptest.Server) *client.Client { return client.New(srv.URL, token) }

func TestExec(t *testing.T) {
	nc, _, srv := serve(t, nil)
	c := sdk(srv)
	ctx := context.Background()
	sb := mustCreate(t, nc, api.CreateSandboxRequest{})

	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo out; echo err >&2; printf '\\377'; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "out\n\xff" || res.Stderr != "err\n" || res.ExitCode != 3 {
		t.Errorf("buffered exec: %+v", res)
	}

	// Streamed: output arrives in order, before the result.
	var out, errb bytes.Buffer
	res, err = c.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: "for i in 1 2 3; do echo $i; done; echo bad >&2; exit 5"}, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "1\n2\n3\n" || errb.String() != "bad\n" || res.ExitCode != 5 || res.Stdout != "" {
		t.Errorf("streamed exec: stdout %q stderr %q result %+v", out.String(), errb.String(), res)
	}

	// Output reaches the writer while the command still runs.
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := c.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: "echo first; sleep 2; echo second"}, pw, io.Discard)
		pw.CloseWithError(err)
		done <- err
	}()
	start := time.Now()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(pr, buf); err != nil || string(buf) != "first\n" {
		t.Fatalf("first chunk: %q, %v", buf, err)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("first chunk after %v: not streamed", d)
	}
	io.Copy(io.Discard, pr)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Errors before any output keep their kind, streamed or not.
	missing := api.ExecRequest{Argv: []string{"true"}}
	if _, err = c.Exec(ctx, "n1-aaaaaaaaaaaaaaaa", missing); !client.IsSandboxNotFound(err) {
		t.Errorf("exec in a missing sandbox: %v, want sandbox_not_found", err)
	}
	if _, err = c.ExecStream(ctx, "n1-aaaaaaaaaaaaaaaa", missing, &out, &out); !client.IsSandboxNotFound(err) {
		t.Errorf("streamed exec in a missing sandbox: %v, want sandbox_not_found", err)
	}
	if _, err = c.ExecStream(ctx, sb.ID, api.ExecRequest{}, &out, &out); !client.IsInvalid(err) {
		t.Errorf("exec without a command: %v, want invalid", err)
	}

	// Canceling the caller ends the command on the node.
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = c.ExecStream(cctx, sb.ID, api.ExecRequest{Cmd: "sleep 30"}, &out, &out)
	if err == nil || time.Since(start) > 5*time.Second {
		t.Errorf("canceled exec: %v after %v", err, time.Since(start))
	}
}

func TestFiles(t *testing.T) {
	nc, _, srv := serve(t, nil)
	c := sdk(srv)
	ctx := context.Background()
	sb := mustCreate(t, nc, api.CreateSandboxRequest{})

	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if err := c.WriteFile(ctx, sb.ID, "/data/big.bin", 0o600, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	fi, err := c.Stat(ctx, sb.ID, "/data/big.bin")
	if err != nil || fi.Size != int64(len(big)) || fi.Mode != 0o600 || fi.IsDir {
		t.Fatalf("stat: %+v, %v", fi, err)
	}
	var got bytes.Buffer
	if err := c.ReadFile(ctx, sb.ID, "/data/big.bin", &got); err != nil || !bytes.Equal(got.Bytes(), big) {
		t.Fatalf("read back %d bytes, %v", got.Len(), err)
	}

	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for name, body := range map[string]string{"a.txt": "alpha", "sub/b.txt": "beta"} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	if err := c.WriteTar(ctx, sb.ID, "/work", &tb); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := c.ReadTar(ctx, sb.ID, "/work", &out); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	tr := tar.NewReader(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if h.Typeflag == tar.TypeReg {
			files[strings.TrimPrefix(h.Name, "work/")] = string(b)
		}
	}
	if files["a.txt"] != "alpha" || files["sub/b.txt"] != "beta" {
		t.Errorf("tar read back: %v", files)
	}

	if err = c.ReadFile(ctx, sb.ID, "/nope", io.Discard); !client.IsFileNotFound(err) {
		t.Errorf("read a missing file: %v, want file_not_found", err)
	}
	if _, err = c.Stat(ctx, sb.ID, "relative"); !client.IsInvalid(err) {
		t.Errorf("stat a relative path: %v, want invalid", err)
	}
}

func TestRefusalKeepsRetryAfter(t *testing.T) {
	c, _, _ := serve(t, func(cfg *node.Config) { cfg.Limits.Sandboxes = 1 })
	mustCreate(t, c, api.CreateSandboxRequest{})
	_, err := c.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox"})
	if !errors.Is(err, errdefs.ErrExhausted) || errdefs.Code(err) != api.CodeNodeFull || errdefs.RetryAfter(err) != 2*time.Second {
		t.Errorf("create on a full node: %v (code %q, retry after %v), want ErrExhausted node_full 2s",
			err, errdefs.Code(err), errdefs.RetryAfter(err))
	}
	_, err = c.Create(context.Background(), api.CreateSandboxRequest{Image: "nope"})
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != api.CodeImageNotFound {
		t.Errorf("create from a missing image: %v, want image_not_found", err)
	}
}

func TestAuth(t *testing.T) {
	_, agent, srv := serve(t, nil)
	for _, tok := range []string{"", "wrong"} {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/status", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", tok, resp.StatusCode)
		}
		c := nodeapi.NewClient(agent.ID(), srv.URL, tok, nil)
		if _, err := c.Status(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) || !nodeapi.NotSent(err) {
			t.Errorf("client with token %q: %v, want ErrUnavailable, not sent", tok, err)
		}
	}
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("healthz without a token: %v %v", resp, err)
	}
	if nodeapi.Secret("").Check(context.Background(), "") == nil {
		t.Error("an empty secret accepts an empty token")
	}
}

func TestUnreachable(t *testing.T) {
	c, _, srv := serve(t, nil)
	srv.Close()
	_, err := c.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox"})
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != api.CodeNodeUnreachable || !nodeapi.NotSent(err) {
		t.Errorf("create on a closed node: %v (code %q, not sent %v), want ErrUnavailable node_unreachable, not sent",
			err, errdefs.Code(err), nodeapi.NotSent(err))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Get(ctx, "n1-aaaaaaaaaaaaaaaa"); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled call: %v, want context.Canceled", err)
	}
}

func TestClientsPollStatus(t *testing.T) {
	var nodes []fleet.Registration
	for _, id := range []string{"a1", "b2"} {
		agent := nodetest.New(t, func(c *node.Config) { c.ID = id })
		srv := httptest.NewServer(nodeapi.NewServer(agent, nodeapi.Secret("secret-"+id), quiet))
		t.Cleanup(srv.Close)
		nodes = append(nodes, fleet.Registration{Node: api.Node{ID: id, Address: strings.TrimPrefix(srv.URL, "http://")}, Secret: "secret-" + id})
	}
	var cs fleet.StatusSource = nodeapi.NewClients(nil)
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := cs.Status(context.Background(), n)
			if err != nil || st.ID != n.ID {
				t.Errorf("status of %s: %+v, %v", n.ID, st, err)
			}
		}()
	}
	wg.Wait()
	if _, err := cs.Status(context.Background(), fleet.Registration{Node: api.Node{ID: "x"}}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("status of a node without an address: %v", err)
	}
}

// TestSecretsPerNode: each node's API takes its own secret and no other,
// so node a1's secret opens nothing on b2. A node's refusal reaches the
// apiserver as the node being unreachable, not as the caller's
// credentials failing, and a create refused that way may go elsewhere.
func TestSecretsPerNode(t *testing.T) {
	addrs := map[string]string{}
	for _, id := range []string{"a1", "b2"} {
		agent := nodetest.New(t, func(c *node.Config) { c.ID = id })
		srv := httptest.NewServer(nodeapi.NewServer(agent, nodeapi.Secret("secret-"+id), quiet))
		t.Cleanup(srv.Close)
		addrs[id] = srv.URL
	}
	req, _ := http.NewRequest("GET", addrs["b2"]+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer secret-a1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a1's secret on b2: %d, want 401", resp.StatusCode)
	}

	cs := nodeapi.NewClients(nil)
	if st, err := cs.Node("b2", addrs["b2"], "secret-b2").Status(context.Background()); err != nil || st.ID != "b2" {
		t.Errorf("b2 with its own secret: %+v, %v", st, err)
	}
	c := cs.Node("b2", addrs["b2"], "secret-a1")
	_, err = c.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox"})
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != api.CodeNodeUnreachable || !nodeapi.NotSent(err) {
		t.Errorf("create on b2 with a1's secret: %v (code %q, not sent %v), want ErrUnavailable node_unreachable, not sent",
			err, errdefs.Code(err), nodeapi.NotSent(err))
	}
	// A new registration's secret replaces the client.
	if c2 := cs.Node("b2", addrs["b2"], "secret-b2"); c2 == c {
		t.Errorf("Clients.Node kept the client with the old secret")
	}
}

// TestRegistrationsRefused: an apiserver's 401 to an agent's registration
// is what it says (the node token was refused), not a node unreachable.
func TestRegistrationsRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"code":"unauthenticated","message":"invalid token"}}`)
	}))
	t.Cleanup(srv.Close)
	r := nodeapi.NewRegistrations([]string{srv.URL}, "revoked", nil)
	reg, _ := json.Marshal(fleet.Registration{Node: api.Node{ID: "a1", Address: "a1:1"}, Secret: "s"})
	if _, err := r.PutWithLease(context.Background(), fleet.Key("a1"), reg, time.Second); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("registration with a refused token: %v, want ErrUnauthenticated", err)
	}
}
