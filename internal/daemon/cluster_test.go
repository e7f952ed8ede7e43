package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/blob/s3test"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/store"
	"github.com/warrenhq/warren/internal/testutil"
)

// testCluster is an apiserver over an embedded etcd member, in this
// process, with agents added by startAgent: the roles as `warren
// apiserver` and `warren agent` run them, sharing one blob store (by
// default a directory).
type testCluster struct {
	t     *testing.T
	dir   string
	etcd  string // client URL
	st    store.Store
	blobs string // the --blobs of every role
	url   string // the apiserver's
	admin *client.Client
	log   *slog.Logger
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func freeURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

func startCluster(t *testing.T, blobs string) *testCluster {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	e, err := store.StartEmbedded(ctx, filepath.Join(dir, "etcd"), store.WithClientURL(freeURL(t)))
	if err != nil {
		t.Fatal(err)
	}
	if blobs == "" {
		blobs = filepath.Join(dir, "blobs") // shared, as a filesystem every host mounts
	}
	c := &testCluster{t: t, dir: dir, etcd: e.Endpoint(), st: e.Store(), blobs: blobs, log: quietLogger()}
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- APIServer(ctx, APIServerConfig{
			DataDir: filepath.Join(dir, "api"), Listen: "127.0.0.1:0", Etcd: []string{c.etcd}, Blobs: blobs,
			Fleet:   fleet.Config{PollInterval: 100 * time.Millisecond},
			Refresh: 200 * time.Millisecond,
			Log:     c.log,
			Ready:   func(a string) { addr <- a },
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		e.Close()
	})
	select {
	case a := <-addr:
		c.url = "http://" + a
	case err := <-done:
		t.Fatalf("apiserver: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("apiserver not up after 60s")
	}
	b, err := os.ReadFile(filepath.Join(dir, "api", AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	c.admin = client.New(c.url, strings.TrimSpace(string(b)), client.WithCreateRetry(client.RetryPolicy{}))
	return c
}

// nodeToken returns the bootstrap node token the apiserver wrote.
func (c *testCluster) nodeToken() string {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.dir, "api", NodeTokenFile))
	if err != nil {
		c.t.Fatalf("the first apiserver wrote no node token: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// mintNodeToken mints a node token as `warren token create --role node`.
func (c *testCluster) mintNodeToken() api.CreatedToken {
	c.t.Helper()
	tok, err := c.admin.CreateToken(context.Background(), api.CreateTokenRequest{Project: "/", Role: api.RoleNode, Name: "per-node"})
	if err != nil {
		c.t.Fatal(err)
	}
	return *tok
}

type testAgent struct {
	id, addr string
	stop     func() error // stops the agent, returning what Agent returned
	done     chan error
}

// startAgent runs an agent on data dir name with token, registering
// through etcd (viaEtcd) or the apiserver, and waits until it is up; or
// returns the error Agent returned first.
func (c *testCluster) startAgent(name, token string, viaEtcd bool, mods ...func(*AgentConfig)) (*testAgent, error) {
	c.t.Helper()
	return c.startAgentWith(name, token, viaEtcd, mods...)
}

// startAgentWith is startAgent with mods applied to the agent's config.
func (c *testCluster) startAgentWith(name, token string, viaEtcd bool, mods ...func(*AgentConfig)) (*testAgent, error) {
	c.t.Helper()
	cfg := AgentConfig{
		DataDir: filepath.Join(c.dir, name), Listen: "127.0.0.1:0", Token: token,
		Blobs: c.blobs, Simulated: simulated, RegistrationTTL: 3 * time.Second, Log: c.log,
	}
	if viaEtcd {
		cfg.Etcd = []string{c.etcd}
	} else {
		cfg.APIServers = []string{c.url}
	}
	for _, m := range mods {
		m(&cfg)
	}
	ready := make(chan string, 1)
	cfg.Ready = func(a string) { ready <- a }
	ctx, cancel := context.WithCancel(context.Background())
	a := &testAgent{done: make(chan error, 1)}
	go func() { a.done <- Agent(ctx, cfg) }()
	var result error
	stopped := false
	a.stop = func() error {
		cancel()
		if !stopped {
			result, stopped = <-a.done, true
		}
		return result
	}
	c.t.Cleanup(func() { a.stop() })
	select {
	case a.addr = <-ready:
	case err := <-a.done:
		result, stopped = err, true
		if err == nil {
			err = errors.New("agent ended before it was up")
		}
		return nil, err
	case <-time.After(30 * time.Second):
		c.t.Fatalf("agent %s not up after 30s", name)
	}
	id, err := os.ReadFile(filepath.Join(cfg.DataDir, "node-id"))
	if err != nil {
		c.t.Fatal(err)
	}
	a.id = strings.TrimSpace(string(id))
	return a, nil
}

func (c *testCluster) mustAgent(name, token string, viaEtcd bool, mods ...func(*AgentConfig)) *testAgent {
	c.t.Helper()
	a, err := c.startAgent(name, token, viaEtcd, mods...)
	if err != nil {
		c.t.Fatalf("agent %s: %v", name, err)
	}
	return a
}

// registration reads a node's registration from etcd.
func (c *testCluster) registration(id string) fleet.Registration {
	c.t.Helper()
	kv, err := c.st.Get(context.Background(), fleet.Key(id))
	if err != nil {
		c.t.Fatalf("registration of %s: %v", id, err)
	}
	var r fleet.Registration
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		c.t.Fatal(err)
	}
	return r
}

func (c *testCluster) waitHealthy(ids ...string) {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		nodes, err := c.admin.ListNodes(context.Background())
		healthy := map[string]bool{}
		for _, n := range nodes {
			healthy[n.ID] = n.Healthy
		}
		all := err == nil
		for _, id := range ids {
			all = all && healthy[id]
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("nodes %v not all healthy after 15s: %+v, %v", ids, nodes, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeStatus calls a node's API as an apiserver does, with secret.
func nodeStatus(t *testing.T, addr, secret string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestNodeTokens: agents join with any node token, the first apiserver's
// or one minted with `warren token create --role node`, through etcd or
// through the apiserver; each registers a secret of its own, which only
// that node's API accepts, which the apiserver uses to reach it and which
// no API shows; a restart draws a new one; a revoked node token registers
// no more, and the agent that holds it stops.
func TestNodeTokens(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs", "busybox")
	ctx := context.Background()
	c := startCluster(t, "")
	boot := c.nodeToken()
	toks, err := c.admin.ListTokens(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	bootstrap := 0
	for _, tk := range toks {
		if tk.Role == api.RoleNode && tk.Name == "bootstrap-node" {
			bootstrap++
		}
	}
	if bootstrap != 1 {
		t.Fatalf("tokens %+v: want one bootstrap node token, revocable like any", toks)
	}
	minted := c.mintNodeToken()

	a := c.mustAgent("a", boot, true)
	b := c.mustAgent("b", minted.Secret, false)
	c.waitHealthy(a.id, b.id)
	ra, rb := c.registration(a.id), c.registration(b.id)
	if ra.Secret == "" || rb.Secret == "" || ra.Secret == rb.Secret || ra.Secret == boot || rb.Secret == minted.Secret {
		t.Fatalf("node secrets %q and %q: want two of their own", ra.Secret, rb.Secret)
	}
	if got := nodeStatus(t, b.addr, ra.Secret); got != http.StatusUnauthorized {
		t.Errorf("node a's secret on node b: %d, want 401", got)
	}
	if got := nodeStatus(t, b.addr, minted.Secret); got != http.StatusUnauthorized {
		t.Errorf("b's node token on its own node API: %d, want 401", got)
	}
	if got := nodeStatus(t, b.addr, rb.Secret); got != http.StatusOK {
		t.Errorf("node b's secret on node b: %d, want 200", got)
	}
	req, _ := http.NewRequest("GET", c.url+"/v1/nodes", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(must(os.ReadFile(filepath.Join(c.dir, "api", AdminTokenFile))))))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || bytes.Contains(body, []byte(ra.Secret)) || bytes.Contains(body, []byte(rb.Secret)) ||
		!bytes.Contains(body, []byte(a.id)) {
		t.Errorf("GET /v1/nodes shows a node secret, or fails: %d %s", resp.StatusCode, body)
	}

	// The apiserver reaches both, each with its own secret.
	onNode := map[string]string{}
	for len(onNode) < 2 {
		sb, err := c.admin.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		onNode[sb.Node] = sb.ID
	}
	for nid, id := range onNode {
		if sb, err := c.admin.GetSandbox(ctx, id); err != nil || sb.State != api.StateRunning {
			t.Errorf("sandbox %s on %s: %+v, %v", id, nid, sb, err)
		}
	}

	// A restart draws a new secret; the fleet view follows it.
	if err := a.stop(); err != nil {
		t.Fatalf("agent a stopped with %v", err)
	}
	a = c.mustAgent("a", boot, true)
	if s := c.registration(a.id).Secret; s == ra.Secret || s == "" {
		t.Errorf("after a restart, node a's secret is %q (was %q): want a new one", s, ra.Secret)
	}
	if got := nodeStatus(t, a.addr, ra.Secret); got != http.StatusUnauthorized {
		t.Errorf("node a's old secret after its restart: %d, want 401", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		sb, err := c.admin.GetSandbox(ctx, onNode[a.id])
		if err == nil && sb.State == api.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox on node a after its restart: %+v, %v", sb, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Revoke b's token: b cannot renew its registration and stops, and
	// the token registers nothing more, through the apiserver or etcd.
	if err := c.admin.RevokeToken(ctx, minted.Token.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-b.done:
		if !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("agent b after its token was revoked: %v, want ErrUnauthenticated", err)
		}
		b.done <- err // for its cleanup
	case <-time.After(15 * time.Second):
		t.Fatal("agent b still running 15s after its node token was revoked")
	}
	for _, viaEtcd := range []bool{false, true} {
		if _, err := c.startAgent(fmt.Sprintf("revoked-%v", viaEtcd), minted.Secret, viaEtcd); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("agent with a revoked token (via etcd %v): %v, want ErrUnauthenticated", viaEtcd, err)
		}
	}
	// A token of another role is no node token.
	admin := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(c.dir, "api", AdminTokenFile)))))
	for _, viaEtcd := range []bool{false, true} {
		if _, err := c.startAgent(fmt.Sprintf("admin-%v", viaEtcd), admin, viaEtcd); !errors.Is(err, errdefs.ErrForbidden) {
			t.Errorf("agent with an admin token (via etcd %v): %v, want ErrForbidden", viaEtcd, err)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestS3Blobs runs an apiserver and an agent on an S3 blob store: a layer
// built through the API lands in the bucket, and the node fetches it from
// there to create a sandbox; neither role keeps a blob directory. Gated
// like every S3 test (s3test).
func TestS3Blobs(t *testing.T) {
	srv := s3test.Start(t)
	testutil.RequireBinary(t, "mkfs.erofs", "busybox")
	bucket := srv.NewBucket(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	spec := "s3://" + bucket + "/cluster-blobs?endpoint=http://" + srv.Endpoint
	c := startCluster(t, spec)
	a := c.mustAgent("agent", c.nodeToken(), true)
	c.waitHealthy(a.id)
	ctx := context.Background()

	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	content := "through s3\n"
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "etc/motd", Mode: 0o644, Size: int64(len(content))})
	io.WriteString(tw, content)
	tw.Close()
	layer, err := c.admin.BuildLayer(ctx, client.LayerSpec{Name: "motd", Version: "1", Kind: api.LayerBase}, &layerTar)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.admin.CreateSandbox(ctx, api.CreateSandboxRequest{Layers: []string{"motd@1"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Node != a.id || len(sb.Layers) != 1 || sb.Layers[0] != layer.Digest {
		t.Fatalf("sandbox %+v: want it on %s from layer %s", sb, a.id, layer.Digest)
	}

	// The bucket holds the blobs, under the prefix; no role has a blob
	// directory; the node's cache has the layer, fetched from the bucket.
	objects := 0
	for obj := range srv.Client().ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: "cluster-blobs/sha256/", Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		objects++
	}
	if objects == 0 {
		t.Errorf("no blob in s3://%s/cluster-blobs/sha256/", bucket)
	}
	for _, d := range []string{"api", "agent"} {
		if _, err := os.Stat(filepath.Join(c.dir, d, "blobs")); !os.IsNotExist(err) {
			t.Errorf("%s has a blob directory (%v): the S3 store was not used", d, err)
		}
	}
	cached := false
	filepath.WalkDir(filepath.Join(c.dir, "agent", "node", "cache"), func(p string, de os.DirEntry, err error) error {
		if err == nil && !de.IsDir() && strings.Contains(p, strings.TrimPrefix(layer.Digest, "sha256:")) {
			cached = true
		}
		return nil
	})
	if !cached {
		t.Errorf("layer %s not in the node's cache", layer.Digest)
	}
}

func TestOpenBlobsErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := openBlobs(ctx, "", dir); err != nil {
		t.Fatalf("default blob store: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "blobs")); err != nil || !fi.IsDir() {
		t.Errorf("default blob store not at <data-dir>/blobs: %v", err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	for spec, want := range map[string]string{
		"s3://bucket/p?endpoint=127.0.0.1:1": "AWS_ACCESS_KEY_ID",
		"s3://bucket/p?endpont=127.0.0.1:1":  `unknown parameter "endpont"`,
		"gs://bucket/p":                      `unknown scheme "gs"`,
	} {
		if _, err := openBlobs(ctx, spec, dir); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("openBlobs(%q): %v, want ErrInvalid saying %q", spec, err, want)
		}
	}
	// A role with a bad --blobs fails at once, saying why.
	err := Agent(ctx, AgentConfig{DataDir: t.TempDir(), Etcd: []string{"http://127.0.0.1:1"}, Token: "x", Blobs: "gs://b", Simulated: simulated})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("agent with --blobs gs://b: %v, want ErrInvalid", err)
	}
}
