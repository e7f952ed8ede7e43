package iam_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/store"
)

func TestReserveBasics(t *testing.T) {
	ctx := context.Background()
	m, _ := newIAM(t, nil, iam.Options{QuotaRetryAfter: 3 * time.Second})
	mustCreate(t, m, "a", iam.Quota{Resources: iam.Resources{Sandboxes: 10, MilliCPU: 4000, Memory: 8 << 30}})

	var rs []*iam.Reservation
	for i := range 4 {
		r, err := m.Reserve(ctx, "a", iam.Resources{Sandboxes: 1, MilliCPU: iam.MilliCPU(1), Memory: 1 << 30})
		if err != nil {
			t.Fatalf("reservation %d: %v", i, err)
		}
		rs = append(rs, r)
	}
	_, err := m.Reserve(ctx, "a", iam.Resources{Sandboxes: 1, MilliCPU: 500})
	wantErr(t, "cpu exhausted", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
	if got := errdefs.RetryAfter(err); got != 3*time.Second {
		t.Fatalf("Retry-After: got %v, want 3s", got)
	}
	// Memory is not exhausted: a request that needs no CPU passes.
	if _, err := m.Reserve(ctx, "a", iam.Resources{Sandboxes: 1, Memory: 1 << 30}); err != nil {
		t.Fatalf("memory-only request: %v", err)
	}
	rs[0].Release()
	rs[0].Release() // idempotent
	if _, err := m.Reserve(ctx, "a", iam.Resources{Sandboxes: 1, MilliCPU: 1000}); err != nil {
		t.Fatalf("after a release: %v", err)
	}

	_, err = m.Reserve(ctx, "a", iam.Resources{Sandboxes: 11})
	wantErr(t, "larger than the quota", err, errdefs.ErrInvalid, iam.CodeRequestTooLarge)
	_, err = m.Reserve(ctx, "nope", sandboxes(1))
	wantErr(t, "unknown project", err, errdefs.ErrNotFound, iam.CodeProjectNotFound)
	_, err = m.Reserve(ctx, "a", sandboxes(-1))
	wantErr(t, "negative request", err, errdefs.ErrInvalid, "")
	// The root has no quota: anything goes.
	if _, err := m.Reserve(ctx, "", sandboxes(1e6)); err != nil {
		t.Fatalf("root: %v", err)
	}
}

func TestReserveCountsFleetUsage(t *testing.T) {
	ctx := context.Background()
	tally := iam.NewTally()
	m, _ := newIAM(t, nil, iam.Options{Usage: tally})
	mustCreate(t, m, "a", quota(10))
	mustCreate(t, m, "a/b", quota(0))
	tally.SetNode("n1", map[string]iam.Resources{"a/b": sandboxes(5), "other": sandboxes(100)})
	tally.SetNode("n2", map[string]iam.Resources{"a": sandboxes(3)})
	if got := tally.Usage("a"); got.Sandboxes != 8 {
		t.Fatalf("Tally.Usage(a): got %d, want 8", got.Sandboxes)
	}
	if _, err := m.Reserve(ctx, "a/b", sandboxes(2)); err != nil {
		t.Fatal(err)
	}
	_, err := m.Reserve(ctx, "a/b", sandboxes(1))
	wantErr(t, "fleet 8 + reserved 2 of 10", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
	tally.SetNode("n2", nil) // n2's sandboxes finished
	if _, err := m.Reserve(ctx, "a", sandboxes(3)); err != nil {
		t.Fatal(err)
	}
	p, _ := m.GetProject(ctx, root, "a")
	if p.Usage.Sandboxes != 5 || p.Reserved.Sandboxes != 5 {
		t.Fatalf("GetProject usage: got %+v reserved %+v, want 5 and 5", p.Usage, p.Reserved)
	}
}

// TestReserveCarveOut: what a parent delegated stays the child's.
func TestReserveCarveOut(t *testing.T) {
	ctx := context.Background()
	tally := iam.NewTally()
	m, _ := newIAM(t, nil, iam.Options{Usage: tally})
	mustCreate(t, m, "a", quota(10))
	mustCreate(t, m, "a/b", quota(6))
	mustCreate(t, m, "a/shared", quota(0)) // no own limit: a's pool

	for i := range 4 {
		if _, err := m.Reserve(ctx, []string{"a", "a/shared"}[i%2], sandboxes(1)); err != nil {
			t.Fatalf("direct %d: %v", i, err)
		}
	}
	_, err := m.Reserve(ctx, "a", sandboxes(1))
	wantErr(t, "parent past its undelegated 4", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
	_, err = m.Reserve(ctx, "a/shared", sandboxes(1))
	wantErr(t, "unlimited child shares the parent's remainder", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
	for i := range 6 {
		if _, err := m.Reserve(ctx, "a/b", sandboxes(1)); err != nil {
			t.Fatalf("child %d (guaranteed): %v", i, err)
		}
	}
	_, err = m.Reserve(ctx, "a/b", sandboxes(1))
	wantErr(t, "child past its quota", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
	// 5 could never fit in a's undelegated 4: refused for good, not 429.
	_, err = m.Reserve(ctx, "a/shared", sandboxes(5))
	wantErr(t, "larger than the undelegated part", err, errdefs.ErrInvalid, iam.CodeRequestTooLarge)
}

// TestReserveChildOverQuota: usage above a shrunk child's quota counts as
// it is against the parent (never less than the child's quota).
func TestReserveChildOverQuota(t *testing.T) {
	ctx := context.Background()
	tally := iam.NewTally()
	m, _ := newIAM(t, nil, iam.Options{Usage: tally})
	mustCreate(t, m, "a", quota(10))
	mustCreate(t, m, "a/b", quota(8))
	tally.SetNode("n", map[string]iam.Resources{"a/b": sandboxes(8)})
	if _, err := m.UpdateProject(ctx, root, "a/b", iam.ProjectSpec{Quota: quota(6)}); err != nil {
		t.Fatalf("shrinking below usage is allowed: %v", err)
	}
	_, err := m.Reserve(ctx, "a/b", sandboxes(1))
	wantErr(t, "child over its shrunk quota", err, errdefs.ErrExhausted, "")
	for i := range 2 {
		if _, err := m.Reserve(ctx, "a", sandboxes(1)); err != nil {
			t.Fatalf("parent %d: %v", i, err)
		}
	}
	_, err = m.Reserve(ctx, "a", sandboxes(1))
	wantErr(t, "parent with 8 used below it", err, errdefs.ErrExhausted, "")
}

func TestReservationLifetime(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	m, _ := newIAM(t, c, iam.Options{ReservationTimeout: time.Minute, CommitHold: 5 * time.Second})
	mustCreate(t, m, "a", quota(1))
	full := func(what string) {
		t.Helper()
		_, err := m.Reserve(ctx, "a", sandboxes(1))
		wantErr(t, what, err, errdefs.ErrExhausted, "")
	}
	free := func(what string) *iam.Reservation {
		t.Helper()
		r, err := m.Reserve(ctx, "a", sandboxes(1))
		wantErr(t, what, err, nil, "")
		return r
	}

	r := free("first")
	full("while pending")
	c.Advance(59 * time.Second)
	full("pending just before the timeout")
	c.Advance(time.Second)
	r = free("after the timeout frees a forgotten reservation")
	r.Commit()
	r.Commit()
	c.Advance(4 * time.Second)
	full("committed, within CommitHold")
	c.Advance(time.Second)
	r = free("after CommitHold")
	r.Commit()
	r.Release() // the caller knows the usage source counts it now
	r = free("released after commit")
	c.Advance(time.Hour)
	r.Commit() // expired while pending: nothing to hold
	free("a late commit holds nothing")
}

// TestReserveNoOvershoot races many reservations over a small tree: no
// subtree passes its quota, every delegated quota is honoured, and exactly
// the available capacity is handed out.
func TestReserveNoOvershoot(t *testing.T) {
	ctx := context.Background()
	tally := iam.NewTally()
	m, _ := newIAM(t, nil, iam.Options{Usage: tally})
	mustCreate(t, m, "a", quota(40))
	mustCreate(t, m, "a/x", quota(10))
	mustCreate(t, m, "a/y", quota(15))
	mustCreate(t, m, "a/y/deep", quota(5))
	mustCreate(t, m, "a/z", quota(0))
	tally.SetNode("n", map[string]iam.Resources{"a/x": sandboxes(3), "a/z": sandboxes(2)})

	projects := []string{"a", "a/x", "a/y", "a/y/deep", "a/z"}
	var mu sync.Mutex
	got := map[string]int64{}
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := projects[i%len(projects)]
			_, err := m.Reserve(ctx, p, sandboxes(1))
			if err == nil {
				mu.Lock()
				got[p]++
				mu.Unlock()
			} else if errdefs.Code(err) != iam.CodeQuotaExceeded {
				t.Errorf("Reserve(%s): %v", p, err)
			}
		}()
	}
	wg.Wait()
	if x := got["a/x"]; x != 7 {
		t.Errorf("a/x: got %d, want 7 (quota 10, 3 in use)", x)
	}
	if y := got["a/y"] + got["a/y/deep"]; y != 15 || got["a/y/deep"] > 5 {
		t.Errorf("a/y subtree: got %d (deep %d), want 15 (deep <= 5)", y, got["a/y/deep"])
	}
	// a keeps 40 - 10 - 15 = 15 for itself and a/z, which already uses 2.
	if direct := got["a"] + got["a/z"]; direct != 13 {
		t.Errorf("a and a/z: got %d, want 13", direct)
	}
	p, _ := m.GetProject(ctx, root, "a")
	if total := p.Usage.Sandboxes + p.Reserved.Sandboxes; total != 40 {
		t.Errorf("a: usage %d + reserved %d, want 40 in all", p.Usage.Sandboxes, p.Reserved.Sandboxes)
	}
}

func TestReserveGang(t *testing.T) {
	ctx := context.Background()
	m, _ := newIAM(t, nil, iam.Options{})
	mustCreate(t, m, "a", iam.Quota{Resources: iam.Resources{Sandboxes: 10, MilliCPU: 10000}})
	one := iam.Resources{Sandboxes: 1, MilliCPU: 1000}
	g, err := m.Reserve(ctx, "a", one.Mul(8))
	wantErr(t, "gang of 8", err, nil, "")
	_, err = m.Reserve(ctx, "a", one.Mul(3))
	wantErr(t, "gang of 3 with 2 left: all or none", err, errdefs.ErrExhausted, "")
	g.Release()
	if p, _ := m.GetProject(ctx, root, "a"); !p.Reserved.IsZero() {
		t.Fatalf("after releasing the gang: reserved %+v", p.Reserved)
	}
}

// TestQuotaChangeReachesOtherReplicas: a quota changed through one IAM
// applies in another within TreeRefresh.
func TestQuotaChangeReachesOtherReplicas(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	st := store.Memory()
	defer st.Close()
	opts := iam.Options{Now: c.Now, TreeRefresh: 2 * time.Second}
	a, b := iam.New(st, opts), iam.New(st, opts)
	if _, err := a.CreateProject(ctx, root, "p", iam.ProjectSpec{Quota: quota(1)}); err != nil {
		t.Fatal(err)
	}
	// b has never seen p: a miss reloads at once.
	r, err := b.Reserve(ctx, "p", sandboxes(1))
	wantErr(t, "b sees a new project at once", err, nil, "")
	r.Release()
	if _, err := a.UpdateProject(ctx, root, "p", iam.ProjectSpec{Quota: quota(0)}); err != nil {
		t.Fatal(err)
	}
	var rs []*iam.Reservation
	for range 2 {
		r, err := b.Reserve(ctx, "p", sandboxes(1))
		if err != nil {
			break
		}
		rs = append(rs, r)
	}
	if len(rs) != 1 {
		t.Fatalf("b before TreeRefresh: got %d reservations, want 1 (old quota)", len(rs))
	}
	c.Advance(2 * time.Second)
	if _, err := b.Reserve(ctx, "p", sandboxes(1)); err != nil {
		t.Fatalf("b after TreeRefresh (quota lifted): %v", err)
	}
}

func TestRateLimit(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	m, _ := newIAM(t, c, iam.Options{})
	mustCreate(t, m, "a", iam.Quota{CreatesPerSec: 10})
	mustCreate(t, m, "a/b", iam.Quota{CreatesPerSec: 4, CreatesBurst: 2})
	mustCreate(t, m, "a/c", iam.Quota{})
	mustCreate(t, m, "free", iam.Quota{})

	// a keeps 10 - 4 = 6/s (burst 6) for itself and a/c.
	for i := range 6 {
		if err := m.AllowCreates(ctx, []string{"a", "a/c"}[i%2], 1); err != nil {
			t.Fatalf("a create %d: %v", i, err)
		}
	}
	err := m.AllowCreates(ctx, "a/c", 1)
	wantErr(t, "a's bucket empty", err, errdefs.ErrExhausted, iam.CodeRateLimited)
	if ra := errdefs.RetryAfter(err); ra < 160*time.Millisecond || ra > 170*time.Millisecond {
		t.Fatalf("Retry-After: got %v, want 1/6 s", ra)
	}
	// a/b's delegated rate is its own.
	for i := range 2 {
		if err := m.AllowCreates(ctx, "a/b", 1); err != nil {
			t.Fatalf("a/b create %d: %v", i, err)
		}
	}
	err = m.AllowCreates(ctx, "a/b", 1)
	wantErr(t, "a/b past its burst of 2", err, errdefs.ErrExhausted, iam.CodeRateLimited)
	if ra := errdefs.RetryAfter(err); ra != 250*time.Millisecond {
		t.Fatalf("a/b Retry-After: got %v, want 250ms", ra)
	}
	c.Advance(250 * time.Millisecond)
	wantErr(t, "a/b after 250ms", m.AllowCreates(ctx, "a/b", 1), nil, "")

	// A gang larger than the burst passes on a full bucket, then owes.
	c.Advance(time.Hour)
	wantErr(t, "gang of 12 on a full bucket of 6", m.AllowCreates(ctx, "a", 12), nil, "")
	err = m.AllowCreates(ctx, "a", 1)
	if ra := errdefs.RetryAfter(err); ra < 1166*time.Millisecond || ra > 1167*time.Millisecond {
		t.Fatalf("after the gang: got %v (Retry-After %v), want 7/6 s", err, ra)
	}
	for range 1000 {
		if err := m.AllowCreates(ctx, "free", 1); err != nil {
			t.Fatalf("no limit anywhere: %v", err)
		}
	}
	wantErr(t, "unknown project", m.AllowCreates(ctx, "nope", 1), errdefs.ErrNotFound, "")
	wantErr(t, "n = 0", m.AllowCreates(ctx, "a", 0), errdefs.ErrInvalid, "")

	// A parent that delegated all of its rate has none left for itself.
	mustCreate(t, m, "full", iam.Quota{CreatesPerSec: 1})
	mustCreate(t, m, "full/kid", iam.Quota{CreatesPerSec: 1})
	wantErr(t, "fully delegated", m.AllowCreates(ctx, "full", 1), errdefs.ErrExhausted, iam.CodeRateLimited)
	wantErr(t, "the kid's", m.AllowCreates(ctx, "full/kid", 1), nil, "")
}

// TestRateLimitSustained: over a long run the bucket admits rate*time +
// burst, whatever the arrival pattern.
func TestRateLimitSustained(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	m, _ := newIAM(t, c, iam.Options{TreeRefresh: time.Hour})
	mustCreate(t, m, "a", iam.Quota{CreatesPerSec: 50, CreatesBurst: 20})
	admitted := 0
	for range 10000 { // 10 s in 1 ms steps, 3 attempts each
		for range 3 {
			if m.AllowCreates(ctx, "a", 1) == nil {
				admitted++
			}
		}
		c.Advance(time.Millisecond)
	}
	if want := 50*10 + 20; admitted < want-1 || admitted > want {
		t.Fatalf("admitted %d creates in 10s at 50/s burst 20, want %d", admitted, want)
	}
}

func ExampleIAM_Reserve() {
	ctx := context.Background()
	st := store.Memory()
	m := iam.New(st, iam.Options{})
	m.CreateProject(ctx, iam.SystemPrincipal(), "research", iam.ProjectSpec{Quota: iam.Quota{Resources: iam.Resources{Sandboxes: 1}}})
	r, err := m.Reserve(ctx, "research", iam.Resources{Sandboxes: 1})
	fmt.Println(err)
	_, err = m.Reserve(ctx, "research", iam.Resources{Sandboxes: 1})
	fmt.Println(errdefs.Code(err), errdefs.RetryAfter(err))
	r.Commit()
	// Output:
	// <nil>
	// quota_exceeded 5s
}

// Disk is charged like memory: by reservations and by the fleet's tally,
// against the project's own limit and its ancestors'.
func TestReserveDisk(t *testing.T) {
	ctx := context.Background()
	tally := iam.NewTally()
	m, _ := newIAM(t, nil, iam.Options{Usage: tally})
	mustCreate(t, m, "a", iam.Quota{Resources: iam.Resources{Disk: 100 << 30}})
	mustCreate(t, m, "a/b", iam.Quota{Resources: iam.Resources{Disk: 40 << 30}})
	disk := func(gi int64) iam.Resources { return iam.Resources{Sandboxes: 1, Disk: gi << 30} }

	r, err := m.Reserve(ctx, "a/b", disk(30))
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Reserve(ctx, "a/b", disk(20))
	wantErr(t, "30Gi reserved + 20Gi of 40Gi", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
	_, err = m.Reserve(ctx, "a/b", disk(50))
	wantErr(t, "50Gi in a 40Gi quota", err, errdefs.ErrInvalid, iam.CodeRequestTooLarge)
	// Sandboxes without disk still fit.
	if _, err := m.Reserve(ctx, "a/b", iam.Resources{Sandboxes: 1}); err != nil {
		t.Fatalf("no disk: %v", err)
	}
	r.Release()
	// The fleet's running sandboxes count too, up the tree.
	tally.SetNode("n1", map[string]iam.Resources{"a": disk(50), "a/b": disk(35)})
	_, err = m.Reserve(ctx, "a/b", disk(10))
	wantErr(t, "35Gi used + 10Gi of 40Gi", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
	if _, err := m.Reserve(ctx, "a", disk(10)); err != nil {
		t.Fatalf("parent: 50Gi own + 40Gi delegated + 10Gi of 100Gi: %v", err)
	}
	_, err = m.Reserve(ctx, "a", disk(1))
	wantErr(t, "parent full", err, errdefs.ErrExhausted, iam.CodeQuotaExceeded)
	p, _ := m.GetProject(ctx, root, "a/b")
	if p.Usage.Disk != 35<<30 {
		t.Fatalf("a/b usage %+v, want 35Gi disk", p.Usage)
	}
}
