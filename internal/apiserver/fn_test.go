package apiserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/fncall/fncalltest"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/node/nodetest"
	"github.com/warrenhq/warren/internal/store"
)

// newFnHarness serves the API on SingleNode with a fake FnCall runner.
func newFnHarness(t testing.TB, runtimes ...string) (*harness, *fncalltest.Fake) {
	t.Helper()
	fake := fncalltest.New(runtimes...)
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: nodetest.New(t, nil), Fn: fake, Images: imagetest.Busybox,
		Tokens: apiserver.StaticToken(token), Log: quietLog,
	}))
	t.Cleanup(srv.Close)
	return &harness{t: t, url: srv.URL}, fake
}

func (h *harness) fnRun(body string) (int, api.FnResult, answer) {
	h.t.Helper()
	resp, b := h.json("POST", "/v1/fn/run", body)
	var res api.FnResult
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &res); err != nil {
			h.t.Fatalf("result %s: %v", b, err)
		}
	}
	return resp.StatusCode, res, answer{resp.StatusCode, resp.Header, b}
}

func (h *harness) fnRuntimes() []api.FnRuntime {
	h.t.Helper()
	resp, b := h.json("GET", "/v1/fn/runtimes", "")
	var list api.FnRuntimeList
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &list) != nil || list.Runtimes == nil {
		h.t.Fatalf("runtimes: %d %s", resp.StatusCode, b)
	}
	return list.Runtimes
}

func TestFnSingleNode(t *testing.T) {
	h, fake := newFnHarness(t, "python3", "cpp")

	st, res, _ := h.fnRun(`{"runtime":"python3","source":"print(input())","stdin":"hi\n","limits":{"cpu_time":"2s","memory":"256Mi"}}`)
	if st != http.StatusOK || res.Status != api.FnOK || res.Node != "n1" || len(res.Cases) != 1 || res.Cases[0].Stdout != "hi\n" {
		t.Fatalf("run: %d %+v", st, res)
	}
	if got := fake.Calls()[0]; got.Limits.CPUTime.D() != 2*time.Second || got.Limits.Memory != 256<<20 {
		t.Errorf("the runner got limits %+v", got.Limits)
	}
	st, res, _ = h.fnRun(`{"runtime":"cpp","source":"COMPILE_ERROR"}`)
	if st != http.StatusOK || res.Status != api.FnCompileError || res.Compile == nil {
		t.Errorf("compile error: %d %+v", st, res)
	}
	st, res, _ = h.fnRun(`{"runtime":"python3","cases":[{"stdin":"1","expected":"1"},{"stdin":"2","expected":"3"},{"stdin":"3"}],"stop_on_fail":true}`)
	if st != http.StatusOK || res.Status != api.FnWrongAnswer || len(res.Cases) != 3 || res.Cases[2].Status != api.FnSkipped {
		t.Errorf("cases: %d %+v", st, res)
	}

	rts := h.fnRuntimes()
	if len(rts) != 2 || rts[0].Name != "python3" || !rts[0].Available || rts[0].Ready != 2 {
		t.Errorf("runtimes: %+v", rts)
	}

	// Refusals keep their status, code and retry hint.
	for _, tc := range []struct {
		name, body string
		setup      func()
		status     int
		code       string
	}{
		{"unknown runtime", `{"runtime":"cobol"}`, nil, 404, api.CodeRuntimeNotFound},
		{"no runtime", `{"source":"x"}`, nil, 400, api.CodeInvalid},
		{"unknown field", `{"runtime":"python3","memroy":"1Gi"}`, nil, 400, api.CodeInvalid},
		{"bad duration", `{"runtime":"python3","limits":{"cpu_time":"soon"}}`, nil, 400, api.CodeInvalid},
		{"negative duration", `{"runtime":"python3","limits":{"wall_time":"-1s"}}`, nil, 400, api.CodeInvalid},
		{"bad size", `{"runtime":"python3","limits":{"memory":"lots"}}`, nil, 400, api.CodeInvalid},
		{"bad compare", `{"runtime":"python3","compare":"fuzzy"}`, nil, 400, api.CodeInvalid},
		{"negative pids", `{"runtime":"python3","limits":{"pids":-1}}`, nil, 400, api.CodeInvalid},
		{"not json", `{"runtime":`, nil, 400, api.CodeInvalid},
		{"overloaded", `{"runtime":"python3"}`, func() { fake.SetOverloaded(3 * time.Second) }, 429, api.CodeFnOverloaded},
		{"unavailable", `{"runtime":"cpp"}`, func() { fake.SetUnavailable("cpp", "no compiler") }, 503, api.CodeRuntimeUnavailable},
	} {
		if tc.setup != nil {
			tc.setup()
		}
		st, _, a := h.fnRun(tc.body)
		if st != tc.status || a.code(t) != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, st, a.body, tc.status, tc.code)
		}
		if tc.status == 429 && a.header.Get("Retry-After") != "3" {
			t.Errorf("%s: Retry-After %q, want 3", tc.name, a.header.Get("Retry-After"))
		}
	}

	// Metrics count calls by runtime and outcome; unknown runtimes stay out
	// of the labels.
	resp, b := h.do("GET", "/metrics", "", nil)
	m := string(b)
	for _, want := range []string{
		`warren_fn_calls_total{runtime="python3",status="OK"} 1`,
		`warren_fn_calls_total{runtime="cpp",status="CompileError"} 1`,
		`warren_fn_calls_total{runtime="python3",status="fn_overloaded"} 1`,
		`warren_fn_calls_total{runtime="other",status="runtime_not_found"} 1`,
		`warren_fn_call_duration_seconds_count{runtime="python3"} 2`,
	} {
		if resp.StatusCode != 200 || !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(m, "cobol") {
		t.Error("metrics carry an unknown runtime's name")
	}
}

func TestFnBatchSingleNode(t *testing.T) {
	h, _ := newFnHarness(t, "python3")
	var calls []string
	for i := range 40 {
		calls = append(calls, fmt.Sprintf(`{"runtime":"python3","stdin":"%d"}`, i))
	}
	calls = append(calls, `{"runtime":"cobol"}`, `{"runtime":"python3","source":"SANDBOX_ERROR"}`, `{"runtime":"python3","compare":"x"}`)
	resp, b := h.json("POST", "/v1/fn/batch", `{"calls":[`+strings.Join(calls, ",")+`]}`)
	var out api.FnBatchResult
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || len(out.Results) != 43 {
		t.Fatalf("batch: %d %s", resp.StatusCode, b)
	}
	for i := range 40 {
		if r := out.Results[i].Result; r == nil || r.Cases[0].Stdout != fmt.Sprint(i) {
			t.Errorf("item %d: %+v", i, out.Results[i])
		}
	}
	if e := out.Results[40].Error; e == nil || e.Code != api.CodeRuntimeNotFound {
		t.Errorf("unknown runtime item: %+v", out.Results[40])
	}
	if r := out.Results[41].Result; r == nil || r.Status != api.FnSandboxError {
		t.Errorf("sandbox error item: %+v", out.Results[41])
	}
	if e := out.Results[42].Error; e == nil || e.Code != api.CodeInvalid {
		t.Errorf("invalid item: %+v", out.Results[42])
	}

	for _, body := range []string{`{"calls":[]}`, `{}`, `{"calls":[{"runtime":"python3","x":1}]}`,
		`{"calls":[` + strings.Repeat(`{"runtime":"python3"},`, nodeapi.MaxFnBatch) + `{"runtime":"python3"}]}`} {
		resp, b := h.json("POST", "/v1/fn/batch", body)
		if resp.StatusCode != 400 {
			t.Errorf("batch %.60s: %d %s, want 400", body, resp.StatusCode, b)
		}
	}
}

// FuzzFnRequests sends arbitrary bodies to the FnCall endpoints: the
// answer is a 200 or a classified 4xx, never a 5xx.
func FuzzFnRequests(f *testing.F) {
	for _, s := range []string{
		`{"runtime":"python3","source":"x","stdin":"aGk=","stdin_encoding":"base64"}`,
		`{"runtime":"cpp","cases":[{"stdin":"1","expected":"1"},{"expected":"/w==","expected_encoding":"base64"}],"stop_on_fail":true}`,
		`{"runtime":"python3","limits":{"cpu_time":"2s","wall_time":3,"memory":"256Mi","pids":8,"output":"1Ki","file_size":1e3}}`,
		`{"runtime":"python3","files":[{"path":"a","content":"b","mode":493}],"args":["-x"],"env":{"K":"V"},"compare":"exact"}`,
		`{"calls":[{"runtime":"python3"},{"runtime":"nope"}]}`,
		`{"runtime":1e400}`, `{"limits":{"memory":"9999999Ti"}}`, `null`, `"`, `{}`, `{"calls":null}`,
	} {
		f.Add(0, s)
		f.Add(1, s)
	}
	h, _ := newFnHarness(f, "python3", "cpp")
	f.Fuzz(func(t *testing.T, which int, body string) {
		h.t = t
		path := "/v1/fn/run"
		if which%2 == 1 {
			path = "/v1/fn/batch"
		}
		resp, b := h.json("POST", path, body)
		if resp.StatusCode >= 500 {
			t.Fatalf("POST %s %q: %d %s", path, body, resp.StatusCode, b)
		}
	})
}

// Without a runner (and no Router), no runtime exists.
func TestFnNotServed(t *testing.T) {
	h := newHarness(t, nil)
	if rts := h.fnRuntimes(); len(rts) != 0 {
		t.Errorf("runtimes: %+v", rts)
	}
	st, _, a := h.fnRun(`{"runtime":"python3"}`)
	if st != 404 || a.code(t) != api.CodeRuntimeNotFound {
		t.Errorf("run: %d %s", st, a.body)
	}
}

func TestFnRoles(t *testing.T) {
	st := store.Memory()
	m := iam.New(st, iam.Options{})
	ctx := context.Background()
	if _, err := m.EnsureAdmin(ctx, adminSecret); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: nodetest.New(t, nil), Fn: fncalltest.New("python3"), Images: imagetest.Busybox,
		Tokens: m, IAM: m, Log: quietLog,
	}))
	t.Cleanup(srv.Close)
	h := &iamHarness{t: t, url: srv.URL, iam: m}
	h.project("team", iam.Quota{})
	run := `{"runtime":"python3","stdin":"x"}`
	batch := `{"calls":[` + run + `]}`
	for _, tc := range []struct {
		role                iam.Role
		run, batch, listing int
	}{
		{iam.RoleReader, 403, 403, 200},
		{iam.RoleRunner, 200, 200, 200},
		{iam.RoleBuilder, 200, 200, 200},
		{iam.RoleAdmin, 200, 200, 200},
		{iam.RoleNode, 403, 403, 403},
	} {
		project := "team"
		if tc.role == iam.RoleNode {
			project = ""
		}
		secret := h.token(project, tc.role)
		if a := h.do(secret, "POST", "/v1/fn/run", run); a.status != tc.run {
			t.Errorf("%s: run %d %s, want %d", tc.role, a.status, a.body, tc.run)
		}
		if a := h.do(secret, "POST", "/v1/fn/batch", batch); a.status != tc.batch {
			t.Errorf("%s: batch %d %s, want %d", tc.role, a.status, a.body, tc.batch)
		}
		if a := h.do(secret, "GET", "/v1/fn/runtimes", ""); a.status != tc.listing {
			t.Errorf("%s: runtimes %d %s, want %d", tc.role, a.status, a.body, tc.listing)
		}
	}
	if a := h.do("wrong", "POST", "/v1/fn/run", run); a.status != 401 {
		t.Errorf("bad token: %d", a.status)
	}
}

// fnNode is one node of a FnCall test fleet: an agent whose node API
// serves a fake runner, counting the calls that reach it.
type fnNode struct {
	fake  *fncalltest.Fake
	srv   *httptest.Server
	calls atomic.Int32
	hang  atomic.Bool // answer no status poll, as behind a cut link
}

type fnFleet struct {
	*harness
	nodes   map[string]*fnNode
	watcher *fleet.Watcher
}

// newFnFleet starts a node per entry of runtimes (id -> runtimes it
// declares), registered in a memory store and polled every 50 ms by the
// fleet watcher of a Router-backed apiserver.
func newFnFleet(t *testing.T, runtimes map[string][]string) *fnFleet {
	t.Helper()
	st := store.Memory().(store.Watcher)
	f := &fnFleet{nodes: map[string]*fnNode{}}
	for id, rts := range runtimes {
		n := &fnNode{fake: fncalltest.New(rts...)}
		agent := nodetest.New(t, func(c *node.Config) { c.ID = id; c.Images = nil })
		h := nodeapi.NewServer(agent, nodeapi.Secret("secret-"+id), quietLog).ServeFn(n.fake)
		n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/status" && n.hang.Load() {
				<-r.Context().Done()
				return
			}
			if r.URL.Path == "/v1/fn/run" {
				n.calls.Add(1)
			}
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(n.srv.Close)
		reg, err := fleet.NewRegistrar(fleet.RegistrarConfig{
			Store: st, TTL: time.Second, Log: quietLog, Secret: "secret-" + id,
			Node: api.Node{ID: id, Address: n.srv.Listener.Addr().String(), Backends: agent.Status().Backends},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { reg.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		f.nodes[id] = n
	}
	clients := nodeapi.NewClients(nil)
	w, err := fleet.New(fleet.Config{Store: st, Source: clients, PollInterval: 50 * time.Millisecond, MaxMissed: 2, Log: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go w.Run(ctx)
	f.watcher = w
	waitUntil(t, "every node polled", 5*time.Second, func() bool {
		n := 0
		for _, v := range w.Snapshot() {
			if v.Healthy {
				n++
			}
		}
		return n == len(runtimes)
	})
	r, err := apiserver.NewRouter(apiserver.RouterConfig{Fleet: w, Clients: clients, Refresh: 100 * time.Millisecond, Log: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	go r.Run(ctx)
	srv := httptest.NewServer(apiserver.New(apiserver.Config{Cluster: r, Tokens: apiserver.StaticToken(token), Log: quietLog}))
	t.Cleanup(srv.Close)
	f.harness = &harness{t: t, url: srv.URL}
	return f
}

// waitPool waits until the fleet view shows runtime rt on node id with
// ready containers.
func (f *fnFleet) waitPool(id, rt string, ready int) {
	f.t.Helper()
	waitUntil(f.t.(*testing.T), fmt.Sprintf("%s's %s pool polled", id, rt), 5*time.Second, func() bool {
		v, ok := f.watcher.Node(id)
		if !ok {
			return false
		}
		for _, r := range v.FnRuntimes {
			if r.Name == rt && r.Ready == ready {
				return true
			}
		}
		return false
	})
}

func TestFnRouter(t *testing.T) {
	f := newFnFleet(t, map[string][]string{"a1": {"python3", "cpp"}, "b2": {"python3"}, "c3": {"sh"}})

	// A runtime only one node declares goes there.
	for range 5 {
		for rt, want := range map[string]string{"cpp": "a1", "sh": "c3"} {
			st, res, a := f.fnRun(`{"runtime":"` + rt + `","stdin":"x"}`)
			if st != 200 || res.Node != want || res.Cases[0].Stdout != "x" {
				t.Fatalf("%s: %d %s, want a result from %s", rt, st, a.body, want)
			}
		}
	}
	if n := f.nodes["b2"].calls.Load(); n != 0 {
		t.Errorf("b2 got %d calls of runtimes it lacks", n)
	}
	// Unknown everywhere: 404.
	if st, _, a := f.fnRun(`{"runtime":"cobol"}`); st != 404 || a.code(t) != api.CodeRuntimeNotFound {
		t.Errorf("unknown runtime: %d %s", st, a.body)
	}
	if st, _, a := f.fnRun(`{"runtime":"python3","limits":{"memory":"-1"}}`); st != 400 {
		t.Errorf("bad body: %d %s", st, a.body)
	}

	// Runtimes merge over the nodes: pools summed.
	rts := f.fnRuntimes()
	if len(rts) != 3 || rts[0].Name != "cpp" || rts[1].Name != "python3" || rts[1].Ready != 4 || rts[1].PoolMax != 8 ||
		!rts[1].Available || rts[2].Name != "sh" {
		t.Errorf("merged runtimes: %+v", rts)
	}
	// And GET /v1/nodes shows each node's.
	resp, b := f.json("GET", "/v1/nodes", "")
	var nodes api.NodeList
	json.Unmarshal(b, &nodes)
	for _, n := range nodes.Nodes {
		if len(n.FnRuntimes) == 0 {
			t.Errorf("node %s lists no runtimes: %d %s", n.ID, resp.StatusCode, b)
		}
	}

	// Power of two choices by busy - ready: a1's pool is drained and busy,
	// b2's is idle, so python3 goes to b2.
	f.nodes["a1"].fake.SetPool("python3", 0, 6)
	f.nodes["b2"].fake.SetPool("python3", 3, 0)
	f.waitPool("a1", "python3", 0)
	f.waitPool("b2", "python3", 3)
	before := f.nodes["a1"].calls.Load()
	for range 10 {
		if st, res, a := f.fnRun(`{"runtime":"python3"}`); st != 200 || res.Node != "b2" {
			t.Fatalf("python3 on a loaded fleet: %d %s, want b2", st, a.body)
		}
	}
	if n := f.nodes["a1"].calls.Load() - before; n != 0 {
		t.Errorf("the busy node got %d calls", n)
	}
}

func TestFnRouterRetry(t *testing.T) {
	f := newFnFleet(t, map[string][]string{"a1": {"python3"}, "b2": {"python3"}, "c3": {"sh"}})
	a1, b2 := f.nodes["a1"], f.nodes["b2"]
	// Both polled, with equal pools, before the calls: a node not polled
	// yet is no candidate (a loaded machine polls late).
	for _, id := range []string{"a1", "b2"} {
		f.nodes[id].fake.SetPool("python3", 2, 0)
		f.waitPool(id, "python3", 2)
	}

	// a1 refuses: every call still runs, on b2.
	a1.fake.SetOverloaded(2 * time.Second)
	for range 10 {
		if st, res, a := f.fnRun(`{"runtime":"python3","stdin":"x"}`); st != 200 || res.Node != "b2" {
			t.Fatalf("with a1 overloaded: %d %s", st, a.body)
		}
	}
	// a1 cools down after it refused: it is asked once, not every time.
	if n := a1.calls.Load(); n < 1 || n > 2 {
		t.Errorf("a1 was asked %d times in 10 calls", n)
	}

	// Both refuse: 429 fn_overloaded with the smaller Retry-After.
	b2.fake.SetOverloaded(3 * time.Second)
	st, _, a := f.fnRun(`{"runtime":"python3"}`)
	if st != 429 || a.code(t) != api.CodeFnOverloaded || a.header.Get("Retry-After") != "2" {
		t.Errorf("all overloaded: %d %s (Retry-After %q)", st, a.body, a.header.Get("Retry-After"))
	}
	// A batch answers 200 with an error per refused call.
	resp, b := f.json("POST", "/v1/fn/batch", `{"calls":[{"runtime":"python3"},{"runtime":"sh","stdin":"ok"}]}`)
	var out api.FnBatchResult
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || len(out.Results) != 2 ||
		out.Results[0].Error == nil || out.Results[0].Error.Code != api.CodeFnOverloaded ||
		out.Results[1].Result == nil || out.Results[1].Result.Node != "c3" {
		t.Errorf("batch with python3 overloaded: %d %s", resp.StatusCode, b)
	}

	// A runtime declared but available nowhere: 503 runtime_unavailable.
	f.nodes["c3"].fake.SetUnavailable("sh", "environment fn-sh@1 missing")
	waitUntil(t, "sh unavailable in the view", 5*time.Second, func() bool {
		rts := f.fnRuntimes()
		return len(rts) == 2 && rts[1].Name == "sh" && !rts[1].Available
	})
	st, _, a = f.fnRun(`{"runtime":"sh"}`)
	if st != 503 || a.code(t) != api.CodeRuntimeUnavailable || !strings.Contains(string(a.body), "fn-sh@1 missing") {
		t.Errorf("unavailable runtime: %d %s", st, a.body)
	}
	if rts := f.fnRuntimes(); !strings.Contains(rts[1].Reason, "fn-sh@1 missing") {
		t.Errorf("merged reason: %+v", rts[1])
	}
}

// A node lost in the middle of a call: the call ends with SandboxError,
// as soon as the watcher declares the node unreachable.
func TestFnRouterNodeLost(t *testing.T) {
	f := newFnFleet(t, map[string][]string{"a1": {"cpp"}, "b2": {"sh"}})
	a1 := f.nodes["a1"]
	t.Cleanup(a1.fake.Release)
	var wg sync.WaitGroup
	var st int
	var res api.FnResult
	wg.Go(func() { st, res, _ = f.fnRun(`{"runtime":"cpp","source":"BLOCK","cases":[{},{}]}`) })
	waitUntil(t, "the call running", 5*time.Second, func() bool { return a1.fake.Busy("cpp") == 1 })
	a1.hang.Store(true)
	wg.Wait()
	if st != 200 || res.Status != api.FnSandboxError || res.Node != "a1" || len(res.Cases) != 2 ||
		res.Cases[0].Status != api.FnSandboxError || !strings.Contains(res.Cases[0].Message, "unreachable") {
		t.Errorf("call on a lost node: %d %+v", st, res)
	}
	// While a1 is unreachable, cpp is unavailable, not unknown.
	if st, _, a := f.fnRun(`{"runtime":"cpp"}`); st != 503 || a.code(t) != api.CodeRuntimeUnavailable {
		t.Errorf("cpp with a1 lost: %d %s", st, a.body)
	}
}

// FnCalls count against their project's fn_calls_per_sec: a call over it
// is refused with 429 rate_limited and Retry-After before any runs, a batch
// takes its calls all at once, a sub-project's own rate is its own, and a
// call may name a project only within the caller's scope.
func TestFnRateLimit(t *testing.T) {
	st := store.Memory()
	m := iam.New(st, iam.Options{})
	if _, err := m.EnsureAdmin(context.Background(), adminSecret); err != nil {
		t.Fatal(err)
	}
	fake := fncalltest.New("python3")
	srv := httptest.NewServer(apiserver.New(apiserver.Config{
		Node: nodetest.New(t, nil), Fn: fake, Images: imagetest.Busybox,
		Tokens: m, IAM: m, Log: quietLog,
	}))
	t.Cleanup(srv.Close)
	h := &iamHarness{t: t, url: srv.URL, iam: m}
	h.project("team", iam.Quota{FnCallsPerSec: 0.01, FnCallsBurst: 3})
	h.project("team/fast", iam.Quota{FnCallsPerSec: 0.005, FnCallsBurst: 5})
	h.project("other", iam.Quota{})
	tok := h.token("team", iam.RoleRunner)
	run := `{"runtime":"python3","stdin":"x"}`
	limited := func(what string, a answer) {
		t.Helper()
		if a.status != http.StatusTooManyRequests || a.code(t) != api.CodeRateLimited || a.header.Get("Retry-After") == "" {
			t.Errorf("%s: %d %s (Retry-After %q), want 429 rate_limited", what, a.status, a.body, a.header.Get("Retry-After"))
		}
	}

	// team's own budget is its 0.01/s less the 0.005/s it delegated:
	// the burst of 3 passes, the fourth call does not.
	for i := range 3 {
		if a := h.do(tok, "POST", "/v1/fn/run", run); a.status != 200 {
			t.Fatalf("call %d: %d %s", i, a.status, a.body)
		}
	}
	before := len(fake.Calls())
	limited("fourth call", h.do(tok, "POST", "/v1/fn/run", run))
	limited("batch over the rate", h.do(tok, "POST", "/v1/fn/batch", `{"calls":[`+run+`,`+run+`]}`))
	if n := len(fake.Calls()); n != before {
		t.Errorf("refused calls ran: %d calls, want %d", n, before)
	}
	if calls := fake.Calls(); len(calls) == 0 || calls[0].Project != "team" {
		t.Errorf("a call without a project counts against the caller's: %+v", calls)
	}

	// The sub-project's rate is its own, and a batch of 5 fits its burst
	// at once while a second one does not.
	fast := `{"runtime":"python3","stdin":"x","project":"team/fast"}`
	batch := `{"calls":[` + strings.Repeat(fast+",", 4) + fast + `]}`
	if a := h.do(tok, "POST", "/v1/fn/batch", batch); a.status != 200 {
		t.Fatalf("batch in team/fast: %d %s", a.status, a.body)
	}
	limited("second batch in team/fast", h.do(tok, "POST", "/v1/fn/batch", batch))

	// Outside the token's scope: 403, nothing taken.
	if a := h.do(tok, "POST", "/v1/fn/run", `{"runtime":"python3","project":"other"}`); a.status != http.StatusForbidden {
		t.Errorf("call in another project: %d %s, want 403", a.status, a.body)
	}
	if a := h.do(tok, "POST", "/v1/fn/run", `{"runtime":"python3","project":"../x"}`); a.status != http.StatusBadRequest {
		t.Errorf("bad project path: %d %s, want 400", a.status, a.body)
	}
	// A project without a rate of its own or above it is not limited.
	free := h.token("other", iam.RoleRunner)
	for i := range 10 {
		if a := h.do(free, "POST", "/v1/fn/run", run); a.status != 200 {
			t.Fatalf("unlimited call %d: %d %s", i, a.status, a.body)
		}
	}
}
