package main

import (
	"sort"
	"strings"
	"testing"
)

func TestSandboxRmAll(t *testing.T) {
	srv := newServer(t)
	a1 := mustCreate(t, srv, "--label", "task=a")
	a2 := mustCreate(t, srv, "--label", "task=a", "--label", "run=2")
	b := mustCreate(t, srv, "--label", "task=b")

	r := cli(t, srv, nil, "", "sandbox", "rm", "--all", "--label", "task=a")
	got := strings.Fields(r.stdout)
	sort.Strings(got)
	want := []string{a1, a2}
	sort.Strings(want)
	if r.code != 0 || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("rm --all --label task=a: exit %d, stdout %q, stderr %q; want %v", r.code, r.stdout, r.stderr, want)
	}
	for _, id := range want {
		if _, ok := srv.Sandbox(id); ok {
			t.Errorf("%s still there", id)
		}
	}
	if _, ok := srv.Sandbox(b); !ok {
		t.Errorf("rm --all --label task=a removed %s (task=b)", b)
	}

	r = cli(t, srv, nil, "", "sandbox", "rm", "--all")
	if r.code != 0 || r.stdout != b+"\n" {
		t.Errorf("rm --all: exit %d, stdout %q; want %q", r.code, r.stdout, b+"\n")
	}
	r = cli(t, srv, nil, "", "sandbox", "rm", "--all")
	if r.code != 0 || r.stdout != "" {
		t.Errorf("rm --all with nothing left: exit %d, stdout %q; want 0 and nothing", r.code, r.stdout)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "rm"}, "or --all"},
		{[]string{"sandbox", "rm", "--all", b}, "not both"},
		{[]string{"sandbox", "rm", "--label", "task=a", b}, "go with --all"},
		{[]string{"sandbox", "rm", "--all", "--label", "novalue"}, "label"},
	} {
		r := cli(t, srv, nil, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
