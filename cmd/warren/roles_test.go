package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/testutil"
)

func TestRoleUsageErrors(t *testing.T) {
	srv := newServer(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"apiserver"}, "--etcd is required"},
		{[]string{"agent", "--token", "x"}, "--apiserver or --etcd"},
		{[]string{"agent", "--token", "x", "--etcd", "http://e:2379", "--apiserver", "http://a"}, "--apiserver or --etcd"},
		{[]string{"agent", "--etcd", "http://e:2379", "--token", ""}, "--token"},
		{[]string{"agent", "--etcd", "http://e:2379", "--token", "x", "--label", "novalue"}, "key=value"},
		{[]string{"apiserver", "--etcd", "http://e:2379", "extra"}, "takes no arguments"},
	} {
		r := cli(t, srv, map[string]string{"WARREN_NODE_TOKEN": ""}, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// The production binary has no fake backend: `--backend fake` is refused,
// and the fake's package is not even linked (tests build with -tags
// warrenfake to get it).
func TestNoFakeBackendInProductionBuild(t *testing.T) {
	if simulatedBackend != nil {
		t.Skip("built with -tags warrenfake")
	}
	srv := newServer(t)
	r := cli(t, srv, nil, "", "agent", "--etcd", "http://127.0.0.1:1", "--token", "x", "--backend", "fake")
	if r.code != 2 || !strings.Contains(r.stderr, "without the fake backend") {
		t.Errorf("agent --backend fake: exit %d, stderr %q; want 2, refused", r.code, r.stderr)
	}
	testutil.RequireBinary(t, "go")
	out, err := exec.Command("go", "list", "-deps", "github.com/warrenhq/warren/cmd/warren").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "internal/backend/fake") {
		t.Error("cmd/warren links internal/backend/fake without -tags warrenfake")
	}
}
