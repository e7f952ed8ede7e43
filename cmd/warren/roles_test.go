package main

import (
	"strings"
	"testing"
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
