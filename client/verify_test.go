package client_test

import (
	"archive/tar"
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/client/clienttest"
)

// Verify copies only the named tree into a fresh sandbox, leaving out
// what the agent planted to reach outside it (links out, a FIFO), and
// leaves the agent's sandbox as it was.
func TestVerify(t *testing.T) {
	var agent string
	planted := func(w http.ResponseWriter, r *http.Request) bool {
		if agent == "" || !strings.Contains(r.URL.Path, agent) || !strings.HasSuffix(r.URL.Path, "/files") ||
			r.Method != http.MethodGet || r.URL.Query().Get("format") != "tar" {
			return false
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range []tar.Header{
			{Name: "work/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: "work/solution.py", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5},
			{Name: "work/expected", Typeflag: tar.TypeSymlink, Linkname: "/grader/expected_output"},
			{Name: "work/up", Typeflag: tar.TypeSymlink, Linkname: "../grader/tests"},
			{Name: "work/same", Typeflag: tar.TypeSymlink, Linkname: "/work/solution.py"},
			{Name: "work/hang", Typeflag: tar.TypeFifo, Mode: 0o644},
		} {
			tw.WriteHeader(&h)
			if h.Size > 0 {
				tw.Write([]byte("pass\n"))
			}
		}
		tw.Close()
		w.Header().Set("Content-Type", "application/x-tar")
		w.Write(buf.Bytes())
		return true
	}
	_, c, id := newSandbox(t, clienttest.WithIntercept(planted))
	agent = id
	ctx := context.Background()
	if err := c.WriteFile(ctx, id, "/work/notes.txt", 0o644, strings.NewReader("mine")); err != nil {
		t.Fatal(err)
	}
	res, err := c.Verify(ctx, id, client.VerifyRequest{Image: "busybox", Copy: []string{"/work"}, Keep: true,
		Exec: api.ExecRequest{Argv: []string{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Verifier == "" || res.Verifier == id || res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
	slices.Sort(res.Skipped)
	want := []string{
		"work/expected: symbolic link to /grader/expected_output leads out of the copied tree",
		"work/hang: special file",
		"work/up: symbolic link to ../grader/tests leads out of the copied tree",
	}
	if !slices.Equal(res.Skipped, want) {
		t.Errorf("skipped %q, want %q", res.Skipped, want)
	}
	var got bytes.Buffer
	if err := c.ReadTar(ctx, res.Verifier, "/work", &got); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	tr := tar.NewReader(&got)
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names[h.Name] = h.Linkname
	}
	if _, ok := names["work/solution.py"]; !ok || names["work/same"] != "solution.py" {
		t.Errorf("the verifier's /work: %v; want solution.py and same -> solution.py", names)
	}
	for _, n := range []string{"work/expected", "work/up", "work/hang"} {
		if _, ok := names[n]; ok {
			t.Errorf("%s reached the verifier", n)
		}
	}
	// The agent's sandbox: only read.
	var mine bytes.Buffer
	if err := c.ReadFile(ctx, id, "/work/notes.txt", &mine); err != nil || mine.String() != "mine" {
		t.Errorf("the agent's file after verify: %q, %v", mine.String(), err)
	}

	// Without Keep, the verifier is gone afterwards.
	res, err = c.Verify(ctx, id, client.VerifyRequest{Image: "busybox", Copy: []string{"/work"}, Exec: api.ExecRequest{Argv: []string{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSandbox(ctx, res.Verifier); err == nil {
		t.Errorf("verifier %s still there", res.Verifier)
	}
	// Bad requests say so before anything is created.
	for _, bad := range []client.VerifyRequest{{Copy: []string{"/work"}}, {Image: "busybox"}, {Image: "busybox", Copy: []string{"work"}}} {
		if _, err := c.Verify(ctx, id, bad); err == nil {
			t.Errorf("Verify(%+v) succeeded", bad)
		}
	}
}
