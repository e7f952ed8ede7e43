package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// newSandboxPauseCmd is `warren sandbox pause` (resume false) and `warren
// sandbox resume` (true): by id, or every sandbox carrying --label, across
// nodes.
func newSandboxPauseCmd(a *app, resume bool) *cobra.Command {
	verb, what := "pause", "Pause sandboxes: processes frozen, memory pushed out, clocks stopped"
	if resume {
		verb, what = "resume", "Resume paused sandboxes (any call on one resumes it too)"
	}
	var (
		labels  []string
		project string
		output  string
	)
	c := &cobra.Command{
		Use:   verb + " (SBX... | --label K=V... [--project P])",
		Short: what,
		Long: what + `.

A paused sandbox's processes are frozen and its memory is pushed out to
swap where the node has some (file pages in any case); its TTL and idle
timeout stand still, and it holds of its node only its memory at the
paused size. Any call on it (exec, files, ports, snapshot) resumes it
first: callers see only latency. With --label (and --project), every
matching sandbox is paused or resumed, across nodes, with a count per
node.`,
		Example: "  warren sandbox " + verb + " $SBX\n  warren sandbox " + verb + " --label run=exp-17",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			if len(args) > 0 {
				if len(labels) > 0 || project != "" {
					return usagef("give sandbox ids or --label/--project, not both")
				}
				return a.pauseEach(cmd.Context(), args, resume, output)
			}
			if len(labels) == 0 && project == "" {
				return usagef("%s takes sandbox ids, or --label (and --project)", cmd.CommandPath())
			}
			sel := api.PauseSelector{Project: project}
			var err error
			if sel.Labels, err = parseKVs("label", labels, a.getenv, false); err != nil {
				return err
			}
			return a.pauseBulk(cmd.Context(), sel, resume, output)
		},
	}
	f := c.Flags()
	f.StringArrayVar(&labels, "label", nil, "every sandbox with label KEY=VALUE (repeatable: all must match)")
	f.StringVar(&project, "project", "", "only in this project's subtree (default: the token's scope)")
	f.StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
}

// newProjectPauseCmd is `warren project pause|resume PATH`: every sandbox
// in the project's subtree, e.g. when its trainer is preempted.
func newProjectPauseCmd(a *app, resume bool) *cobra.Command {
	verb := "pause"
	if resume {
		verb = "resume"
	}
	var output string
	c := &cobra.Command{
		Use:     verb + " PATH",
		Short:   strings.ToUpper(verb[:1]) + verb[1:] + " every sandbox in a project's subtree, across nodes",
		Example: "  warren project " + verb + " research/rl-math",
		Args:    exactArgs(1, "one project path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			return a.pauseBulk(cmd.Context(), api.PauseSelector{Project: args[0]}, resume, output)
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
}

func (a *app) pauseEach(ctx context.Context, ids []string, resume bool, output string) error {
	cl := a.client()
	f := cl.PauseSandbox
	if resume {
		f = cl.ResumeSandbox
	}
	failed := 0
	var out []*api.Sandbox
	for _, id := range ids {
		start := time.Now()
		sb, err := f(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fmt.Fprintf(a.stderr, "warren: %s: %s\n", id, a.describe(err))
			failed++
			continue
		}
		if output == outJSON {
			out = append(out, sb)
			continue
		}
		printPaused(a.stdout, sb, time.Since(start))
	}
	if output == outJSON {
		if err := writeJSON(a.stdout, out); err != nil {
			return err
		}
	}
	if failed > 0 {
		return exitError{1}
	}
	return nil
}

// printPaused is one line per sandbox: its state and what its pause did.
func printPaused(w io.Writer, sb *api.Sandbox, took time.Duration) {
	if sb.State != api.StatePaused || sb.Pause == nil {
		fmt.Fprintf(w, "%s\t%s\t(%s)\n", sb.ID, sb.State, took.Round(time.Millisecond))
		return
	}
	p := sb.Pause
	fmt.Fprintf(w, "%s\tpaused\tmemory %s -> %s (%s), frozen in %.1fms\n", sb.ID,
		fmtBytes(p.MemoryBefore), fmtBytes(p.MemoryAfter), p.Reclaim, p.FreezeMS)
}

func (a *app) pauseBulk(ctx context.Context, sel api.PauseSelector, resume bool, output string) error {
	verb := "paused"
	if resume {
		verb = "resumed"
	}
	start := time.Now()
	tty := isTerminal(a.stderr)
	drawn := time.Time{}
	res, err := a.client().PauseSandboxesProgress(ctx, sel, resume, func(done, total int) {
		if tty && (done == total || time.Since(drawn) > 100*time.Millisecond) {
			drawn = time.Now()
			fmt.Fprintf(a.stderr, "\r%s %d of %d\x1b[K", verb, done, total)
		}
	})
	if tty && !drawn.IsZero() {
		fmt.Fprintln(a.stderr)
	}
	if err != nil {
		return err
	}
	if output == outJSON {
		return writeJSON(a.stdout, res)
	}
	nodes := make([]string, 0, len(res.Nodes))
	done, failed := 0, 0
	for n, c := range res.Nodes {
		nodes = append(nodes, n)
		done += c.Done
		failed += c.Failed
	}
	sort.Strings(nodes)
	tw := newTable(a.stdout, "NODE", strings.ToUpper(verb), "FAILED")
	for _, n := range nodes {
		row(tw, n, fmt.Sprint(res.Nodes[n].Done), fmt.Sprint(res.Nodes[n].Failed))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, it := range res.Sandboxes {
		if it.Error != nil {
			fmt.Fprintf(a.stderr, "warren: %s: %s (%s)\n", it.ID, it.Error.Message, it.Error.Code)
		}
	}
	fmt.Fprintf(a.stdout, "%d sandbox(es) %s on %d node(s) in %s\n", done, verb, len(nodes), time.Since(start).Round(time.Millisecond))
	if failed > 0 {
		return exitError{1}
	}
	return nil
}

// newSandboxUpdateCmd is `warren sandbox update SBX`.
func newSandboxUpdateCmd(a *app) *cobra.Command {
	var (
		ttl, idle, autoPause time.Duration
		labels, unlabels     []string
		output               string
	)
	c := &cobra.Command{
		Use:   "update SBX [--ttl D] [--idle-timeout D] [--auto-pause D] [--label K=V]... [--unlabel K]...",
		Short: "Change a live sandbox's TTL (from now), idle timeout, auto-pause or labels",
		Example: `  warren sandbox update $SBX --ttl 2h          # it ends 2h from now
  warren sandbox update $SBX --idle-timeout 0   # no idle timeout any more`,
		Args: exactArgs(1, "one sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outID, outJSON); err != nil {
				return err
			}
			var u api.SandboxUpdate
			fl := cmd.Flags()
			dur := func(name string, d time.Duration) *api.Duration {
				if !fl.Changed(name) {
					return nil
				}
				v := api.Duration(d)
				return &v
			}
			u.TTL, u.IdleTimeout, u.AutoPause = dur("ttl", ttl), dur("idle-timeout", idle), dur("auto-pause", autoPause)
			set, err := parseKVs("label", labels, a.getenv, false)
			if err != nil {
				return err
			}
			if len(set) > 0 || len(unlabels) > 0 {
				u.Labels = map[string]*string{}
				for k, v := range set {
					u.Labels[k] = &v
				}
				for _, k := range unlabels {
					u.Labels[k] = nil
				}
			}
			if u.TTL == nil && u.IdleTimeout == nil && u.AutoPause == nil && u.Labels == nil {
				return usagef("nothing to update: give --ttl, --idle-timeout, --auto-pause, --label or --unlabel")
			}
			sb, err := a.client().UpdateSandbox(cmd.Context(), args[0], u)
			if err != nil {
				return err
			}
			if output == outJSON {
				return writeJSON(a.stdout, sb)
			}
			fmt.Fprintln(a.stdout, sb.ID)
			return nil
		},
	}
	f := c.Flags()
	f.DurationVar(&ttl, "ttl", 0, "the sandbox ends this long from now")
	f.DurationVar(&idle, "idle-timeout", 0, "delete after this long without use (0: never)")
	f.DurationVar(&autoPause, "auto-pause", 0, "pause after this long without use (0: never)")
	f.StringArrayVar(&labels, "label", nil, "set label KEY=VALUE (repeatable)")
	f.StringArrayVar(&unlabels, "unlabel", nil, "remove label KEY (repeatable)")
	f.StringVarP(&output, "output", "o", "", "output: id (default) or json")
	return c
}

// newSandboxJournalCmd is `warren sandbox journal SBX`.
func newSandboxJournalCmd(a *app) *cobra.Command {
	var (
		since  int64
		output string
	)
	c := &cobra.Command{
		Use:   "journal SBX [--since SEQ] [-o json]",
		Short: "Every exec and file call on a sandbox and its result, in order",
		Long: `Print a sandbox's journal: every call on it its node recorded (exec, file
transfers, pause, resume, update, snapshot), in order, with when it started,
how long it took, how it ended, and for an exec the first and last bytes of
its output. The node keeps the newest ` + strconv.Itoa(api.MaxJournalEntries) + ` calls, across agent restarts;
a trainer that comes back rebuilds its rollouts' state from it.`,
		Args: exactArgs(1, "one sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			j, err := a.client().Journal(cmd.Context(), args[0], since)
			if err != nil {
				return err
			}
			if output == outJSON {
				return writeJSON(a.stdout, j)
			}
			if j.Dropped > 0 && since < j.Dropped {
				fmt.Fprintf(a.stdout, "(%d earlier entries no longer kept)\n", j.Dropped)
			}
			tw := newTable(a.stdout, "SEQ", "TIME", "VERB", "WHAT", "TOOK", "RESULT")
			for _, e := range j.Entries {
				row(tw, fmt.Sprint(e.Seq), e.Time.Local().Format("15:04:05.000"), e.Verb, journalWhat(e),
					fmt.Sprintf("%.1fms", e.DurationMS), journalResult(e))
			}
			return tw.Flush()
		},
	}
	c.Flags().Int64Var(&since, "since", 0, "only entries after this sequence number")
	c.Flags().StringVarP(&output, "output", "o", "", "output: table (default) or json")
	return c
}

func journalWhat(e api.JournalEntry) string {
	switch {
	case e.Cmd != "":
		return clipTo(e.Cmd, 60)
	case len(e.Argv) > 0:
		return clipTo(strings.Join(e.Argv, " "), 60)
	case e.Path != "":
		return e.Path
	case e.By != "":
		return "by " + e.By
	}
	return "-"
}

func journalResult(e api.JournalEntry) string {
	switch {
	case e.Error != nil:
		return "error: " + e.Error.Code
	case e.TimedOut:
		return "timed out"
	case e.Signal != "":
		return "killed by " + e.Signal
	case e.ExitCode != nil:
		return fmt.Sprintf("exit %d (%s out, %s err)", *e.ExitCode, fmtBytes(e.StdoutBytes), fmtBytes(e.StderrBytes))
	case e.Bytes > 0:
		return "ok, " + fmtBytes(e.Bytes)
	}
	return "ok"
}

// clipTo shortens s to n bytes, marking the cut.
func clipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
