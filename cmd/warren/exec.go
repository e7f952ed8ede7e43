package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// exitTimedOut is the status of a command that ran out of time, as with
// timeout(1).
const exitTimedOut = 124

func newExecCmd(a *app) *cobra.Command {
	var (
		timeout     time.Duration
		env         []string
		workdir     string
		user        string
		interactive bool
		maxOutput   string
		shell       string
	)
	c := &cobra.Command{
		Use:   "exec SBX [flags] -- CMD [ARGS...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its exit code",
		Long: `Run a command in a sandbox. Its stdout and stderr stream to the local ones as
they arrive, and warren exits with the command's exit code (124 when it timed
out, 128+N when killed by signal N).

The command is an argv: no shell parses it. Use --sh 'CMD STRING' for
sh -c with the platform's own shell (a static bash from the node, never the
sandbox's /bin/sh, which the workload may have replaced; the commands it
runs are the sandbox's). Put flags for warren before "--".`,
		Example: `  warren exec $SBX -- ls -la /work
  warren exec $SBX --timeout 2s -e K=V -w /work -- python3 main.py
  warren exec $SBX --sh 'cd /work && make test | tail -n 20'
  echo hello | warren exec -i $SBX -- cat`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("exec needs a sandbox id and a command: warren exec SBX -- CMD [ARGS...]")
			}
			if (len(args) > 1) == (shell != "") {
				return usagef("exec needs exactly one of a command after the sandbox id, or --sh 'CMD STRING'")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			req := api.ExecRequest{Argv: args[1:], Cmd: shell, Cwd: workdir, User: user, Timeout: api.Duration(timeout)}
			if len(req.Argv) == 0 {
				req.Argv = nil
			}
			if timeout < 0 {
				return usagef("--timeout must not be negative")
			}
			if maxOutput != "" {
				q, err := api.ParseQuantity(maxOutput)
				if err != nil {
					return usagef("--max-output: %v", err)
				}
				req.MaxOutput = q
			}
			var err error
			if req.Env, err = parseKVs("env", env, a.getenv, true); err != nil {
				return err
			}
			if interactive {
				in, err := io.ReadAll(a.stdin)
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				client.SetStdin(&req, in)
			}
			stdout, stderr := &countWriter{w: a.stdout}, &countWriter{w: a.stderr}
			res, err := a.client().ExecStream(cmd.Context(), args[0], req, stdout, stderr)
			if err != nil {
				return err
			}
			return a.execOutcome(res, stdout, stderr, timeout)
		},
	}
	f := c.Flags()
	f.DurationVar(&timeout, "timeout", 0, "kill the command after this long (server default when 0)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment KEY=VALUE, or KEY to pass the local value (repeatable)")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory inside the sandbox")
	f.StringVarP(&user, "user", "u", "", "user: name, uid or uid:gid")
	f.BoolVarP(&interactive, "interactive", "i", false, "send local stdin to the command (read fully first)")
	f.StringVar(&maxOutput, "max-output", "", "cap on each of stdout and stderr, e.g. 1Mi (server default when empty)")
	f.StringVar(&shell, "sh", "", "run this string with the platform's own shell (sh -c) instead of an argv")
	return c
}

// execOutcome reports a streamed exec's truncation, timeout or signal on
// stderr and turns its result into warren's exit status (exitError).
func (a *app) execOutcome(res *api.ExecResult, stdout, stderr *countWriter, timeout time.Duration) error {
	reportTruncation(a.stderr, "stdout", res.StdoutTruncated, stdout.n, res.StdoutBytes)
	reportTruncation(a.stderr, "stderr", res.StderrTruncated, stderr.n, res.StderrBytes)
	code := exitCode(res)
	switch {
	case res.TimedOut:
		after := timeout
		if after == 0 && res.DurationMs > 0 {
			after = (time.Duration(res.DurationMs) * time.Millisecond).Round(100 * time.Millisecond)
		}
		if after > 0 {
			fmt.Fprintf(a.stderr, "warren: exec timed out after %s\n", after)
		} else {
			fmt.Fprintln(a.stderr, "warren: exec timed out")
		}
		code = exitTimedOut
	case res.Signal != "":
		fmt.Fprintf(a.stderr, "warren: command killed by %s\n", res.Signal)
	}
	if code != 0 {
		return exitError{code}
	}
	return nil
}

// exitCode maps a result to a process exit status: the command's own, or
// 128+N when a signal killed it, clamped to 0..255.
func exitCode(res *api.ExecResult) int {
	code := res.ExitCode
	if res.Signal != "" && code <= 0 {
		code = 128 + signalNumber(res.Signal)
	}
	if code < 0 || code > 255 {
		return 255
	}
	return code
}

var signalNumbers = map[string]int{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6, "SIGBUS": 7,
	"SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12, "SIGPIPE": 13,
	"SIGALRM": 14, "SIGTERM": 15, "SIGXCPU": 24, "SIGXFSZ": 25, "SIGSYS": 31,
}

func signalNumber(name string) int {
	if n, ok := signalNumbers[name]; ok {
		return n
	}
	if n, ok := signalNumbers["SIG"+name]; ok {
		return n
	}
	return 9
}

func reportTruncation(w io.Writer, stream string, truncated bool, shown, total int64) {
	if !truncated {
		return
	}
	fmt.Fprintf(w, "warren: %s truncated: showed %s of %s (raise --max-output)\n", stream, fmtBytes(shown), fmtBytes(total))
}

// countWriter counts what passes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
