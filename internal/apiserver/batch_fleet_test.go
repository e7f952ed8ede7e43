package apiserver_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/store"
)

// gangFleet is a fleet of three nodes, a1, b2 and c3, behind an
// apiserver with IAM and quota, as `warren apiserver` wires it. Each node
// admits as many sandboxes as room says (and says so in its status, so
// placement knows). Project g has a quota of 6 sandboxes. Requests go as
// the root admin.
type gangFleet struct {
	*fleetHarness
	t   *testing.T
	api *iamHarness // the same server, called with IAM secrets
	iam *iam.IAM
}

func newGangFleet(t *testing.T, room map[string]int) *gangFleet {
	t.Helper()
	st := store.Memory()
	usage := apiserver.NewUsage()
	m := iam.New(st, iam.Options{Usage: usage, CommitHold: -1, QuotaRetryAfter: time.Second})
	if _, err := m.EnsureAdmin(context.Background(), adminSecret); err != nil {
		t.Fatal(err)
	}
	f := newFleetWith(t, fleetOptions{
		node: func(id string, c *node.Config) { c.Limits.Sandboxes = room[id] },
		// No node turns unreachable on a loaded machine: these tests are
		// about refusals, not lost nodes.
		fleet: func(c *fleet.Config) { c.PollTimeout, c.MaxMissed = 5*time.Second, 100 },
		server: func(c *apiserver.Config) {
			c.Tokens, c.IAM, c.Usage = m, m, usage
		},
	}, "a1", "b2", "c3")
	g := &gangFleet{fleetHarness: f, t: t, api: &iamHarness{t: t, url: f.url, iam: m}, iam: m}
	if _, err := m.CreateProject(context.Background(), iam.SystemPrincipal(), "g", iam.ProjectSpec{Quota: iam.Quota{Resources: iam.Resources{Sandboxes: 6}}}); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *gangFleet) batch(body string) answer {
	g.t.Helper()
	return g.api.do(adminSecret, "POST", "/v1/sandboxes:batch", body)
}

// onNodes counts the sandboxes each node holds, asking the nodes
// themselves.
func (g *gangFleet) onNodes() map[string]int {
	g.t.Helper()
	out := map[string]int{}
	for id, fn := range g.nodes {
		l, err := fn.agent.List(context.Background(), node.Filter{})
		if err != nil {
			g.t.Fatal(err)
		}
		out[id] = len(l)
	}
	return out
}

// holdsExactly checks that the nodes hold the members made, and nothing
// else, and says which node holds how many.
func (g *gangFleet) holdsExactly(made []api.Sandbox) map[string]int {
	g.t.Helper()
	want := map[string]bool{}
	for _, sb := range made {
		want[sb.ID] = true
	}
	per := map[string]int{}
	for id, fn := range g.nodes {
		l, err := fn.agent.List(context.Background(), node.Filter{})
		if err != nil {
			g.t.Fatal(err)
		}
		for _, sb := range l {
			if !want[sb.ID] {
				g.t.Errorf("node %s holds %s (gang index %s), which the answer does not report", id, sb.ID, sb.Labels[api.LabelGangIndex])
			}
			delete(want, sb.ID)
			per[id]++
		}
	}
	for id := range want {
		g.t.Errorf("member %s reported made is on no node", id)
	}
	return per
}

// checkPartial checks a best-effort answer for a gang of n: every index
// either made or failed with a code in codes, never both.
func checkPartial(t *testing.T, out api.BatchCreateResponse, n int, codes ...string) {
	t.Helper()
	made := map[string]bool{}
	for _, sb := range out.Sandboxes {
		made[sb.Labels[api.LabelGangIndex]] = true
	}
	if len(made) != len(out.Sandboxes) || len(out.Sandboxes)+len(out.Errors) != n {
		t.Errorf("gang of %d: %d made (indices %v), %d errors", n, len(out.Sandboxes), made, len(out.Errors))
	}
	for _, e := range out.Errors {
		if made[strconv.Itoa(e.Index)] || !slices.Contains(codes, e.Error.Code) {
			t.Errorf("member %d: error %+v (made too: %v), want one of %v", e.Index, e.Error, made[strconv.Itoa(e.Index)], codes)
		}
	}
}

// settled waits until the fleet view has polled every node since its
// last change: deleted sandboxes count in placement until then.
func (g *gangFleet) settled() {
	g.t.Helper()
	held := g.onNodes()
	waitUntil(g.t, "the fleet view to catch up with the nodes", 5*time.Second, func() bool {
		for id, n := range held {
			if v, ok := g.watcher.Node(id); !ok || v.Used().Sandboxes != n {
				return false
			}
		}
		return true
	})
}

func (g *gangFleet) quotaUsed() int64 {
	g.t.Helper()
	p, err := g.iam.GetProject(context.Background(), iam.SystemPrincipal(), "g")
	if err != nil {
		g.t.Fatal(err)
	}
	return p.Usage.Sandboxes
}

func gang(n int, allOrNone bool) string {
	return fmt.Sprintf(`{"count":%d,"all_or_none":%t,"template":{"image":"busybox","project":"g","resources":{"cpu":0.1,"memory":"16Mi"}}}`, n, allOrNone)
}

// TestBatchCreateSpreadsOverNodes: a gang larger than any node spreads
// over the nodes, each member routable by its id.
func TestBatchCreateSpreadsOverNodes(t *testing.T) {
	g := newGangFleet(t, map[string]int{"a1": 5, "b2": 5, "c3": 5})
	a := g.batch(gang(6, true))
	if a.status != http.StatusCreated {
		t.Fatalf("gang of 6 over three nodes of 5: %d %s", a.status, a.body)
	}
	var out api.BatchCreateResponse
	a.decode(t, &out)
	perNode := map[string]int{}
	for _, sb := range out.Sandboxes {
		perNode[sb.Node]++
		a := g.api.do(adminSecret, "GET", "/v1/sandboxes/"+sb.ID, "")
		var got api.Sandbox
		if a.status == http.StatusOK {
			a.decode(t, &got)
		}
		if got.Node != sb.Node || got.Labels[api.LabelGang] != out.Gang {
			t.Errorf("get member %s: %d %s", sb.ID, a.status, a.body)
		}
	}
	if len(out.Sandboxes) != 6 || len(perNode) < 2 {
		t.Fatalf("gang of 6: %d members on %v; want 6 over several nodes", len(out.Sandboxes), perNode)
	}
	if got := g.holdsExactly(out.Sandboxes); !maps.Equal(got, perNode) {
		t.Errorf("nodes hold %v, the answer says %v", got, perNode)
	}
	if used := g.quotaUsed(); used != 6 {
		t.Errorf("quota used by a gang of 6: %d", used)
	}
	// The node secrets the apiserver calls them with show nowhere.
	if a := g.api.do(adminSecret, "GET", "/v1/nodes", ""); a.status != http.StatusOK || strings.Contains(string(a.body), "secret-") {
		t.Errorf("GET /v1/nodes: %d %s", a.status, a.body)
	}
}

// TestBatchCreateAllOrNoneAcrossNodes: a1 and b2 admit 2 sandboxes each;
// c3 says it has room for 100 but refuses (429 node_full) after its first
// create, mid-gang, when a1 and b2 are full: the member it refuses can go
// nowhere. All-or-none undoes every member on every node and frees the
// gang's quota; best-effort keeps what was made and says which member
// failed and why.
func TestBatchCreateAllOrNoneAcrossNodes(t *testing.T) {
	g := newGangFleet(t, map[string]int{"a1": 2, "b2": 2, "c3": 100})
	g.nodes["c3"].refuseAfter.Store(1)
	a := g.batch(gang(6, true))
	if a.status != http.StatusTooManyRequests || a.code(t) != api.CodeNodeFull || a.header.Get("Retry-After") == "" {
		t.Fatalf("all-or-none gang with c3 refusing: %d %s (Retry-After %q), want 429 node_full", a.status, a.body, a.header.Get("Retry-After"))
	}
	if n := g.nodes["c3"].creates.Load(); n < 2 {
		t.Fatalf("c3 got %d creates: the test shows no refusal mid-gang", n)
	}
	if got := g.onNodes(); got["a1"]+got["b2"]+got["c3"] != 0 {
		t.Errorf("after a failed all-or-none gang, nodes hold %v; want nothing anywhere", got)
	}
	if a := g.api.do(adminSecret, "GET", "/v1/sandboxes", ""); a.status != http.StatusOK || strings.Contains(string(a.body), `"id"`) {
		t.Errorf("after a failed all-or-none gang, the list shows %d %s", a.status, a.body)
	}
	if used := g.quotaUsed(); used != 0 {
		t.Errorf("after a failed all-or-none gang, quota used: %d, want 0", used)
	}

	// Best effort, with the same refusal: what was made is kept and
	// reported (five, unless a poll that counts creates in flight made
	// a1 or b2 look full a moment), and the rest fail, each saying why.
	g.settled()
	g.nodes["c3"].creates.Store(0)
	a = g.batch(gang(6, false))
	if a.status != http.StatusOK {
		t.Fatalf("best-effort gang with c3 refusing: %d %s, want 200", a.status, a.body)
	}
	var out api.BatchCreateResponse
	a.decode(t, &out)
	checkPartial(t, out, 6, api.CodeNodeFull, api.CodeNoCapacity)
	if len(out.Errors) == 0 || len(out.Sandboxes) == 0 {
		t.Fatalf("best-effort gang: %d made, errors %+v; want some of each", len(out.Sandboxes), out.Errors)
	}
	if got := g.holdsExactly(out.Sandboxes); got["a1"] > 2 || got["b2"] > 2 || got["c3"] > 1 {
		t.Errorf("after a best-effort gang, nodes hold %v; want at most a1 2, b2 2, c3 1", got)
	}
	if used := g.quotaUsed(); used != int64(len(out.Sandboxes)) {
		t.Errorf("after a best-effort gang of %d made, quota used: %d", len(out.Sandboxes), used)
	}

	// The failed gang left nothing reserved: freeing the five makes room
	// for a whole gang of six again (quota 6).
	for _, sb := range out.Sandboxes {
		if a := g.api.do(adminSecret, "DELETE", "/v1/sandboxes/"+sb.ID, ""); a.status != http.StatusNoContent {
			t.Fatalf("delete %s: %d %s", sb.ID, a.status, a.body)
		}
	}
	g.nodes["c3"].refuseAfter.Store(0)
	g.settled()
	if a := g.batch(gang(6, true)); a.status != http.StatusCreated {
		t.Errorf("gang of 6 after the refusals: %d %s", a.status, a.body)
	}
}

// TestBatchCreateLostAnswers: c3 makes the sandboxes it is asked for but
// its answers are lost (the connection breaks after the request went
// out). Those members failed as far as the caller knows, so they must not
// exist: an all-or-none gang leaves nothing on any node, and a best-effort
// gang leaves exactly the members it reports.
func TestBatchCreateLostAnswers(t *testing.T) {
	g := newGangFleet(t, map[string]int{"a1": 2, "b2": 2, "c3": 2})
	g.nodes["c3"].loseAnswers.Store(true)
	a := g.batch(gang(6, true))
	if a.status != http.StatusServiceUnavailable {
		t.Fatalf("all-or-none gang with c3's answers lost: %d %s, want 503", a.status, a.body)
	}
	if n := g.nodes["c3"].creates.Load(); n == 0 {
		t.Fatalf("c3 got no create: the test shows nothing")
	}
	if got := g.onNodes(); got["a1"]+got["b2"]+got["c3"] != 0 {
		t.Errorf("after a failed all-or-none gang, nodes hold %v; want nothing anywhere", got)
	}
	if used := g.quotaUsed(); used != 0 {
		t.Errorf("after a failed all-or-none gang, quota used: %d, want 0", used)
	}

	g.settled()
	a = g.batch(gang(6, false))
	if a.status != http.StatusOK {
		t.Fatalf("best-effort gang with c3's answers lost: %d %s, want 200", a.status, a.body)
	}
	var out api.BatchCreateResponse
	a.decode(t, &out)
	checkPartial(t, out, 6, api.CodeNodeUnreachable, api.CodeNoCapacity)
	unanswered := 0
	for _, e := range out.Errors {
		if e.Error.Code == api.CodeNodeUnreachable {
			unanswered++
		}
	}
	if unanswered == 0 {
		t.Fatalf("best-effort gang: errors %+v; want c3's members among them", out.Errors)
	}
	if got := g.holdsExactly(out.Sandboxes); got["c3"] != 0 {
		t.Errorf("after a best-effort gang, nodes hold %v; want nothing on c3", got)
	}
	if used := g.quotaUsed(); used != int64(len(out.Sandboxes)) {
		t.Errorf("after a best-effort gang of %d made, quota used: %d", len(out.Sandboxes), used)
	}
}
