package iam

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
)

// admission holds this apiserver's in-flight reservations and rate-limit
// buckets. Nothing here is persisted: a restarted apiserver starts with no
// reservations, and the fleet view already counts what was created.
type admission struct {
	mu       sync.Mutex
	inflight map[string]vec // by path: reservations in that subtree
	pending  fifo           // uncommitted, expire after ReservationTimeout
	held     fifo           // committed, expire after CommitHold
	buckets  map[string]*bucket
}

func (a *admission) init() {
	a.inflight = map[string]vec{}
	a.buckets = map[string]*bucket{}
}

func (a *admission) reserved(path string) Resources {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fromVec(a.inflight[path])
}

// Reservation holds quota for sandboxes being created. Commit it when they
// were created, Release it when they were not; both are idempotent, and a
// reservation that gets neither is freed after ReservationTimeout.
type Reservation struct {
	i        *IAM
	project  string
	res      Resources
	paths    []string // the project and its ancestors, as reserved
	state    resState
	deadline time.Time
}

type resState int

const (
	resPending resState = iota
	resHeld
	resDone
)

// Project returns the project the reservation was made in.
func (r *Reservation) Project() string { return r.project }

// Resources returns what the reservation holds.
func (r *Reservation) Resources() Resources { return r.res }

// Commit records that the sandboxes were created. The reservation keeps
// counting for CommitHold, until the usage source has seen them.
func (r *Reservation) Commit() {
	a := &r.i.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	now := r.i.now()
	a.sweep(now) // a reservation already timed out holds nothing
	if r.state != resPending {
		return
	}
	if r.i.opts.CommitHold < 0 {
		a.drop(r)
		return
	}
	r.state = resHeld
	r.deadline = now.Add(r.i.opts.CommitHold)
	a.held.push(r)
}

// Release frees the reservation now: the sandboxes were not created (or
// the caller knows the usage source counts them already).
func (r *Reservation) Release() {
	a := &r.i.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	a.drop(r)
}

// drop subtracts r from the in-flight sums; a.mu is held.
func (a *admission) drop(r *Reservation) {
	if r.state == resDone {
		return
	}
	r.state = resDone
	v := r.res.vec()
	for _, p := range r.paths {
		s := a.inflight[p].sub(v)
		if s == (vec{}) {
			delete(a.inflight, p)
		} else {
			a.inflight[p] = s
		}
	}
}

// sweep frees reservations past their deadline; a.mu is held.
func (a *admission) sweep(now time.Time) {
	for _, q := range []*fifo{&a.pending, &a.held} {
		want := resPending
		if q == &a.held {
			want = resHeld
		}
		for {
			r := q.peek()
			if r == nil || now.Before(r.deadline) {
				break
			}
			q.pop()
			if r.state == want {
				a.drop(r)
			}
		}
	}
}

// Reserve admits req (the total of one create, or of a gang) into project,
// or refuses it. It checks project and each ancestor that sets a limit:
// with U(x) = the usage source's figure for x's subtree plus this
// apiserver's reservations there, and for each of x's nearest limited
// descendants L the part of L's limit L does not use yet (delegated but
// unused headroom, which x must keep for L), it admits only if
//
//	U(x) + req + Σ_L max(0, limit(L) - U(L)) <= limit(x)
//
// for every limited dimension, all under one lock. So no subtree's usage
// can pass its quota through this apiserver, and what a parent delegated
// stays available to the child. Errors: ErrExhausted (CodeQuotaExceeded,
// Retry-After QuotaRetryAfter), ErrInvalid (CodeRequestTooLarge for a
// request that exceeds a quota on its own), ErrNotFound (project).
//
// Cost: one usage-source call per project looked at (the path to the root
// and the limited children of each limited ancestor); no store access while
// the cached tree is fresh.
func (i *IAM) Reserve(ctx context.Context, project string, req Resources) (*Reservation, error) {
	project, err := CleanPath(project)
	if err != nil {
		return nil, err
	}
	if err := req.validate("request"); err != nil {
		return nil, err
	}
	t, err := i.treeWith(ctx, project)
	if err != nil {
		return nil, err
	}
	n := t.nodes[project]
	if n == nil {
		return nil, projectNotFound(project)
	}
	r := req.vec()
	var path []*tnode
	for x := n; x != nil; x = x.parent {
		path = append(path, x)
	}
	// A request that could not fit even in an idle subtree is refused for
	// good (400), not asked to retry: what x can ever give to project is its
	// limit minus what it delegated elsewhere.
	for _, x := range path {
		for d := range nRes {
			if x.lim[d] == 0 || r[d] == 0 {
				continue
			}
			most := x.lim[d]
			for _, l := range x.below[d] {
				if !InScope(l.path, project) {
					most -= l.lim[d]
				}
			}
			if r[d] > most {
				return nil, errdefs.New(errdefs.ErrInvalid, CodeRequestTooLarge,
					"request of %s %s exceeds what project %s can ever grant here (%s of its %s quota)",
					fmtDim(d, r[d]), dimNames[d], displayPath(x.path), fmtDim(d, max(most, 0)), fmtDim(d, x.lim[d]))
			}
		}
	}

	a := &i.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	now := i.now()
	a.sweep(now)
	used := map[string]vec{}
	u := func(x *tnode) vec {
		v, ok := used[x.path]
		if !ok {
			v = i.usage(x.path).vec().add(a.inflight[x.path])
			used[x.path] = v
		}
		return v
	}
	for _, x := range path {
		for d := range nRes {
			if x.lim[d] == 0 || r[d] == 0 { // a request that adds nothing here cannot overshoot
				continue
			}
			inUse := u(x)[d]
			need := inUse + r[d]
			var kept int64
			for _, l := range x.below[d] {
				ul := u(l)[d]
				if InScope(l.path, project) {
					ul += r[d]
				}
				if l.lim[d] > ul {
					kept += l.lim[d] - ul
				}
			}
			need += kept
			if need > x.lim[d] {
				msg := "%s quota of project %s is exhausted: %s in use or being created, %s requested, limit %s"
				args := []any{dimNames[d], displayPath(x.path), fmtDim(d, inUse), fmtDim(d, r[d]), fmtDim(d, x.lim[d])}
				if kept > 0 {
					msg += " (%s more delegated to sub-projects)"
					args = append(args, fmtDim(d, kept))
				}
				return nil, errdefs.Exhausted(CodeQuotaExceeded, i.opts.QuotaRetryAfter, msg, args...)
			}
		}
	}
	res := &Reservation{i: i, project: project, res: req, deadline: now.Add(i.opts.ReservationTimeout)}
	for _, x := range path {
		res.paths = append(res.paths, x.path)
		a.inflight[x.path] = a.inflight[x.path].add(r)
	}
	a.pending.push(res)
	return res, nil
}

// AllowCreates takes n creations (1, or a gang's size) from project's
// creates/s budget. The budget is a token bucket owned by the nearest
// project at or above project that sets CreatesPerSec; its rate is that
// project's CreatesPerSec minus what it delegated to sub-projects with rates
// of their own, so a delegated rate is the sub-project's alone. A gang
// larger than the bucket passes when the bucket is full and leaves it in
// debt. ErrExhausted (CodeRateLimited) with Retry-After computed from the
// bucket; ErrNotFound (project). Buckets live in this apiserver's memory:
// with R replicas the cluster-wide rate is up to R times the limit.
func (i *IAM) AllowCreates(ctx context.Context, project string, n int) error {
	return i.allow(ctx, project, n, dimRate)
}

// AllowFnCalls takes n FnCalls from project's FnCallsPerSec budget, the
// way AllowCreates does for creations.
func (i *IAM) AllowFnCalls(ctx context.Context, project string, n int) error {
	return i.allow(ctx, project, n, dimFnRate)
}

// allow takes n from the rate limit of dimension d (dimRate, dimFnRate).
func (i *IAM) allow(ctx context.Context, project string, n int, d int) error {
	project, err := CleanPath(project)
	if err != nil {
		return err
	}
	if n <= 0 {
		return errdefs.Invalid("allow %s: n = %d, want >= 1", dimNames[d], n)
	}
	t, err := i.treeWith(ctx, project)
	if err != nil {
		return err
	}
	x := t.nodes[project]
	if x == nil {
		return projectNotFound(project)
	}
	for x != nil && x.lim[d] == 0 {
		x = x.parent
	}
	if x == nil {
		return nil // no rate limit anywhere up the tree
	}
	rate := float64(x.lim[d]-x.delegated(d)) / 1000
	if rate <= 0 {
		return errdefs.Exhausted(CodeRateLimited, i.opts.QuotaRetryAfter,
			"project %s has delegated all of its %s to sub-projects", displayPath(x.path), rateText(d, x.lim[d]))
	}
	burst := float64(x.rec.Quota.CreatesBurst)
	if d == dimFnRate {
		burst = float64(x.rec.Quota.FnCallsBurst)
	}
	if burst <= 0 {
		burst = math.Max(1, math.Ceil(rate))
	}

	a := &i.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	now := i.now()
	key := dimNames[d] + "\x00" + x.path + "\x00" + x.rec.UID
	b := a.buckets[key]
	if b == nil {
		if len(a.buckets) > 8*i.opts.MaxProjects {
			clear(a.buckets) // deleted projects' buckets; all restart full
		}
		b = &bucket{tokens: burst, last: now}
		a.buckets[key] = b
	}
	b.rate, b.burst = rate, burst
	wait := b.take(float64(n), now)
	if wait > 0 {
		return errdefs.Exhausted(CodeRateLimited, wait,
			"project %s is limited to %s (burst %g): retry in %v",
			displayPath(x.path), rateText(d, int64(rate*1000)), burst, wait.Round(time.Millisecond))
	}
	return nil
}

// rateText says a rate of dimension d given in thousandths per second:
// "2.5 fn calls/s".
func rateText(d int, milli int64) string {
	return strconv.FormatFloat(float64(milli)/1000, 'f', -1, 64) + " " + dimNames[d]
}

// bucket is a token bucket. tokens may go negative: a gang larger than
// burst borrows from the future.
type bucket struct {
	rate, burst float64
	tokens      float64
	last        time.Time
}

// take removes n tokens and returns 0, or returns how long until it could.
func (b *bucket) take(n float64, now time.Time) time.Duration {
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = math.Min(b.burst, b.tokens+el*b.rate)
		b.last = now
	}
	b.tokens = math.Min(b.tokens, b.burst) // the burst may have shrunk
	need := math.Min(n, b.burst)
	if b.tokens >= need {
		b.tokens -= n
		return 0
	}
	wait := time.Duration((need - b.tokens) / b.rate * float64(time.Second))
	return max(wait, time.Millisecond)
}

// fifo is a queue of reservations in deadline order (each queue's
// deadlines are now plus one fixed duration).
type fifo struct {
	q    []*Reservation
	head int
}

func (f *fifo) push(r *Reservation) { f.q = append(f.q, r) }

func (f *fifo) peek() *Reservation {
	if f.head == len(f.q) {
		return nil
	}
	return f.q[f.head]
}

func (f *fifo) pop() {
	f.q[f.head] = nil
	f.head++
	if f.head == len(f.q) {
		f.q, f.head = f.q[:0], 0
	} else if f.head > 1024 && f.head*2 > len(f.q) {
		f.q = append(f.q[:0], f.q[f.head:]...)
		f.head = 0
	}
}
