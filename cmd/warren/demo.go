package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// newDemoCmd walks through what a sandbox offers against a running server,
// printing each step as the CLI line that does the same. It checks every
// answer, so it doubles as a smoke test: it exits non-zero if one is wrong.
func newDemoCmd(a *app) *cobra.Command {
	image := "busybox"
	wait := 30 * time.Second
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Create a sandbox, run commands and move files through it, then remove it",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := waitHealthy(cmd.Context(), a.client(), wait); err != nil {
				return err
			}
			// Only now: a server that just started writes its token late.
			return a.demo(cmd.Context(), a.client(), image)
		},
	}
	cmd.Flags().StringVar(&image, "image", image, "image to start from")
	cmd.Flags().DurationVar(&wait, "wait", wait, "how long to wait for the server to answer")
	return cmd
}

func (a *app) demo(ctx context.Context, c *client.Client, image string) error {
	step := func(format string, args ...any) { fmt.Fprintf(a.stdout, "\n$ "+format+"\n", args...) }
	check := func(ok bool, format string, args ...any) error {
		if !ok {
			return fmt.Errorf("demo: "+format, args...)
		}
		return nil
	}

	step("warren sandbox create --image %s --cpu 1 --memory 256Mi --ttl 30m --label task=demo", image)
	start := time.Now()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{
		Image:     image,
		Resources: api.Resources{CPU: 1, Memory: 256 << 20},
		TTL:       api.Duration(30 * time.Minute),
		Labels:    map[string]string{"task": "demo"},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "%s (%s, created in %v)\n", sb.ID, sb.State, time.Since(start).Round(time.Millisecond))
	defer func() {
		step("warren sandbox rm %s", sb.ID)
		if err := c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); err != nil {
			fmt.Fprintln(a.stderr, "warren:", err)
			return
		}
		fmt.Fprintln(a.stdout, sb.ID)
	}()

	run := func(req api.ExecRequest) (*api.ExecResult, error) {
		return c.ExecStream(ctx, sb.ID, req, a.stdout, a.stdout)
	}

	step("warren exec %s --sh 'echo hello; echo oops >&2; exit 3'", sb.ID)
	res, err := run(api.ExecRequest{Cmd: "echo hello; echo oops >&2; exit 3"})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "(exit code %d)\n", res.ExitCode)
	if err := check(res.ExitCode == 3, "exit code %d, want 3", res.ExitCode); err != nil {
		return err
	}

	step("warren exec %s --timeout 2s -- sleep 60", sb.ID)
	res, err = run(api.ExecRequest{Argv: []string{"sleep", "60"}, Timeout: api.Duration(2 * time.Second)})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "(timed out: %v after %dms)\n", res.TimedOut, res.DurationMs)
	if err := check(res.TimedOut, "sleep 60 with a 2s timeout did not time out"); err != nil {
		return err
	}

	step("warren exec %s --sh 'hostname; id; grep -E \"^(Seccomp|NoNewPrivs):\" /proc/self/status; ip -o link 2>/dev/null | cut -d: -f2'", sb.ID)
	res, err = run(api.ExecRequest{Cmd: `hostname; id; grep -E "^(Seccomp|NoNewPrivs):" /proc/self/status; ip -o link 2>/dev/null | cut -d: -f2`})
	if err != nil {
		return err
	}

	local, err := os.MkdirTemp("", "warren-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(local)
	task := filepath.Join(local, "task")
	if err := os.MkdirAll(task, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(task, "numbers.txt"), []byte("3\n1\n2\n"), 0o644); err != nil {
		return err
	}
	step("warren cp %s %s:/work", task, sb.ID)
	if err := c.CopyTo(ctx, sb.ID, task, "/work"); err != nil {
		return err
	}

	step("warren exec %s -w /work --sh 'sort -n numbers.txt > out.txt && ls -l'", sb.ID)
	if _, err := run(api.ExecRequest{Cmd: "sort -n numbers.txt > out.txt && ls -l", Cwd: "/work"}); err != nil {
		return err
	}

	step("warren cp %s:/work/out.txt %s", sb.ID, local)
	if err := c.CopyFrom(ctx, sb.ID, "/work/out.txt", local); err != nil {
		return err
	}
	out, err := os.ReadFile(filepath.Join(local, "out.txt"))
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "%s", out)
	if err := check(string(out) == "1\n2\n3\n", "out.txt = %q, want the sorted numbers", out); err != nil {
		return err
	}

	step("warren sandbox ls --label task=demo")
	list, err := c.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"task": "demo"}})
	if err != nil {
		return err
	}
	for _, s := range list {
		fmt.Fprintf(a.stdout, "%s  %s  %s  %s\n", s.ID, s.Image, s.State, strings.TrimSpace(fmt.Sprint(s.Labels)))
	}
	return a.demoFn(ctx, c, check, step)
}

// demoFn judges a small program with FnCall: three cases, one of them
// wrong, each in the same fresh container thrown away afterwards; then a
// program that never stops, ended by its CPU time limit.
func (a *app) demoFn(ctx context.Context, c *client.Client, check func(bool, string, ...any) error, step func(string, ...any)) error {
	step("warren fn run --runtime sh sum.sh --case 1.in:1.out --case 2.in:2.out --case 3.in:3.out")
	want := func(s string) *string { return &s }
	res, err := c.RunFn(ctx, api.FnRunRequest{
		Runtime: "sh",
		Source:  "read a b; echo $((a + b))\n",
		Cases: []api.FnCase{
			{Stdin: "1 2\n", Expected: want("3")},
			{Stdin: "2 2\n", Expected: want("5")},
			{Stdin: "20 22\n", Expected: want("42")},
		},
	})
	if err != nil {
		return err
	}
	for i, cs := range res.Cases {
		fmt.Fprintf(a.stdout, "case %d  %-12s cpu %dms  wall %dms  stdout %q\n", i+1, cs.Status, cs.CPUMs, cs.WallMs, cs.Stdout)
	}
	fmt.Fprintf(a.stdout, "%s (in %dms)\n", res.Status, res.WallMs)
	if err := check(len(res.Cases) == 3 && res.Cases[0].Status == api.FnOK && res.Cases[1].Status == api.FnWrongAnswer &&
		res.Cases[2].Status == api.FnOK, "fn cases: %+v", res.Cases); err != nil {
		return err
	}

	step("warren fn run --runtime sh spin.sh --cpu-time 500ms")
	res, err = c.RunFn(ctx, api.FnRunRequest{Runtime: "sh", Source: "while :; do :; done\n",
		Limits: api.FnLimits{CPUTime: api.Duration(500 * time.Millisecond), WallTime: api.Duration(10 * time.Second)}})
	if err != nil {
		return err
	}
	cs := res.Cases[0]
	fmt.Fprintf(a.stdout, "%s: %s (cpu %dms, wall %dms)\n", cs.Status, cs.Message, cs.CPUMs, cs.WallMs)
	return check(cs.Status == api.FnTimeLimit, "spin: %+v", cs)
}

// waitHealthy polls the server until it answers, so the demo can start
// right after `warren up &`.
func waitHealthy(ctx context.Context, c *client.Client, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := c.Health(ctx)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
