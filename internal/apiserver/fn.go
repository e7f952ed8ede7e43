package apiserver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fleet"
	"github.com/warrenhq/warren/internal/fncall"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node/nodeapi"
)

// FnCall at the edge:
//
//	POST /v1/fn/run       api.FnRunRequest -> api.FnResult
//	POST /v1/fn/batch     api.FnBatchRequest -> api.FnBatchResult
//	GET  /v1/fn/runtimes  api.FnRuntimeList
//
// A call is stateless, so it is routed by its runtime alone: on SingleNode
// to Config.Fn, the in-process runner; on a Router to a healthy node that
// declares the runtime available (Router.RunFn). A batch is split into
// calls routed one by one, so that one batch spreads over the fleet and
// each call gets its own retries; its answer is 200 with a result or an
// error per call.

// FnCluster is what a Cluster may also do: run FnCalls on its nodes.
// Router does; the Server runs them on Config.Fn for any other Cluster.
type FnCluster interface {
	// RunFn runs one call on a node that has its runtime. Errors:
	// ErrInvalid; ErrNotFound with code runtime_not_found when no node
	// declares the runtime; ErrUnavailable (code runtime_unavailable)
	// when no healthy node has it available; ErrExhausted with code
	// fn_overloaded and a Retry-After when every node tried refused.
	RunFn(ctx context.Context, req api.FnRunRequest) (api.FnResult, error)
	// FnRuntimes lists the runtimes of every node, merged by name.
	FnRuntimes(ctx context.Context) ([]api.FnRuntime, error)
}

var _ FnCluster = (*Router)(nil)

const (
	// fnBatchParallel bounds the calls of one batch in flight at once
	// across the fleet.
	fnBatchParallel = 64
	// fnAttempts is how many nodes one call tries before it gives up.
	fnAttempts = 3
	// fnCooldown caps how long a node that refused a call (429) is
	// skipped while others have room.
	fnCooldown = time.Second
)

func (s *Server) fnRoutes(auth func(handler) http.Handler) {
	f := &fnAPI{fc: s.fnCluster(), m: newFnMetrics(s.cfg.Registry), iam: s.cfg.IAM}
	s.mux.Handle("POST /v1/fn/run", auth(f.run))
	s.mux.Handle("POST /v1/fn/batch", auth(f.batch))
	s.mux.Handle("GET /v1/fn/runtimes", auth(f.runtimes))
}

// fnCluster is where the server's FnCalls go: the Cluster if it routes
// them, else the in-process runner, else nowhere (every runtime unknown).
func (s *Server) fnCluster() FnCluster {
	if fc, ok := s.cluster.(FnCluster); ok {
		return fc
	}
	if s.cfg.Fn != nil {
		l := localFn{r: s.cfg.Fn}
		if s.cfg.Node != nil {
			l.node = s.cfg.Node.ID()
		}
		return l
	}
	return localFn{}
}

// localFn is the FnCluster of one in-process runner; with none, no
// runtime exists.
type localFn struct {
	r    fncall.Runner
	node string
}

func (l localFn) RunFn(ctx context.Context, req api.FnRunRequest) (api.FnResult, error) {
	if l.r == nil {
		return api.FnResult{}, errRuntimeNotFound(req.Runtime)
	}
	res, err := l.r.Run(ctx, req)
	if err == nil && res.Node == "" {
		res.Node = l.node
	}
	return res, err
}

func (l localFn) FnRuntimes(ctx context.Context) ([]api.FnRuntime, error) {
	if l.r == nil {
		return nil, nil
	}
	return l.r.Runtimes(ctx), nil
}

func errRuntimeNotFound(name string) error {
	return errdefs.New(errdefs.ErrNotFound, api.CodeRuntimeNotFound, "no node declares runtime %q (GET /v1/fn/runtimes lists them)", name)
}

type fnAPI struct {
	fc  FnCluster
	m   *fnMetrics
	iam *iam.IAM // nil: no projects, no rate limits
}

func (f *fnAPI) run(w http.ResponseWriter, r *http.Request) error {
	var req api.FnRunRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := api.CheckFn(&req); err != nil {
		return errdefs.Request(err)
	}
	if err := f.admit(r.Context(), []*api.FnRunRequest{&req}); err != nil {
		f.m.observe(req.Runtime, api.FnResult{}, err, 0)
		return err
	}
	res, err := f.call(r.Context(), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (f *fnAPI) batch(w http.ResponseWriter, r *http.Request) error {
	var req api.FnBatchRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := api.CheckFnBatch(&req); err != nil {
		return errdefs.Request(err)
	}
	calls := make([]*api.FnRunRequest, len(req.Calls))
	for i := range req.Calls {
		calls[i] = &req.Calls[i]
	}
	if err := f.admit(r.Context(), calls); err != nil {
		return err
	}
	items := nodeapi.RunFnCalls(r.Context(), req.Calls, fnBatchParallel, f.call)
	return writeJSON(w, http.StatusOK, api.FnBatchResult{Results: items})
}

func (f *fnAPI) runtimes(w http.ResponseWriter, r *http.Request) error {
	list, err := f.fc.FnRuntimes(r.Context())
	if err != nil {
		return err
	}
	if list == nil {
		list = []api.FnRuntime{}
	}
	return writeJSON(w, http.StatusOK, api.FnRuntimeList{Runtimes: list})
}

// admit authorizes each call in its project (default: the caller's) and
// takes the calls from their projects' FnCall rates, a batch's all at once:
// over a rate, nothing runs and the answer is 429 rate_limited with
// Retry-After. (A batch spanning projects may have used up some of its
// first projects' budgets when a later one refuses.)
func (f *fnAPI) admit(ctx context.Context, calls []*api.FnRunRequest) error {
	p := principal(ctx)
	count := map[string]int{}
	var projects []string
	for _, c := range calls {
		project, err := projectFor(p, c.Project, iam.ActionSandboxExec)
		if err != nil {
			return err
		}
		c.Project = project
		if count[project] == 0 {
			projects = append(projects, project)
		}
		count[project]++
	}
	if f.iam == nil {
		return nil
	}
	for _, project := range projects {
		if err := f.iam.AllowFnCalls(ctx, project, count[project]); err != nil {
			return err
		}
	}
	return nil
}

// call checks and runs one call, and counts it.
func (f *fnAPI) call(ctx context.Context, req api.FnRunRequest) (api.FnResult, error) {
	start := time.Now()
	err := checkFn(req)
	var res api.FnResult
	if err == nil {
		res, err = f.fc.RunFn(ctx, req)
	}
	f.m.observe(req.Runtime, res, err, time.Since(start))
	return res, err
}

// checkFn refuses at the edge what no node would take; the node checks
// the rest (limits against its maximums, paths, encodings).
func checkFn(req api.FnRunRequest) error {
	switch {
	case req.Runtime == "":
		return errdefs.Invalid("runtime is required (GET /v1/fn/runtimes lists them)")
	case req.Compare != "" && req.Compare != "lines" && req.Compare != "exact":
		return errdefs.Invalid("compare %q: want lines or exact", req.Compare)
	case req.Limits.PIDs < 0:
		return errdefs.Invalid("limits.pids %d: negative", req.Limits.PIDs)
	}
	return nil
}

// fnMetrics counts FnCalls by runtime and outcome.
type fnMetrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newFnMetrics(reg *prometheus.Registry) *fnMetrics {
	m := &fnMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_fn_calls_total",
			Help: "FnCalls by runtime and outcome: the result's status, or the error code of a refused call.",
		}, []string{"runtime", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warren_fn_call_duration_seconds",
			Help:    "Latency of FnCalls that got a result, routing and retries included.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"runtime"}),
	}
	reg.MustRegister(m.calls, m.duration)
	return m
}

func (m *fnMetrics) observe(runtime string, res api.FnResult, err error, d time.Duration) {
	if err == nil {
		m.calls.WithLabelValues(runtime, res.Status).Inc()
		m.duration.WithLabelValues(runtime).Observe(d.Seconds())
		return
	}
	_, e := apiError(err)
	if e.Code != api.CodeFnOverloaded && e.Code != api.CodeRuntimeUnavailable {
		// The runtime may be anything a caller typed: keep it out of the
		// label set unless a node has it.
		runtime = "other"
	}
	m.calls.WithLabelValues(runtime, e.Code).Inc()
}

// fnLoad is what a Router knows of FnCalls beyond the fleet view, which
// is a poll old: the calls it has in flight on each node, and the nodes
// that refused one lately.
type fnLoad struct {
	mu       sync.Mutex
	inflight map[string]int
	cool     map[string]time.Time
}

func (l *fnLoad) start(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight == nil {
		l.inflight = map[string]int{}
	}
	l.inflight[id]++
}

func (l *fnLoad) done(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight[id]--; l.inflight[id] <= 0 {
		delete(l.inflight, id)
	}
}

func (l *fnLoad) refused(id string, d time.Duration) {
	if d <= 0 || d > fnCooldown {
		d = fnCooldown
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cool == nil {
		l.cool = map[string]time.Time{}
	}
	l.cool[id] = time.Now().Add(d)
}

func (l *fnLoad) state(id string, now time.Time) (inflight int, cooling bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	until, ok := l.cool[id]
	if ok && !now.Before(until) {
		delete(l.cool, id)
		ok = false
	}
	return l.inflight[id], ok
}

// RunFn implements FnCluster. It picks a node by power of two choices
// among the healthy nodes that declare the runtime available, scoring each
// by its pool as last polled (busy - ready) plus the calls this apiserver
// has running there since. A node that refuses (429 fn_overloaded), was
// not reached, or no longer has the runtime, is left for another, up to
// fnAttempts nodes; then a 429 (with the smallest Retry-After heard) says
// the runtime is overloaded. A node lost in the middle of a call gives a
// result whose cases say SandboxError: the call may have run, and the
// fault is the platform's.
func (r *Router) RunFn(ctx context.Context, req api.FnRunRequest) (api.FnResult, error) {
	tried := map[string]bool{}
	var last, busy error
	for len(tried) < fnAttempts {
		id, err := r.pickFn(req.Runtime, tried)
		if err != nil {
			if last == nil {
				return api.FnResult{}, err
			}
			break // no node left to try
		}
		tried[id] = true
		res, err := r.runFnOn(ctx, id, req)
		if err == nil || ctx.Err() != nil || !fnRetryable(err) {
			return res, err
		}
		r.log.Debug("node refused an FnCall", "node", id, "runtime", req.Runtime, "err", err)
		if errors.Is(err, errdefs.ErrExhausted) {
			r.fn.refused(id, errdefs.RetryAfter(err))
			if busy == nil || errdefs.RetryAfter(err) < errdefs.RetryAfter(busy) {
				busy = err
			}
		}
		last = err
	}
	if busy == nil {
		return api.FnResult{}, last
	}
	ids := make([]string, 0, len(tried))
	for id := range tried {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return api.FnResult{}, &errdefs.Error{
		Kind: errdefs.ErrExhausted, Code: api.CodeFnOverloaded, RetryAfter: errdefs.RetryAfter(busy),
		Msg: fmt.Sprintf("runtime %s is overloaded: nodes %s refused the call (last: %v)", req.Runtime, strings.Join(ids, ", "), busy),
	}
}

// fnRetryable reports whether a node's answer means the call did not run
// there and another node may take it.
func fnRetryable(err error) bool {
	if errors.Is(err, errdefs.ErrExhausted) || nodeapi.NotSent(err) {
		return true
	}
	switch errdefs.Code(err) {
	case api.CodeRuntimeNotFound, api.CodeRuntimeUnavailable:
		return true // the view was stale: the node no longer has it
	}
	return false
}

// pickFn chooses a node for a call of runtime among those not tried.
func (r *Router) pickFn(runtime string, tried map[string]bool) (string, error) {
	type cand struct {
		id      string
		score   int
		cooling bool
	}
	var cands []cand
	declared, unpolled := false, false
	var why []string
	now := time.Now()
	for _, v := range r.cfg.Fleet.Snapshot() {
		if !v.Polled {
			unpolled = unpolled || !v.Unreachable // not answered yet, not given up on
			continue
		}
		i := slices.IndexFunc(v.FnRuntimes, func(rt api.FnRuntime) bool { return rt.Name == runtime })
		if i < 0 {
			continue
		}
		declared = true
		rt := v.FnRuntimes[i]
		switch {
		case !rt.Available:
			why = append(why, fmt.Sprintf("%s: %s", v.ID, orDefault(rt.Reason, "unavailable")))
		case !v.Healthy:
			why = append(why, fmt.Sprintf("%s: node not healthy", v.ID))
		case !tried[v.ID]:
			inflight, cooling := r.fn.state(v.ID, now)
			cands = append(cands, cand{id: v.ID, score: rt.Busy - rt.Ready + inflight, cooling: cooling})
		}
	}
	if len(cands) == 0 {
		switch {
		case len(tried) > 0:
			return "", errdefs.Unavailable("no other node has runtime %s", runtime)
		case !declared && unpolled:
			return "", &errdefs.Error{Kind: errdefs.ErrUnavailable, Code: api.CodeUnavailable, RetryAfter: time.Second,
				Msg: fmt.Sprintf("runtime %s: not every node has reported its runtimes yet", runtime)}
		case !declared:
			return "", errRuntimeNotFound(runtime)
		}
		return "", &errdefs.Error{Kind: errdefs.ErrUnavailable, Code: api.CodeRuntimeUnavailable, RetryAfter: 5 * time.Second,
			Msg: fmt.Sprintf("runtime %s is available on no healthy node (%s)", runtime, joinFew(why))}
	}
	// Nodes that refused lately only when every node did.
	if warm := slices.DeleteFunc(slices.Clone(cands), func(c cand) bool { return c.cooling }); len(warm) > 0 {
		cands = warm
	}
	if len(cands) == 1 {
		return cands[0].id, nil
	}
	i := rand.IntN(len(cands))
	j := rand.IntN(len(cands) - 1)
	if j >= i {
		j++
	}
	if cands[j].score < cands[i].score {
		i = j
	}
	return cands[i].id, nil
}

// joinFew joins the first few of a per-node list, which can be as long as
// the fleet.
func joinFew(list []string) string {
	const few = 3
	if len(list) > few {
		return fmt.Sprintf("%s; and %d more", strings.Join(list[:few], "; "), len(list)-few)
	}
	return strings.Join(list, "; ")
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// runFnOn runs a call on node id, ending it if the node turns lost.
func (r *Router) runFnOn(ctx context.Context, id string, req api.FnRunRequest) (api.FnResult, error) {
	c, err := r.client(id)
	if err != nil {
		return api.FnResult{}, err
	}
	r.fn.start(id)
	defer r.fn.done(id)
	var res api.FnResult
	n := &routed{Client: c, r: r}
	lost, err := n.call(ctx, func(ctx context.Context) error {
		var err error
		res, err = c.RunFn(ctx, req)
		return err
	})
	switch {
	case lost:
		return fnPlatformFault(req, id, fmt.Sprintf("node %s became unreachable during the call", id)), nil
	case err != nil && ctx.Err() == nil && !nodeapi.NotSent(err) && errdefs.Code(err) == api.CodeNodeUnreachable:
		// The call reached the node and its answer was lost.
		return fnPlatformFault(req, id, err.Error()), nil
	}
	return res, err
}

// fnPlatformFault is the result of a call the platform failed after it
// started: every case a SandboxError, which a trainer drops rather than
// scores.
func fnPlatformFault(req api.FnRunRequest, node, msg string) api.FnResult {
	res := api.FnResult{Runtime: req.Runtime, Status: api.FnSandboxError, Node: node,
		Cases: make([]api.FnCaseResult, max(len(req.Cases), 1))}
	for i := range res.Cases {
		res.Cases[i] = api.FnCaseResult{Status: api.FnSandboxError, ExitCode: -1, Message: msg}
	}
	return res
}

// FnRuntimes implements FnCluster from the fleet view (as of the last
// polls): per runtime, the pools of the healthy nodes summed, available
// if any healthy node has it available, and why not otherwise.
func (r *Router) FnRuntimes(context.Context) ([]api.FnRuntime, error) {
	return mergeFnRuntimes(r.cfg.Fleet.Snapshot()), nil
}

func mergeFnRuntimes(nodes []fleet.NodeView) []api.FnRuntime {
	merged := map[string]*api.FnRuntime{}
	why := map[string][]string{}
	for _, v := range nodes {
		if !v.Polled || v.Unreachable {
			continue
		}
		for _, rt := range v.FnRuntimes {
			m := merged[rt.Name]
			if m == nil {
				m = &api.FnRuntime{Name: rt.Name, Env: rt.Env, Source: rt.Source,
					Compile: slices.Clone(rt.Compile), Run: slices.Clone(rt.Run)}
				merged[rt.Name] = m
			}
			if !v.Healthy {
				why[rt.Name] = append(why[rt.Name], v.ID+": node not healthy")
				continue
			}
			if !rt.Available {
				why[rt.Name] = append(why[rt.Name], fmt.Sprintf("%s: %s", v.ID, orDefault(rt.Reason, "unavailable")))
				continue
			}
			if !m.Available {
				// Describe it as a node that can run it does.
				m.Env, m.Source, m.Compile, m.Run = rt.Env, rt.Source, slices.Clone(rt.Compile), slices.Clone(rt.Run)
			}
			m.Available = true
			m.Ready += rt.Ready
			m.Busy += rt.Busy
			m.PoolMin += rt.PoolMin
			m.PoolMax += rt.PoolMax
		}
	}
	out := make([]api.FnRuntime, 0, len(merged))
	for name, m := range merged {
		if !m.Available {
			m.Reason = joinFew(why[name])
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
