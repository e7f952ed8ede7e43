package apiserver_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
)

// merger is a backend that says it merges memory.
type merger struct{ backend.Backend }

func (merger) MemoryMerge() error { return nil }

// A sandbox's memory merge group is its project's, never the caller's
// word: a tenant that names another project's group in its create gets
// none, and a sub-project's sandbox merges in its ancestor's group.
func TestMemoryMergeGroupFromProject(t *testing.T) {
	ksm := t.TempDir()
	h := newIAMHarness(t, func(c *node.Config) {
		c.KSMDir = ksm // the host's KSM stays as it is
		for i, b := range c.Backends {
			c.Backends[i] = merger{b}
		}
	})
	ctx := context.Background()
	m, err := h.iam.CreateProject(ctx, iam.SystemPrincipal(), "m", iam.ProjectSpec{Quota: iam.Quota{Resources: iam.Resources{Sandboxes: 10}}})
	if err != nil {
		t.Fatal(err)
	}
	h.project("m/sub", iam.Quota{Resources: iam.Resources{Sandboxes: 5}})
	h.project("other", iam.Quota{Resources: iam.Resources{Sandboxes: 5}})
	// Turned on through the API, by an admin above it.
	var p api.Project
	if a := h.do(adminSecret, "PATCH", "/v1/projects/m", `{"memory_merge":true}`); a.status != http.StatusOK {
		t.Fatalf("PATCH memory_merge: %d %s", a.status, a.body)
	} else if a.decode(t, &p); !p.MemoryMerge {
		t.Fatalf("project after PATCH: %+v", p)
	}

	sub := h.create(h.token("m/sub", iam.RoleRunner), `{"image":"busybox"}`)
	if sub.MemoryMergeGroup != m.UID {
		t.Errorf("sandbox of m/sub merges in %q, want m's group %q", sub.MemoryMergeGroup, m.UID)
	}
	forged := h.create(h.token("other", iam.RoleRunner), `{"image":"busybox","memory_merge_group":"`+m.UID+`"}`)
	if forged.MemoryMergeGroup != "" {
		t.Errorf("a sandbox of another project that named m's group merges in %q", forged.MemoryMergeGroup)
	}
}
