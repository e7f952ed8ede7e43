package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// runVerb runs c as the one subcommand of a bare root.
func runVerb(c *cobra.Command, a *app, args ...string) error {
	root := &cobra.Command{Use: "warren", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(c)
	root.SetArgs(args)
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	return root.ExecuteContext(context.Background())
}

func testApp() (*app, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	return &app{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}, &out, &errOut
}

func TestShowCmd(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		list    []api.Layer
		stdout  string // a prefix of it
		fetched bool
		usage   bool
	}{
		{[]string{"ls"}, []api.Layer{{Ref: "a@1"}}, "text 1\n", true, false},
		{[]string{"ls", "-o", "json"}, []api.Layer{{Ref: "a@1"}}, "{\n  \"layers\": [\n    {\n      \"ref\": \"a@1\",", true, false},
		{[]string{"ls", "-o", "json"}, nil, "{\n  \"layers\": []\n}\n", true, false}, // [] not null
		{[]string{"ls", "-o", "yaml"}, nil, "", false, true},                         // checked before any request
	} {
		a, out, _ := testApp()
		fetched := false
		c := showCmd(a, &cobra.Command{Use: "ls"}, "table", func(cmd *cobra.Command, args []string) (api.LayerList, error) {
			fetched = true
			return api.LayerList{Layers: nonNil(tc.list)}, nil
		}, func(w io.Writer, l api.LayerList) error {
			_, err := fmt.Fprintf(w, "text %d\n", len(l.Layers))
			return err
		})
		err := runVerb(c, a, tc.args...)
		var ue usageError
		if errors.As(err, &ue) != tc.usage || (!tc.usage && err != nil) {
			t.Errorf("%v: error %v, want usage error %v", tc.args, err, tc.usage)
		}
		if !strings.HasPrefix(out.String(), tc.stdout) || (tc.stdout == "") != (out.Len() == 0) || fetched != tc.fetched {
			t.Errorf("%v: stdout %q (fetched %v), want %q (%v)", tc.args, out.String(), fetched, tc.stdout, tc.fetched)
		}
	}

	// A failed fetch prints nothing and returns its error as is.
	a, out, _ := testApp()
	boom := errors.New("boom")
	c := showCmd(a, &cobra.Command{Use: "get"}, "text", func(*cobra.Command, []string) (*api.Layer, error) { return nil, boom },
		func(io.Writer, *api.Layer) error { t.Error("text called after a failed fetch"); return nil })
	if err := runVerb(c, a, "get", "-o", "json"); err != boom || out.Len() != 0 {
		t.Errorf("failed fetch: %v, stdout %q", err, out.String())
	}
	if f := c.Flags().Lookup("output"); f == nil || f.Shorthand != "o" || f.Usage != "output: text (default) or json" {
		t.Errorf("-o flag: %+v", f)
	}
}

func TestEachCmd(t *testing.T) {
	newCmd := func(a *app, calls *[]string) *cobra.Command {
		return eachCmd(a, &cobra.Command{Use: "rm"}, "one or more refs", func(c *client.Client, ctx context.Context, arg string) error {
			if c == nil {
				t.Error("no client")
			}
			*calls = append(*calls, arg)
			if strings.HasPrefix(arg, "bad") {
				return &client.Error{StatusCode: 404, Code: api.CodeLayerNotFound, Message: "layer " + arg + " not found"}
			}
			return nil
		})
	}

	a, out, errOut := testApp()
	var calls []string
	err := runVerb(newCmd(a, &calls), a, "rm", "a@1", "bad@1", "b@1")
	if ee, ok := err.(exitError); !ok || ee.code != 1 {
		t.Errorf("a partial failure: %v, want exit status 1", err)
	}
	if got := strings.Join(calls, " "); got != "a@1 bad@1 b@1" {
		t.Errorf("called on %q; want every argument in order", got)
	}
	if out.String() != "a@1\nb@1\n" || errOut.String() != "warren: bad@1: layer bad@1 not found (layer_not_found)\n" {
		t.Errorf("stdout %q stderr %q", out.String(), errOut.String())
	}

	a, out, _ = testApp()
	calls = nil
	if err := runVerb(newCmd(a, &calls), a, "rm", "a@1"); err != nil || out.String() != "a@1\n" {
		t.Errorf("success: %v, stdout %q", err, out.String())
	}

	a, _, _ = testApp()
	calls = nil
	err = runVerb(newCmd(a, &calls), a, "rm")
	var ue usageError
	if !errors.As(err, &ue) || err.Error() != "warren rm takes one or more refs" || len(calls) != 0 {
		t.Errorf("no arguments: %v (calls %v), want a usage error", err, calls)
	}
}

func TestSandboxVerify(t *testing.T) {
	srv := newServer(t)
	id := mustCreate(t, srv)
	local := filepath.Join(t.TempDir(), "answer.txt")
	if err := os.WriteFile(local, []byte("42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := cli(t, srv, nil, "", "cp", local, id+":/work/answer.txt"); r.code != 0 {
		t.Fatalf("cp: %+v", r)
	}
	for _, tc := range []struct {
		args       []string
		code       int
		stdout, in string
	}{
		{[]string{"sandbox", "verify", id, "--image", "busybox", "--copy", "/work/answer.txt", "--", "echo", "checked"}, 0, "checked\n", ""},
		{[]string{"sandbox", "verify", id, "--image", "busybox", "--copy", "/work/answer.txt", "--", "exit", "3"}, 3, "", ""},
		{[]string{"sandbox", "verify", id, "--copy", "/work", "--", "true"}, 2, "", "--image"},
		{[]string{"sandbox", "verify", id, "--image", "busybox", "--", "true"}, 2, "", "--copy"},
		{[]string{"sandbox", "verify", id, "--image", "busybox", "--copy", "/work"}, 2, "", "exactly one"},
		{[]string{"sandbox", "verify", id, "--image", "busybox", "--copy", "/nope", "--", "true"}, 1, "", "nope"},
	} {
		r := cli(t, srv, nil, "", tc.args...)
		if r.code != tc.code || r.stdout != tc.stdout || !strings.Contains(r.stderr, tc.in) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, stderr with %q", tc.args[3:], r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.in)
		}
	}
	// Only the agent's sandbox is left: every verifier was deleted.
	if r := cli(t, srv, nil, "", "sandbox", "ls", "-o", "id"); strings.TrimSpace(r.stdout) != id {
		t.Errorf("sandboxes after verify: %q, want only %s", r.stdout, id)
	}
}
