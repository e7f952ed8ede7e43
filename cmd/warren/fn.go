package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// Exit statuses of `warren fn run` beyond 0 (every case OK) and 2 (usage).
const (
	exitFnFailed    = 1 // the program failed: CompileError, or a case not OK
	exitFnNoVerdict = 3 // SandboxError, or the platform could not run the call
)

func newFnCmd(a *app) *cobra.Command {
	fn := &cobra.Command{Use: "fn", Short: "Run stateless FnCall jobs (judge, compile, test runs) on pre-created containers"}
	groupArgs(fn)
	fn.AddCommand(newFnRunCmd(a), newFnRuntimesCmd(a))
	return fn
}

// fnRunFlags are the flags of `warren fn run`.
type fnRunFlags struct {
	runtime                  string
	cpuTime, wallTime        time.Duration
	memory, output, fileSize string
	pids                     int64
	stdin                    string
	cases, files, args, env  []string
	stopOnFail               bool
	compare, project         string
	out                      string
}

func newFnRunCmd(a *app) *cobra.Command {
	var fl fnRunFlags
	c := &cobra.Command{
		Use:   "run --runtime RUNTIME [SOURCE] [flags] [-- ARGS...]",
		Short: "Run a program once, or once per test case, in a fresh container",
		Long: `Run SOURCE (a file, or - for stdin) with a runtime the nodes declare (see
'warren fn runtimes'), in a fresh container thrown away afterwards.

Without --case the program runs once on --stdin: its stdout and stderr come
out on warren's, and a summary line (status, CPU and wall time, peak memory)
ends stderr. With --case IN[:OUT] (repeatable) it runs once per case, IN as
its stdin and, when OUT is given, its stdout compared with OUT (--compare
lines, the default, ignores trailing whitespace and trailing empty lines;
exact compares bytes): a table shows each case, then short diffs of wrong
answers. Files that are not UTF-8 are sent base64-encoded.

Exit status:
  0  every case OK
  1  the program failed: CompileError, or a case WrongAnswer, NonZeroExit,
     TimeLimit, MemoryLimit, OutputLimit or Signal
  2  usage: bad flags, unreadable files, or a request the server refused as
     invalid, unauthorized or for an unknown runtime
  3  no verdict: a case ended in SandboxError (a platform fault, not the
     program's), or the platform could not run the call (overloaded,
     unavailable, unreachable); trying again may help`,
		Example: `  warren fn run --runtime python3 solution.py --stdin in.txt --cpu-time 2s --memory 256Mi
  warren fn run --runtime cpp main.cpp --case in1.txt:out1.txt --case in2.txt:out2.txt --stop-on-fail
  warren fn run --runtime sh run.sh --file data.csv --file lib.sh:lib/util.sh -- --verbose
  echo 'print(6*7)' | warren fn run --runtime python3 - -o json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if n := cmd.ArgsLenAtDash(); n > 1 || n < 0 && len(args) > 1 {
				return usagef("fn run takes at most one source file; put the program's arguments after --")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(fl.out, outDefault, "table", outJSON); err != nil {
				return err
			}
			source, progArgs := args, []string(nil)
			if n := cmd.ArgsLenAtDash(); n >= 0 {
				source, progArgs = args[:n], args[n:]
			}
			cl := a.client()
			req, expected, err := fl.request(cmd.Context(), a, cl, firstArg(source), progArgs)
			if err != nil {
				return fnFail(cmd.Context(), a, err)
			}
			res, err := cl.RunFn(cmd.Context(), req)
			if err != nil {
				return fnFail(cmd.Context(), a, err)
			}
			if fl.out == outJSON {
				err = writeJSON(a.stdout, encodeFnResult(*res))
			} else if len(req.Cases) == 0 {
				err = printFnRun(a.stdout, a.stderr, res)
			} else {
				err = printFnCases(a.stdout, a.stderr, res, expected, req.Compare)
			}
			if err != nil {
				return err
			}
			if code := fnExit(res); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&fl.runtime, "runtime", "", "runtime to run with, e.g. python3, cpp (required; see 'warren fn runtimes')")
	f.DurationVar(&fl.cpuTime, "cpu-time", 0, "CPU time limit per case, e.g. 2s (node default when 0)")
	f.DurationVar(&fl.wallTime, "wall-time", 0, "wall time limit per case (default 2x CPU time + 1s)")
	f.StringVar(&fl.memory, "memory", "", "peak memory limit per case, e.g. 256Mi")
	f.Int64Var(&fl.pids, "pids", 0, "processes and threads at once (node default when 0)")
	f.StringVar(&fl.output, "output-limit", "", "cap on each of stdout and stderr, e.g. 1Mi")
	f.StringVar(&fl.fileSize, "file-size", "", "largest file the program may write, e.g. 16Mi")
	f.StringVar(&fl.stdin, "stdin", "", "file to feed the single run on stdin, or - for warren's stdin")
	f.StringArrayVar(&fl.cases, "case", nil, "test case IN[:OUT]: IN is the stdin, OUT the expected stdout (repeatable)")
	f.BoolVar(&fl.stopOnFail, "stop-on-fail", false, "skip the cases after the first that is not OK")
	f.StringVar(&fl.compare, "compare", "", "how stdout is matched with OUT: lines (default) or exact")
	f.StringArrayVar(&fl.files, "file", nil, "extra file PATH[:DEST], DEST relative to the working directory (repeatable)")
	f.StringArrayVar(&fl.args, "arg", nil, "argument for the program (repeatable; or put them after --)")
	f.StringArrayVarP(&fl.env, "env", "e", nil, "environment KEY=VALUE, or KEY to pass the local value (repeatable)")
	f.StringVar(&fl.project, "project", "", "project the call counts against (default: the token's)")
	f.StringVarP(&fl.out, "output", "o", "", "output: table (default) or json")
	return c
}

// request builds the call from the flags; expected holds each case's OUT
// (nil when it has none), for diffs.
func (fl *fnRunFlags) request(ctx context.Context, a *app, cl *client.Client, src string, args []string) (api.FnRunRequest, [][]byte, error) {
	req := api.FnRunRequest{Runtime: fl.runtime, StopOnFail: fl.stopOnFail, Compare: fl.compare, Project: fl.project,
		Args: append(append([]string(nil), fl.args...), args...)}
	if fl.runtime == "" {
		return req, nil, usagef("--runtime is required (see 'warren fn runtimes')")
	}
	if src == "" && len(fl.files) == 0 {
		return req, nil, usagef("fn run needs a source file (or - for stdin), or --file")
	}
	switch fl.compare {
	case "", "lines", "exact":
	default:
		return req, nil, usagef("--compare %q: want lines or exact", fl.compare)
	}
	if fl.stdin != "" && len(fl.cases) > 0 {
		return req, nil, usagef("--stdin and --case do not mix: give each case its input")
	}
	if src == "-" && fl.stdin == "-" {
		return req, nil, usagef("the source and --stdin cannot both be read from stdin")
	}
	if fl.cpuTime < 0 || fl.wallTime < 0 || fl.pids < 0 {
		return req, nil, usagef("limits must not be negative")
	}
	req.Limits = api.FnLimits{CPUTime: api.Duration(fl.cpuTime), WallTime: api.Duration(fl.wallTime), PIDs: fl.pids}
	for _, q := range []struct {
		flag, val string
		dst       *api.Quantity
	}{{"memory", fl.memory, &req.Limits.Memory}, {"output-limit", fl.output, &req.Limits.Output}, {"file-size", fl.fileSize, &req.Limits.FileSize}} {
		if q.val == "" {
			continue
		}
		v, err := api.ParseQuantity(q.val)
		if err != nil {
			return req, nil, usagef("--%s: %v", q.flag, err)
		}
		*q.dst = v
	}
	var err error
	if req.Env, err = parseKVs("env", fl.env, a.getenv, true); err != nil {
		return req, nil, err
	}

	if src != "" {
		b, err := readInput(a, src)
		if err != nil {
			return req, nil, err
		}
		if utf8.Valid(b) {
			req.Source = string(b)
		} else {
			// Source has no encoding: send it as the runtime's source file.
			name, err := fnSourceName(ctx, cl, fl.runtime)
			if err != nil {
				return req, nil, err
			}
			req.Files = append(req.Files, client.NewFnFile(name, b, 0))
		}
	}
	for _, spec := range fl.files {
		p, dest := splitPair(spec)
		if dest == "" {
			dest = filepath.Base(p)
		}
		b, err := readInput(a, p)
		if err != nil {
			return req, nil, err
		}
		var mode uint32
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o111 != 0 {
			mode = 0o755
		}
		req.Files = append(req.Files, client.NewFnFile(dest, b, mode))
	}
	if fl.stdin != "" {
		b, err := readInput(a, fl.stdin)
		if err != nil {
			return req, nil, err
		}
		client.SetFnStdin(&req, b)
	}
	var expected [][]byte
	for _, spec := range fl.cases {
		in, out := splitPair(spec)
		if in == "-" || out == "-" {
			return req, nil, usagef("--case %q: cases are files, not stdin", spec)
		}
		stdin, err := readInput(a, in)
		if err != nil {
			return req, nil, err
		}
		var want []byte
		if out != "" {
			if want, err = readInput(a, out); err != nil {
				return req, nil, err
			}
		}
		req.Cases = append(req.Cases, client.NewFnCase(stdin, want))
		expected = append(expected, want)
	}
	return req, expected, nil
}

// splitPair splits A:B at its last colon, unless all of it names a file.
func splitPair(s string) (string, string) {
	if _, err := os.Stat(s); err == nil {
		return s, ""
	}
	if i := strings.LastIndexByte(s, ':'); i > 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// readInput reads a local file, or warren's stdin for "-"; failing to is a
// usage error.
func readInput(a *app, name string) ([]byte, error) {
	var b []byte
	var err error
	if name == "-" {
		b, err = io.ReadAll(a.stdin)
	} else {
		b, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, usagef("read %s: %v", name, err)
	}
	return b, nil
}

// fnSourceName asks the server for the file a runtime's source goes to.
func fnSourceName(ctx context.Context, cl *client.Client, runtime string) (string, error) {
	rts, err := cl.ListFnRuntimes(ctx)
	if err != nil {
		return "", err
	}
	for _, rt := range rts {
		if rt.Name == runtime && rt.Source != "" {
			return rt.Source, nil
		}
	}
	return "", usagef("runtime %q is not declared by any node (see 'warren fn runtimes')", runtime)
}

// fnFail reports a call that got no result and ends with its exit status.
func fnFail(ctx context.Context, a *app, err error) error {
	var ue usageError
	if errors.As(err, &ue) || ctx.Err() != nil {
		return err // run prints these
	}
	fmt.Fprintf(a.stderr, "warren: %s\n", a.describe(err))
	return exitError{fnErrorExit(err)}
}

// fnErrorExit is the exit status of a call the server refused or never
// answered: 2 when the caller can fix it, 3 when the platform could not
// run it.
func fnErrorExit(err error) int {
	switch {
	case client.IsInvalid(err), client.IsNotFound(err),
		client.IsUnauthenticated(err), client.IsForbidden(err):
		return 2
	}
	return exitFnNoVerdict
}

// fnExit is the exit status of a result: a SandboxError anywhere means no
// verdict, whatever the other cases say.
func fnExit(res *api.FnResult) int {
	if res.Status == api.FnSandboxError {
		return exitFnNoVerdict
	}
	for _, c := range res.Cases {
		if c.Status == api.FnSandboxError {
			return exitFnNoVerdict
		}
	}
	if res.Status == api.FnOK {
		return 0
	}
	return exitFnFailed
}

// printFnRun prints a single run as if the program had run here: its
// stdout and stderr, then a summary line on stderr.
func printFnRun(stdout, stderr io.Writer, res *api.FnResult) error {
	if res.Status == api.FnCompileError && res.Compile != nil {
		io.WriteString(stderr, res.Compile.Stdout)
		io.WriteString(stderr, res.Compile.Stderr)
		fmt.Fprintf(stderr, "warren: %s\n", summary(res.Status, *res.Compile))
		return nil
	}
	if len(res.Cases) == 0 {
		fmt.Fprintf(stderr, "warren: %s\n", res.Status)
		return nil
	}
	c := res.Cases[0]
	if _, err := io.WriteString(stdout, c.Stdout); err != nil {
		return err
	}
	io.WriteString(stderr, c.Stderr)
	reportTruncation(stderr, "stdout", c.StdoutTruncated, int64(len(c.Stdout)), c.StdoutBytes)
	reportTruncation(stderr, "stderr", c.StderrTruncated, int64(len(c.Stderr)), c.StderrBytes)
	fmt.Fprintf(stderr, "warren: %s\n", summary(c.Status, c))
	return nil
}

func summary(status string, c api.FnCaseResult) string {
	s := fmt.Sprintf("%s  cpu %s  wall %s  mem %s", status, fmtMs(c.CPUMs), fmtMs(c.WallMs), fmtBytes(c.PeakMemory))
	if x := exitNote(c); x != "" {
		s += "  " + x
	}
	if c.Message != "" {
		s += ": " + c.Message
	}
	return s
}

func exitNote(c api.FnCaseResult) string {
	switch {
	case c.Signal != "":
		return "signal " + c.Signal
	case c.ExitCode != 0 && c.Status != api.FnSandboxError && c.Status != api.FnSkipped:
		return "exit " + strconv.Itoa(c.ExitCode)
	}
	return ""
}

func fmtMs(ms int64) string {
	if ms < 1000 {
		return strconv.FormatInt(ms, 10) + "ms"
	}
	return strconv.FormatFloat(float64(ms)/1000, 'f', 2, 64) + "s"
}

// printFnCases prints a table of the cases, then what went wrong in each
// failed one, then the call's status.
func printFnCases(stdout, stderr io.Writer, res *api.FnResult, expected [][]byte, compare string) error {
	tw := newTable(stdout, "CASE", "STATUS", "EXIT", "CPU", "WALL", "MEMORY", "NOTE")
	caseRow := func(name string, c api.FnCaseResult) {
		if c.Status == api.FnSkipped {
			row(tw, name, c.Status, "-", "-", "-", "-", "")
			return
		}
		exit := strconv.Itoa(c.ExitCode)
		if c.Signal != "" {
			exit = c.Signal
		}
		row(tw, name, c.Status, exit, fmtMs(c.CPUMs), fmtMs(c.WallMs), fmtBytes(c.PeakMemory), oneLine(c.Message))
	}
	if res.Compile != nil {
		caseRow("compile", *res.Compile)
	}
	for i, c := range res.Cases {
		caseRow(strconv.Itoa(i+1), c)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if res.Status == api.FnCompileError && res.Compile != nil {
		fmt.Fprintln(stdout, "\ncompile output:")
		writeIndented(stdout, res.Compile.Stdout+res.Compile.Stderr, 20)
	}
	for i, c := range res.Cases {
		switch c.Status {
		case api.FnOK, api.FnSkipped:
			continue
		case api.FnWrongAnswer:
			var want []byte
			if i < len(expected) {
				want = expected[i]
			}
			fmt.Fprintf(stdout, "\ncase %d: %s\n", i+1, diffNote([]byte(c.Stdout), want, compare, c.StdoutTruncated))
		default:
			if c.Stderr != "" {
				fmt.Fprintf(stdout, "\ncase %d stderr:\n", i+1)
				writeIndented(stdout, c.Stderr, 5)
			}
		}
	}
	ok := 0
	for _, c := range res.Cases {
		if c.Status == api.FnOK {
			ok++
		}
	}
	fmt.Fprintf(stdout, "\n%s", res.Status)
	if len(res.Cases) > 0 {
		fmt.Fprintf(stdout, ": %d/%d cases OK", ok, len(res.Cases))
	}
	if res.Node != "" {
		fmt.Fprintf(stdout, " (node %s, %s)", res.Node, fmtMs(res.WallMs))
	}
	fmt.Fprintln(stdout)
	return nil
}

// diffNote says where got first differs from want, as the compare mode
// sees them.
func diffNote(got, want []byte, compare string, truncated bool) string {
	if want == nil {
		return "wrong answer"
	}
	split := func(b []byte) []string {
		lines := strings.Split(string(b), "\n")
		if compare == "exact" {
			return lines
		}
		for i, l := range lines {
			lines[i] = strings.TrimRight(l, " \t\r\f\v")
		}
		for len(lines) > 0 && lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		return lines
	}
	g, w := split(got), split(want)
	note := ""
	if truncated {
		note = " (stdout was truncated)"
	}
	for i := 0; i < len(g) || i < len(w); i++ {
		switch {
		case i >= len(g):
			return fmt.Sprintf("wrong answer at line %d: expected %s, got end of output%s", i+1, clip(w[i]), note)
		case i >= len(w):
			return fmt.Sprintf("wrong answer at line %d: expected end of output, got %s%s", i+1, clip(g[i]), note)
		case g[i] != w[i]:
			return fmt.Sprintf("wrong answer at line %d:\n  expected: %s\n  got:      %s%s", i+1, clip(w[i]), clip(g[i]), note)
		}
	}
	if !bytes.Equal(got, want) {
		return "wrong answer: output differs from expected in whitespace only" + note
	}
	return "wrong answer" + note
}

// clip quotes a line, cut to a readable length.
func clip(s string) string {
	const n = 70
	if len(s) > n {
		return strconv.Quote(s[:n]) + "..."
	}
	return strconv.Quote(s)
}

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	return s
}

// writeIndented writes at most the last max lines of s, indented.
func writeIndented(w io.Writer, s string, max int) {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > max {
		fmt.Fprintf(w, "  ... (%d lines before)\n", len(lines)-max)
		lines = lines[len(lines)-max:]
	}
	for _, l := range lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// encodeFnResult puts output that is not UTF-8 back in base64, as the
// server sent it, so that -o json is lossless.
func encodeFnResult(res api.FnResult) api.FnResult {
	enc := func(c *api.FnCaseResult) {
		if !utf8.ValidString(c.Stdout) {
			c.Stdout, c.StdoutEncoding = base64.StdEncoding.EncodeToString([]byte(c.Stdout)), api.EncodingBase64
		}
		if !utf8.ValidString(c.Stderr) {
			c.Stderr, c.StderrEncoding = base64.StdEncoding.EncodeToString([]byte(c.Stderr)), api.EncodingBase64
		}
	}
	if res.Compile != nil {
		c := *res.Compile
		enc(&c)
		res.Compile = &c
	}
	res.Cases = append([]api.FnCaseResult{}, res.Cases...)
	for i := range res.Cases {
		enc(&res.Cases[i])
	}
	return res
}

func newFnRuntimesCmd(a *app) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:     "runtimes",
		Aliases: []string{"runtime", "rt"},
		Short:   "List the FnCall runtimes the nodes declare, with their pools",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out, outDefault, "table", outJSON); err != nil {
				return err
			}
			rts, err := a.client().ListFnRuntimes(cmd.Context())
			if err != nil {
				return err
			}
			if out == outJSON {
				return writeJSON(a.stdout, api.FnRuntimeList{Runtimes: nonNil(rts)})
			}
			return printRuntimes(a.stdout, rts)
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "output: table (default) or json")
	return c
}

func printRuntimes(w io.Writer, rts []api.FnRuntime) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	row(tw, "NAME", "AVAILABLE", "READY", "BUSY", "POOL", "ENV", "ROOT", "SOURCE", "COMPILE", "RUN")
	for _, rt := range rts {
		avail := "yes"
		if !rt.Available {
			avail = "no"
			if rt.Reason != "" {
				avail += ": " + oneLine(rt.Reason)
			}
		}
		row(tw, rt.Name, avail, strconv.Itoa(rt.Ready), strconv.Itoa(rt.Busy),
			fmt.Sprintf("%d..%d", rt.PoolMin, rt.PoolMax), orDash(rt.Env), orDash(rt.Root), orDash(rt.Source),
			orDash(strings.Join(rt.Compile, " ")), orDash(strings.Join(rt.Run, " ")))
	}
	return tw.Flush()
}
