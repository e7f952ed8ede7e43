package iam_test

import (
	"context"
	"errors"
	"testing"

	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/iam"
)

func TestRoleMatrix(t *testing.T) {
	actions := []iam.Action{
		iam.ActionRead,
		iam.ActionSandboxCreate, iam.ActionSandboxExec, iam.ActionSandboxFiles,
		iam.ActionSandboxLifecycle, iam.ActionSandboxDelete,
		iam.ActionLayerWrite, iam.ActionEnvironmentWrite,
		iam.ActionProjectWrite, iam.ActionTokenRead, iam.ActionTokenWrite,
		iam.ActionNode,
	}
	// want[role] is the string of allowed actions, one letter per action
	// in the order above.
	want := map[iam.Role]string{
		iam.RoleReader:  "r" + "....." + ".." + "..." + ".",
		iam.RoleRunner:  "r" + "sssss" + ".." + "..." + ".",
		iam.RoleBuilder: "r" + "sssss" + "le" + "..." + ".",
		iam.RoleAdmin:   "r" + "sssss" + "le" + "paa" + ".",
		iam.RoleNode:    "." + "....." + ".." + "..." + "n",
		"":              "." + "....." + ".." + "..." + ".",
		"superuser":     "." + "....." + ".." + "..." + ".",
	}
	for role, w := range want {
		for i, a := range actions {
			// Sub-project so ActionProjectWrite is in reach for admin.
			err := iam.Authorize(iam.Principal{Role: role, Project: "research"}, a, "research/x")
			if role == iam.RoleNode {
				err = iam.Authorize(iam.Principal{Role: role}, a, "")
			}
			allowed := w[i] != '.'
			if allowed && err != nil {
				t.Errorf("%s %s: got %v, want allowed", role, a, err)
			}
			if !allowed && !errors.Is(err, errdefs.ErrForbidden) {
				t.Errorf("%s %s: got %v, want ErrForbidden", role, a, err)
			}
		}
	}
}

func TestScope(t *testing.T) {
	runner := iam.Principal{Role: iam.RoleRunner, Project: "research/rl-math"}
	admin := iam.Principal{Role: iam.RoleAdmin, Project: "research/rl-math"}
	rootAdmin := iam.Principal{Role: iam.RoleAdmin}
	tests := []struct {
		p       iam.Principal
		action  iam.Action
		project string
		ok      bool
	}{
		{runner, iam.ActionSandboxCreate, "research/rl-math", true},
		{runner, iam.ActionSandboxCreate, "research/rl-math/exp1", true},
		{runner, iam.ActionSandboxCreate, "research/rl-math/exp1/deep/er", true},
		{runner, iam.ActionSandboxCreate, "research", false},
		{runner, iam.ActionSandboxCreate, "research/rl-mathx", false}, // a sibling sharing a prefix
		{runner, iam.ActionSandboxCreate, "research/rl", false},
		{runner, iam.ActionSandboxCreate, "", false},
		{runner, iam.ActionRead, "other", false},
		{admin, iam.ActionProjectWrite, "research/rl-math/exp1", true},
		{admin, iam.ActionProjectWrite, "research/rl-math", false}, // its own quota: the parent's call
		{admin, iam.ActionProjectWrite, "research", false},
		{admin, iam.ActionTokenWrite, "research/rl-math", true},
		{admin, iam.ActionTokenWrite, "research", false},
		{rootAdmin, iam.ActionProjectWrite, "", true},
		{rootAdmin, iam.ActionProjectWrite, "anything/below", true},
		{rootAdmin, iam.ActionNode, "", false}, // node endpoints: node tokens only
	}
	for _, tc := range tests {
		err := iam.Authorize(tc.p, tc.action, tc.project)
		if tc.ok && err != nil {
			t.Errorf("%s@%q %s on %q: got %v, want allowed", tc.p.Role, tc.p.Project, tc.action, tc.project, err)
		}
		if !tc.ok && !errors.Is(err, errdefs.ErrForbidden) {
			t.Errorf("%s@%q %s on %q: got %v, want ErrForbidden", tc.p.Role, tc.p.Project, tc.action, tc.project, err)
		}
	}
	if err := iam.Authorize(runner, iam.ActionRead, "Bad Path"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bad path: got %v, want ErrInvalid", err)
	}
}

func TestPrincipalContext(t *testing.T) {
	p := iam.Principal{TokenID: "abc", Role: iam.RoleReader}
	got, ok := iam.PrincipalFrom(iam.WithPrincipal(context.Background(), p))
	if !ok || got != p {
		t.Fatalf("PrincipalFrom: got %+v, %v", got, ok)
	}
	if _, ok := iam.PrincipalFrom(context.Background()); ok {
		t.Fatal("PrincipalFrom(empty): got ok")
	}
}
