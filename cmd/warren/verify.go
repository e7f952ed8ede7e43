package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

func newSandboxVerifyCmd(a *app) *cobra.Command {
	var (
		image   string
		copies  []string
		shell   string
		workdir string
		timeout time.Duration
		keep    bool
		output  string
	)
	c := &cobra.Command{
		Use:   "verify SBX --image ENV --copy PATH... [flags] -- CMD [ARGS...]",
		Short: "Check a sandbox's work in a clean room: a fresh sandbox from a pristine environment",
		Long: `Run a check on a sandbox's work without trusting anything in it: a new sandbox
is made from --image (the verifier's own binaries, libraries and users, never
the agent's), only the --copy paths are copied into it from SBX, to the same
paths, and the command runs there. SBX is only read. Symbolic links that
lead out of a copied tree (a link to the grader's reference answers would
pass for the agent's own) and special files are left out and named on
stderr. warren exits with the command's exit code, as exec does; the
verifier is deleted afterwards unless --keep.`,
		Example: `  warren sandbox verify $SBX --image grader@1 --copy /work -- python3 -m pytest -q
  warren sandbox verify $SBX --image grader@1 --copy /work/solution.py --sh 'cd /work && python3 check.py'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 || (len(args) > 1) == (shell != "") {
				return usagef("verify needs a sandbox id and exactly one of a command after --, or --sh 'CMD STRING'")
			}
			if image == "" || len(copies) == 0 {
				return usagef("verify needs --image and at least one --copy")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout < 0 {
				return usagef("--timeout must not be negative")
			}
			req := client.VerifyRequest{Image: image, Copy: copies, Keep: keep,
				Exec: api.ExecRequest{Argv: args[1:], Cmd: shell, Cwd: workdir, Timeout: api.Duration(timeout)}}
			if len(req.Exec.Argv) == 0 {
				req.Exec.Argv = nil
			}
			stdout, stderr := &countWriter{w: a.stdout}, &countWriter{w: a.stderr}
			if output != outJSON {
				req.Stdout, req.Stderr = stdout, stderr
			}
			res, err := a.client().Verify(cmd.Context(), args[0], req)
			if res != nil {
				for _, s := range res.Skipped {
					fmt.Fprintf(a.stderr, "warren verify: not copied: %s\n", s)
				}
				if keep {
					fmt.Fprintf(a.stderr, "warren verify: the verifier %s is kept\n", res.Verifier)
				}
			}
			if err != nil {
				return err
			}
			if output == outJSON {
				if err := writeJSON(a.stdout, res); err != nil {
					return err
				}
				if code := exitCode(&res.ExecResult); code != 0 {
					return exitError{code}
				}
				return nil
			}
			return a.execOutcome(&res.ExecResult, stdout, stderr, timeout)
		},
	}
	f := c.Flags()
	f.StringVar(&image, "image", "", "the verifier's environment, NAME@VERSION (required)")
	f.StringArrayVar(&copies, "copy", nil, "an absolute path to copy from SBX to the same path in the verifier (repeatable; required)")
	f.StringVar(&shell, "sh", "", "run this string with the platform's own shell (sh -c) in the verifier instead of an argv")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory in the verifier")
	f.DurationVar(&timeout, "timeout", 0, "kill the check after this long (server default when 0)")
	f.BoolVar(&keep, "keep", false, "keep the verifier sandbox (for a look at what the check saw)")
	f.StringVarP(&output, "output", "o", "", "output: the command's own (default) or json (the result, skipped entries and the verifier's id)")
	return c
}
