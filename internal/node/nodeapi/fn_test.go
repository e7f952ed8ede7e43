package nodeapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fncall/fncalltest"
	"github.com/warrenhq/warren/internal/node/nodeapi"
	"github.com/warrenhq/warren/internal/node/nodetest"
)

// serveFn starts an agent whose node API serves FnCall with a fake runner.
func serveFn(t *testing.T, runtimes ...string) (*nodeapi.Client, *fncalltest.Fake, *httptest.Server) {
	t.Helper()
	agent := nodetest.New(t, nil)
	fake := fncalltest.New(runtimes...)
	srv := httptest.NewServer(nodeapi.NewServer(agent, nodeapi.Secret(token), quiet).ServeFn(fake))
	t.Cleanup(srv.Close)
	return nodeapi.NewClient(agent.ID(), srv.URL, token, nil), fake, srv
}

func TestFnRoundTrip(t *testing.T) {
	c, fake, _ := serveFn(t, "python3", "cpp")
	ctx := context.Background()

	want := "4\n"
	res, err := c.RunFn(ctx, api.FnRunRequest{
		Runtime: "python3", Source: "print(input())",
		Cases: []api.FnCase{{Stdin: "4\n", Expected: &want}, {Stdin: "5\n", Expected: &want}, {Stdin: "6\n"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != api.FnWrongAnswer || res.Node != "n1" || res.Runtime != "python3" || len(res.Cases) != 3 ||
		res.Cases[0].Status != api.FnOK || res.Cases[1].Status != api.FnWrongAnswer || res.Cases[2].Stdout != "6\n" {
		t.Errorf("run: %+v", res)
	}
	if got := fake.Calls(); len(got) != 1 || got[0].Source != "print(input())" || len(got[0].Cases) != 3 {
		t.Errorf("the runner got %+v", got)
	}

	res, err = c.RunFn(ctx, api.FnRunRequest{Runtime: "cpp", Source: "COMPILE_ERROR"})
	if err != nil || res.Status != api.FnCompileError || res.Compile == nil || !strings.Contains(res.Compile.Stderr, "error") {
		t.Errorf("compile error: %+v, %v", res, err)
	}

	rts, err := c.ListFnRuntimes(ctx)
	if err != nil || len(rts) != 2 || rts[0].Name != "python3" || !rts[0].Available || rts[1].Compile == nil {
		t.Errorf("runtimes: %+v, %v", rts, err)
	}
	st, err := c.Status(ctx)
	if err != nil || len(st.FnRuntimes) != 2 || st.FnRuntimes[0].Ready != 2 {
		t.Errorf("status carries no runtimes: %+v, %v", st.FnRuntimes, err)
	}
}

func TestFnErrors(t *testing.T) {
	c, fake, srv := serveFn(t, "python3")
	ctx := context.Background()

	_, err := c.RunFn(ctx, api.FnRunRequest{Runtime: "cobol"})
	if !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != api.CodeRuntimeNotFound {
		t.Errorf("unknown runtime: %v (code %q)", err, errdefs.Code(err))
	}
	fake.SetOverloaded(3 * time.Second)
	_, err = c.RunFn(ctx, api.FnRunRequest{Runtime: "python3"})
	if !errors.Is(err, errdefs.ErrExhausted) || errdefs.Code(err) != api.CodeFnOverloaded || errdefs.RetryAfter(err) != 3*time.Second {
		t.Errorf("overloaded: %v (code %q, retry %v)", err, errdefs.Code(err), errdefs.RetryAfter(err))
	}
	fake.SetOverloaded(0)
	fake.SetUnavailable("python3", "environment fn-python3@1 is missing")
	_, err = c.RunFn(ctx, api.FnRunRequest{Runtime: "python3"})
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != api.CodeRuntimeUnavailable {
		t.Errorf("unavailable: %v (code %q)", err, errdefs.Code(err))
	}

	// Bodies are decoded strictly, and the node token is required.
	for _, tc := range []struct {
		auth, body string
		want       int
	}{
		{"Bearer " + token, `{"runtime":"python3","memroy":1}`, http.StatusBadRequest},
		{"Bearer " + token, `{"runtime":"python3","limits":{"cpu_time":"soon"}}`, http.StatusBadRequest},
		{"Bearer " + token, `not json`, http.StatusBadRequest},
		{"Bearer wrong", `{"runtime":"python3"}`, http.StatusUnauthorized},
		{"", `{"runtime":"python3"}`, http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/fn/run", strings.NewReader(tc.body))
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("POST /v1/fn/run %s with %q: %d, want %d", tc.body, tc.auth, resp.StatusCode, tc.want)
		}
	}
}

func TestFnBatch(t *testing.T) {
	c, fake, _ := serveFn(t, "python3")
	ctx := context.Background()
	calls := []api.FnRunRequest{
		{Runtime: "python3", Stdin: "a"},
		{Runtime: "nope"},
		{Runtime: "python3", Source: "EXIT 3"},
	}
	for range 20 {
		calls = append(calls, api.FnRunRequest{Runtime: "python3", Stdin: "x"})
	}
	out, err := c.RunFnBatch(ctx, api.FnBatchRequest{Calls: calls})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Results) != len(calls) {
		t.Fatalf("%d results for %d calls", len(out.Results), len(calls))
	}
	if r := out.Results[0].Result; r == nil || r.Cases[0].Stdout != "a" || r.Node != "n1" {
		t.Errorf("item 0: %+v", out.Results[0])
	}
	if e := out.Results[1].Error; e == nil || e.Code != api.CodeRuntimeNotFound || out.Results[1].Result != nil {
		t.Errorf("item 1: %+v", out.Results[1])
	}
	if r := out.Results[2].Result; r == nil || r.Status != api.FnNonZeroExit || r.Cases[0].ExitCode != 3 {
		t.Errorf("item 2: %+v", out.Results[2])
	}
	if n := len(fake.Calls()); n != len(calls) {
		t.Errorf("the runner ran %d calls, want %d", n, len(calls))
	}

	fake.SetOverloaded(time.Second)
	out, err = c.RunFnBatch(ctx, api.FnBatchRequest{Calls: calls[:1]})
	if err != nil || out.Results[0].Error == nil || out.Results[0].Error.Code != api.CodeFnOverloaded || out.Results[0].Error.RetryAfter != 1 {
		t.Errorf("overloaded item: %+v, %v", out, err)
	}

	for _, n := range []int{0, nodeapi.MaxFnBatch + 1} {
		_, err := c.RunFnBatch(ctx, api.FnBatchRequest{Calls: make([]api.FnRunRequest, n)})
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("batch of %d: %v, want invalid", n, err)
		}
	}
}

// A node without a runner serves no FnCall and reports no runtimes.
func TestNoFn(t *testing.T) {
	c, _, _ := serve(t, nil)
	_, err := c.RunFn(context.Background(), api.FnRunRequest{Runtime: "python3"})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("run on a node without FnCall: %v", err)
	}
	st, err := c.Status(context.Background())
	if err != nil || st.FnRuntimes != nil {
		t.Errorf("status: %+v, %v", st.FnRuntimes, err)
	}
}
