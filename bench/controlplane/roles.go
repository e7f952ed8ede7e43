package main

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	_ "net/http/pprof" // served on each role's pprof listener
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/daemon"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/placement"
	"github.com/warrenhq/warren/internal/store"
)

// roleFlags are what the driver passes to a child.
type roleFlags struct {
	dir      string
	etcd     string // client URL
	nodes    int
	strategy string
	k        int
	token    string // node token (agents), shared secret (relay, barenodes)
	addrs    string // comma-separated node addresses (relay)
	blobs    string // the blob store every apiserver and agent shares
}

// runRole runs this process as one role until its stdin closes or it gets
// SIGTERM, and returns the exit code.
func runRole(role string, f roleFlags) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; cancel() }()

	pprofAddr, err := servePprof()
	if err != nil {
		return fail(err)
	}
	var ready func(readyMsg)
	var once sync.Once
	ready = func(m readyMsg) {
		once.Do(func() {
			m.Pprof = pprofAddr
			json.NewEncoder(os.Stdout).Encode(m)
		})
	}
	switch role {
	case "etcd":
		err = runEtcd(ctx, f, ready)
	case "apiserver":
		err = runAPIServer(ctx, f, ready)
	case "agents":
		err = runAgents(ctx, f, ready)
	case "relay":
		err = runRelay(ctx, f, ready)
	case "barenodes":
		err = runBareNodes(ctx, f, ready)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// fail reports err on the ready line (if none went out yet, the driver
// shows it) and on stderr.
func fail(err error) int {
	json.NewEncoder(os.Stdout).Encode(readyMsg{Err: err.Error()})
	fmt.Fprintln(os.Stderr, "error:", err)
	return 1
}

func servePprof() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go http.Serve(ln, http.DefaultServeMux)
	return ln.Addr().String(), nil
}

func logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// runEtcd runs an embedded etcd member on a loopback TCP port.
func runEtcd(ctx context.Context, f roleFlags, ready func(readyMsg)) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	e, err := store.StartEmbedded(ctx, filepath.Join(f.dir, "etcd"), store.WithClientURL(u), store.WithLogger(logger(slog.LevelWarn)))
	if err != nil {
		return err
	}
	defer e.Close()
	ready(readyMsg{Addr: e.Endpoint()})
	select {
	case <-ctx.Done():
	case err := <-e.Err():
		return err
	}
	return nil
}

// runAPIServer runs `warren apiserver` as cmd/warren does, logging at
// info level (its default) to stderr.
func runAPIServer(ctx context.Context, f roleFlags, ready func(readyMsg)) error {
	return daemon.APIServer(ctx, daemon.APIServerConfig{
		DataDir:   filepath.Join(f.dir, "apiserver"),
		Listen:    "127.0.0.1:0",
		Etcd:      []string{f.etcd},
		Blobs:     f.blobs,
		Placement: placement.Config{Strategy: placement.Strategy(f.strategy), K: f.k},
		Log:       logger(slog.LevelInfo),
		Ready:     func(addr string) { ready(readyMsg{Addr: addr}) },
	})
}

// nodeLimits are high enough that no simulated node refuses a create for
// capacity during a run: the benchmark measures the control plane.
var nodeLimits = node.Limits{CPU: 1e6, Memory: 1 << 50, Sandboxes: 1 << 20, CreatesInFlight: 4096}

// runAgents runs f.nodes `warren agent`s with the fake backend in this
// process, each on its own listener and data dir, registered through etcd.
// They log at warn level: one process holds 160 nodes' worth of lines.
func runAgents(ctx context.Context, f roleFlags, ready func(readyMsg)) error {
	log := logger(slog.LevelWarn)
	errc := make(chan error, f.nodes)
	up := make(chan string, f.nodes)
	var wg sync.WaitGroup
	for i := range f.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := daemon.Agent(ctx, daemon.AgentConfig{
				DataDir: filepath.Join(f.dir, "agents", fmt.Sprintf("a%03d", i)),
				Listen:  "127.0.0.1:0",
				Etcd:    []string{f.etcd},
				Token:   f.token,
				Blobs:   f.blobs,
				Limits:  nodeLimits,
				Simulated: func(dir string) (backend.Backend, error) {
					return fake.New(dir, fake.Options{Name: api.BackendContainer})
				},
				Log:   log,
				Ready: func(addr string) { up <- addr },
			})
			if err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("agent %d: %w", i, err)
			}
		}()
	}
	var addrs []string
	for len(addrs) < f.nodes {
		select {
		case a := <-up:
			addrs = append(addrs, a)
		case err := <-errc:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ready(readyMsg{Addrs: addrs})
	wg.Wait()
	return nil
}

// The relay peer: the same two HTTP hops with JSON on both, and nothing
// else. The relay checks one bearer secret, decodes the create, picks a
// node at random and posts it there over a node-API transport; a bare node
// decodes it and answers a made-up sandbox; the relay decodes that and
// answers it. No store, quota, placement, image or disk.

// runRelay serves POST /v1/sandboxes, relayed to f.addrs.
func runRelay(ctx context.Context, f roleFlags, ready func(readyMsg)) error {
	nodes := strings.Split(f.addrs, ",")
	hc := &http.Client{Transport: nodeapi.NewTransport()}
	want := sha256.Sum256([]byte(f.token))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		got := sha256.Sum256([]byte(tok))
		if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
			http.Error(w, `{"error":{"code":"unauthenticated"}}`, http.StatusUnauthorized)
			return
		}
		var req api.CreateSandboxRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		b, _ := json.Marshal(nodeapi.CreateRequest{Request: req})
		nreq, _ := http.NewRequestWithContext(r.Context(), http.MethodPost,
			"http://"+nodes[rand.IntN(len(nodes))]+"/v1/sandboxes", bytes.NewReader(b))
		nreq.Header.Set("Authorization", "Bearer "+f.token)
		nreq.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(nreq)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		var sb api.Sandbox
		if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(sb)
	})
	return serve(ctx, mux, func(addr string) { ready(readyMsg{Addr: addr}) })
}

// runBareNodes serves f.nodes bare nodes: each answers a create with a
// made-up sandbox and accepts the relay's secret or its own. With f.etcd
// it also registers each one there, with its own secret, as an agent
// would, so that an apiserver over that etcd places on them, and answers
// the apiserver's polls (GET /v1/status) and refreshes (GET /v1/changes).
func runBareNodes(ctx context.Context, f roleFlags, ready func(readyMsg)) error {
	var st *store.Etcd
	if f.etcd != "" {
		var err error
		if st, err = store.DialEtcd([]string{f.etcd}, ""); err != nil {
			return err
		}
		defer st.Close()
	}
	var addrs []string
	errc := make(chan error, 2*f.nodes)
	for i := range f.nodes {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		b := &bareNode{id: fmt.Sprintf("b%03d", i), secrets: []string{f.token, randomSuffix()}, epoch: randomSuffix()}
		addrs = append(addrs, ln.Addr().String())
		srv := &http.Server{Handler: b.mux(), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.Serve(ln) }()
		defer srv.Close()
		if st == nil {
			continue
		}
		reg, err := fleet.NewRegistrar(fleet.RegistrarConfig{
			Store: st, Secret: b.secrets[1], Log: logger(slog.LevelWarn),
			Node: api.Node{ID: b.id, Address: ln.Addr().String(), Backends: []string{api.BackendContainer}, Capacity: bareCapacity},
		})
		if err != nil {
			return err
		}
		go func() {
			if err := reg.Run(ctx); err != nil {
				errc <- err
			}
		}()
	}
	ready(readyMsg{Addrs: addrs})
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

var bareCapacity = api.Capacity{CPU: nodeLimits.CPU, Memory: api.Quantity(nodeLimits.Memory), Sandboxes: nodeLimits.Sandboxes}

// bareNode is the least a node API can do: no disk, no backend, no
// admission. It keeps the sandboxes an apiserver creates (its own secret),
// in memory, for its status and changes; the relay's are forgotten at
// once, so that they weigh nothing in the apiserver's placement.
type bareNode struct {
	id      string
	secrets []string // accepted bearer secrets: the relay's, its own
	epoch   string

	mu      sync.Mutex
	live    map[string]api.Sandbox
	used    api.Capacity // of live, as an agent reports it
	rev     uint64
	changed []string // ids created or deleted since the last changes call
}

func (b *bareNode) mux() http.Handler {
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			got := sha256.Sum256([]byte(tok))
			for _, s := range b.secrets {
				want := sha256.Sum256([]byte(s))
				if subtle.ConstantTimeCompare(want[:], got[:]) == 1 {
					h(w, r)
					return
				}
			}
			http.Error(w, `{"error":{"code":"unauthenticated","message":"invalid node token"}}`, http.StatusUnauthorized)
		}
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("POST /v1/sandboxes", auth(b.create))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", auth(b.delete))
	mux.HandleFunc("GET /v1/status", auth(b.status))
	mux.HandleFunc("GET /v1/changes", auth(b.changes))
	mux.HandleFunc("POST /v1/reset", auth(b.reset))
	return mux
}

// reset forgets every sandbox, under a new epoch: the apiserver's next
// refresh reads an empty list, its next poll an empty node.
func (b *bareNode) reset(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	b.live, b.changed, b.used, b.rev = nil, nil, api.Capacity{}, 0
	b.epoch = randomSuffix()
	b.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// resetBare empties every bare node at addrs.
func resetBare(addrs []string, secret string) error {
	for _, a := range addrs {
		req, _ := http.NewRequest(http.MethodPost, "http://"+a+"/v1/reset", nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("reset bare node %s: %w", a, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Errorf("reset bare node %s: %s", a, resp.Status)
		}
	}
	return nil
}

func (b *bareNode) create(w http.ResponseWriter, r *http.Request) {
	var req nodeapi.CreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	now := time.Now().UTC()
	exp := now.Add(time.Hour)
	sb := api.Sandbox{ID: b.id + "-" + randomSuffix(), Node: b.id, Project: req.Request.Project,
		Backend: api.BackendContainer, State: api.StateRunning, Resources: req.Request.Resources,
		Labels: req.Request.Labels, CreatedAt: now, LastUsedAt: now, ExpiresAt: &exp}
	if req.Image != nil {
		sb.Image, sb.Layers = req.Image.Name, req.Image.Layers
	}
	if r.Header.Get("Authorization") == "Bearer "+b.secrets[0] { // the relay
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(sb)
		return
	}
	b.mu.Lock()
	if b.live == nil {
		b.live = map[string]api.Sandbox{}
	}
	b.live[sb.ID] = sb
	b.used.CPU += sb.Resources.CPU
	b.used.Memory += sb.Resources.Memory
	b.used.Sandboxes++
	b.changed = append(b.changed, sb.ID)
	b.rev++
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(sb)
}

func (b *bareNode) delete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	b.mu.Lock()
	if sb, ok := b.live[id]; ok {
		delete(b.live, id)
		b.used.CPU -= sb.Resources.CPU
		b.used.Memory -= sb.Resources.Memory
		b.used.Sandboxes--
		b.changed = append(b.changed, id)
		b.rev++
	}
	b.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (b *bareNode) status(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	n := api.Node{ID: b.id, Backends: []string{api.BackendContainer}, Capacity: bareCapacity, Healthy: true,
		Usage: b.used, UpdatedAt: time.Now().UTC()}
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(n)
}

// changes answers what changed since the last call: one caller (the
// apiserver's refresh) is assumed, as in this benchmark.
func (b *bareNode) changes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	b.mu.Lock()
	ch := node.Changes{Epoch: b.epoch, Rev: b.rev, Sandboxes: []api.Sandbox{}}
	if q.Get("epoch") != b.epoch {
		ch.Full = true
		for _, sb := range b.live {
			ch.Sandboxes = append(ch.Sandboxes, sb)
		}
	} else {
		for _, id := range b.changed {
			if sb, ok := b.live[id]; ok {
				ch.Sandboxes = append(ch.Sandboxes, sb)
			} else {
				ch.Deleted = append(ch.Deleted, id)
			}
		}
	}
	b.changed = nil
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(ch)
}

var suffixEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func randomSuffix() string {
	var b [10]byte
	crand.Read(b[:])
	return suffixEncoding.EncodeToString(b[:])
}

func serve(ctx context.Context, h http.Handler, ready func(addr string)) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ready(ln.Addr().String())
	select {
	case <-ctx.Done():
		srv.Close()
		return nil
	case err := <-errc:
		return err
	}
}
