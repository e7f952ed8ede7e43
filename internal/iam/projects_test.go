package iam_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/store"
)

type projOp struct {
	op   string // create, update, delete
	path string
	q    iam.Quota
	code string // "" for success
}

func TestDelegation(t *testing.T) {
	const gi = 1 << 30
	cpuMem := func(milli, mem int64) iam.Quota {
		return iam.Quota{Resources: iam.Resources{MilliCPU: milli, Memory: mem}}
	}
	rate := func(r float64) iam.Quota { return iam.Quota{CreatesPerSec: r} }
	tests := []struct {
		name string
		ops  []projOp
	}{
		{"child within parent", []projOp{
			{"create", "research", quota(10), ""},
			{"create", "research/rl-math", quota(10), ""},
		}},
		{"child exceeding parent", []projOp{
			{"create", "research", quota(10), ""},
			{"create", "research/rl-math", quota(11), iam.CodeQuotaExceedsParent},
		}},
		{"sum of children", []projOp{
			{"create", "research", quota(10), ""},
			{"create", "research/a", quota(6), ""},
			{"create", "research/b", quota(4), ""},
			{"create", "research/c", quota(1), iam.CodeQuotaExceedsParent},
			{"create", "research/c", quota(0), ""}, // no own limit: shares research's pool
		}},
		{"growing a child past the remainder", []projOp{
			{"create", "research", quota(10), ""},
			{"create", "research/a", quota(6), ""},
			{"create", "research/b", quota(4), ""},
			{"update", "research/a", quota(7), iam.CodeQuotaExceedsParent},
			{"update", "research/b", quota(3), ""},
			{"update", "research/a", quota(7), ""},
		}},
		{"shrinking a parent below its children", []projOp{
			{"create", "research", quota(10), ""},
			{"create", "research/a", quota(6), ""},
			{"create", "research/b", quota(4), ""},
			{"update", "research", quota(9), iam.CodeQuotaBelowChildren},
			{"update", "research", quota(10), ""},
			{"update", "research", quota(0), ""}, // lifting the limit is fine
		}},
		{"deep tree", []projOp{
			{"create", "a", quota(100), ""},
			{"create", "a/b", quota(50), ""},
			{"create", "a/b/c", quota(50), ""},
			{"create", "a/b/c/d", quota(50), ""},
			{"create", "a/b/c/d/e", quota(51), iam.CodeQuotaExceedsParent},
			{"create", "a/b/c/d/e", quota(20), ""},
			{"create", "a/b/c/d/f", quota(30), ""},
			{"create", "a/b/c/d/g", quota(1), iam.CodeQuotaExceedsParent},
			{"update", "a/b", quota(49), iam.CodeQuotaBelowChildren},
			{"update", "a/b/c/d", quota(49), iam.CodeQuotaBelowChildren},
			{"create", "a/x", quota(50), ""},
			{"create", "a/y", quota(1), iam.CodeQuotaExceedsParent},
		}},
		{"levels without a limit are transparent", []projOp{
			{"create", "a", quota(10), ""},
			{"create", "a/b", quota(0), ""},
			{"create", "a/b/c", quota(6), ""},
			{"create", "a/b/d", quota(4), ""},
			{"create", "a/b/e", quota(1), iam.CodeQuotaExceedsParent}, // counted against a
			{"create", "a/x", quota(1), iam.CodeQuotaExceedsParent},
			{"update", "a/b", quota(9), iam.CodeQuotaBelowChildren}, // c+d = 10
			{"update", "a/b", quota(11), iam.CodeQuotaExceedsParent},
			{"update", "a/b", quota(10), ""},
		}},
		{"a limit on a middle level replaces its children in the sum", []projOp{
			{"create", "a", quota(10), ""},
			{"create", "a/b", quota(0), ""},
			{"create", "a/b/c", quota(3), ""},
			{"update", "a/b", quota(8), ""},
			{"create", "a/x", quota(2), ""},
			{"create", "a/y", quota(1), iam.CodeQuotaExceedsParent},
			{"update", "a/b", quota(0), ""}, // a now delegates c (3) + x (2)
			{"create", "a/y", quota(5), ""},
		}},
		{"dimensions are independent", []projOp{
			{"create", "a", cpuMem(4000, 8*gi), ""},
			{"create", "a/b", cpuMem(4000, 0), ""},
			{"create", "a/c", cpuMem(0, 8*gi), ""},
			{"create", "a/d", cpuMem(1, 0), iam.CodeQuotaExceedsParent},
			{"create", "a/d", cpuMem(0, 1), iam.CodeQuotaExceedsParent},
			{"create", "a/d", quota(5), ""},
		}},
		{"rates are delegated too, exactly", []projOp{
			{"create", "a", rate(0.3), ""},
			{"create", "a/b", rate(0.1), ""},
			{"create", "a/c", rate(0.2), ""},
			{"create", "a/d", rate(0.001), iam.CodeQuotaExceedsParent},
		}},
		{"root quota", []projOp{
			{"update", "", quota(100), ""},
			{"create", "a", quota(60), ""},
			{"create", "b", quota(40), ""},
			{"create", "c", quota(1), iam.CodeQuotaExceedsParent},
			{"update", "", quota(99), iam.CodeQuotaBelowChildren},
		}},
		{"structure", []projOp{
			{"create", "a/b", quota(1), iam.CodeProjectNotFound},
			{"create", "a", quota(1), ""},
			{"create", "a", quota(1), iam.CodeProjectExists},
			{"create", "/a/b/", quota(1), ""},
			{"create", "A", quota(1), iam.CodeInvalidProject},
			{"create", "a//b", quota(1), iam.CodeInvalidProject},
			{"create", "a/../b", quota(1), iam.CodeInvalidProject},
			{"update", "nope", quota(1), iam.CodeProjectNotFound},
			{"delete", "a", iam.Quota{}, iam.CodeProjectHasChildren},
			{"delete", "a/b", iam.Quota{}, ""},
			{"delete", "a/b", iam.Quota{}, iam.CodeProjectNotFound},
			{"delete", "a", iam.Quota{}, ""},
			{"create", "a", quota(1), ""},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newIAM(t, nil, iam.Options{})
			ctx := context.Background()
			for i, o := range tc.ops {
				var err error
				switch o.op {
				case "create":
					_, err = m.CreateProject(ctx, root, o.path, iam.ProjectSpec{Quota: o.q})
				case "update":
					_, err = m.UpdateProject(ctx, root, o.path, iam.ProjectSpec{Quota: o.q})
				case "delete":
					err = m.DeleteProject(ctx, root, o.path)
				}
				what := fmt.Sprintf("op %d: %s %q %+v", i, o.op, o.path, o.q)
				if o.code == "" {
					wantErr(t, what, err, nil, "")
				} else if got := errdefs.Code(err); got != o.code {
					t.Fatalf("%s: got %v (code %q), want code %q", what, err, got, o.code)
				}
			}
		})
	}
}

func TestProjectCRUD(t *testing.T) {
	ctx := context.Background()
	m, _ := newIAM(t, nil, iam.Options{})
	p := mustCreate(t, m, "research", iam.Quota{Resources: iam.Resources{Sandboxes: 100, MilliCPU: 50000, Memory: 1 << 40}, CreatesPerSec: 50})
	if p.UID == "" || p.CreatedBy != "system" || p.CreatedAt.IsZero() {
		t.Fatalf("created project: got %+v", p)
	}
	mustCreate(t, m, "research/rl-math", quota(10))
	mustCreate(t, m, "research/rl-math/exp1", quota(5))
	mustCreate(t, m, "other", quota(1))

	got, err := m.GetProject(ctx, root, "research/rl-math")
	wantErr(t, "GetProject", err, nil, "")
	if got.Quota.Sandboxes != 10 || got.Path != "research/rl-math" {
		t.Fatalf("GetProject: got %+v", got)
	}
	list, err := m.ListProjects(ctx, root, "research")
	wantErr(t, "ListProjects", err, nil, "")
	var paths []string
	for _, p := range list {
		paths = append(paths, p.Path)
	}
	if fmt.Sprint(paths) != "[research research/rl-math research/rl-math/exp1]" {
		t.Fatalf("ListProjects(research): got %v", paths)
	}
	all, _ := m.ListProjects(ctx, root, "")
	if len(all) != 5 || all[0].Path != "" || all[0].UID != iam.RootUID {
		t.Fatalf("ListProjects(root): got %d projects, first %+v", len(all), all[0])
	}
	_, err = m.GetProject(ctx, root, "nope")
	wantErr(t, "GetProject(nope)", err, errdefs.ErrNotFound, iam.CodeProjectNotFound)

	// Delete and re-create: a new UID.
	wantErr(t, "delete exp1", m.DeleteProject(ctx, root, "research/rl-math/exp1"), nil, "")
	again := mustCreate(t, m, "research/rl-math/exp1", quota(5))
	if again.UID == "" || again.UID == list[2].UID {
		t.Fatalf("re-created project kept UID %q", again.UID)
	}
	wantErr(t, "delete root", m.DeleteProject(ctx, root, ""), errdefs.ErrInvalid, "")
}

func TestDeleteRefusesLiveUsage(t *testing.T) {
	ctx := context.Background()
	tally := iam.NewTally()
	m, _ := newIAM(t, nil, iam.Options{Usage: tally})
	mustCreate(t, m, "a", quota(10))
	tally.SetNode("n1", map[string]iam.Resources{"a": sandboxes(1)})
	wantErr(t, "delete with fleet usage", m.DeleteProject(ctx, root, "a"), errdefs.ErrConflict, iam.CodeProjectInUse)
	tally.RemoveNode("n1")
	r, err := m.Reserve(ctx, "a", sandboxes(1))
	wantErr(t, "Reserve", err, nil, "")
	wantErr(t, "delete with a reservation", m.DeleteProject(ctx, root, "a"), errdefs.ErrConflict, iam.CodeProjectInUse)
	r.Release()
	wantErr(t, "delete idle", m.DeleteProject(ctx, root, "a"), nil, "")
}

// TestConcurrentDelegation races many creates and updates under one
// parent: the delegated sum never passes the parent, whoever wins.
func TestConcurrentDelegation(t *testing.T) {
	testConcurrentDelegation(t, store.Memory())
}

func testConcurrentDelegation(t *testing.T, st store.Store) {
	ctx := context.Background()
	m := iam.New(st, iam.Options{})
	m2 := iam.New(st, iam.Options{}) // a second apiserver on the same store
	if _, err := m.CreateProject(ctx, root, "p", iam.ProjectSpec{Quota: quota(10)}); err != nil {
		t.Fatal(err)
	}
	var ok atomic.Int64
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mm := m
			if i%2 == 1 {
				mm = m2
			}
			_, err := mm.CreateProject(ctx, root, fmt.Sprintf("p/c%d", i), iam.ProjectSpec{Quota: quota(1)})
			switch {
			case err == nil:
				ok.Add(1)
			case errdefs.Code(err) != iam.CodeQuotaExceedsParent:
				t.Errorf("create p/c%d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 {
		t.Fatalf("got %d children of quota 1 under a quota of 10, want 10", ok.Load())
	}
	list, err := m.ListProjects(ctx, root, "p")
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, p := range list[1:] {
		sum += p.Quota.Sandboxes
	}
	if sum != 10 {
		t.Fatalf("stored children quotas add up to %d, want 10", sum)
	}
}

func TestProjectLimits(t *testing.T) {
	ctx := context.Background()
	m, _ := newIAM(t, nil, iam.Options{MaxProjects: 3}) // the root and two more
	mustCreate(t, m, "a", quota(0))
	mustCreate(t, m, "b", quota(0))
	_, err := m.CreateProject(ctx, root, "c", iam.ProjectSpec{})
	wantErr(t, "past MaxProjects", err, errdefs.ErrConflict, iam.CodeTooManyProjects)
	_, err = m.UpdateProject(ctx, root, "a", iam.ProjectSpec{Description: string(make([]byte, 257))})
	wantErr(t, "long description", err, errdefs.ErrInvalid, "")
	for _, q := range []iam.Quota{{Resources: sandboxes(-1)}, {CreatesPerSec: -1}, {CreatesBurst: -1}} {
		_, err = m.UpdateProject(ctx, root, "a", iam.ProjectSpec{Quota: q})
		wantErr(t, fmt.Sprintf("quota %+v", q), err, errdefs.ErrInvalid, "")
	}
}

// A project's sandboxes merge memory with those of the nearest project
// that turned merging on, itself or an ancestor, and no other: tenants
// never share a group unless the root merges everything.
func TestMergeGroup(t *testing.T) {
	ctx := context.Background()
	m, _ := newIAM(t, nil, iam.Options{})
	a := mustCreate(t, m, "a", quota(10))
	mustCreate(t, m, "a/x", quota(5))
	mustCreate(t, m, "b", quota(10))
	if _, err := m.UpdateProject(ctx, root, "a", iam.ProjectSpec{Quota: quota(10), MemoryMerge: true}); err != nil {
		t.Fatal(err)
	}
	ay, err := m.CreateProject(ctx, root, "a/y", iam.ProjectSpec{Quota: quota(5), MemoryMerge: true})
	if err != nil || !ay.MemoryMerge {
		t.Fatalf("create a/y merging: %+v, %v", ay, err)
	}
	for path, want := range map[string]string{"": "", "a": a.UID, "a/x": a.UID, "a/y": ay.UID, "b": ""} {
		if got, err := m.MergeGroup(ctx, path); err != nil || got != want {
			t.Errorf("MergeGroup(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
	if _, err := m.MergeGroup(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("MergeGroup(nope): %v, want not found", err)
	}
	if got, _ := m.GetProject(ctx, root, "a"); !got.MemoryMerge {
		t.Errorf("project a does not say it merges: %+v", got)
	}
	// Turned off: a's sandboxes created from now on merge with nothing.
	if _, err := m.UpdateProject(ctx, root, "a", iam.ProjectSpec{Quota: quota(10)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.MergeGroup(ctx, "a/x"); got != "" {
		t.Errorf("after turning a's merging off, a/x merges in %q", got)
	}
}
