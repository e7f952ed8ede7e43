package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// newSandboxSnapshotCmd is `warren sandbox snapshot SBX`.
func newSandboxSnapshotCmd(a *app) *cobra.Command {
	var req api.SnapshotRequest
	var labels []string
	c := showCmd(a, &cobra.Command{
		Use:   "snapshot SBX [--name NAME] [--version V] [--strip PATH]... [--keep-residue] [--label K=V]...",
		Short: "Turn what a running sandbox wrote into an environment (it runs on)",
		Long: `Snapshot a running sandbox: what it wrote becomes a diff layer on top of
its own layers, and the stack an environment NAME@V that sandboxes on any
node can be created from (warren sandbox create --image NAME@V). The
sandbox is held still only while its writes are copied (freeze), then runs
on. --strip leaves a path out, with everything under it, even where a lower
layer has it (answers, data a builder must not ship). Build residue is left
out too, where the sandbox wrote it: shell and REPL histories, ~/.cache and
package managers' caches, the contents of /tmp and /var/tmp (the result's
stats.residue lists it); --keep-residue keeps it.`,
		Args: exactArgs(1, "one sandbox id"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.Snapshot, error) {
		var err error
		if req.Labels, err = parseKVs("label", labels, a.getenv, false); err != nil {
			return nil, err
		}
		return a.client().Snapshot(cmd.Context(), args[0], req)
	}, printSnapshot)
	f := c.Flags()
	f.StringVar(&req.Name, "name", "", "environment name (default: the snapshot's id)")
	f.StringVar(&req.Version, "version", "", "environment version (default: the next integer version)")
	f.StringArrayVar(&req.Strip, "strip", nil, "absolute path to leave out (repeatable)")
	f.BoolVar(&req.KeepResidue, "keep-residue", false, "keep shell histories, caches and temp files")
	f.BoolVar(&req.WithProcesses, "with-processes", false, "the running processes too (CRIU; no node takes these yet: the error says why, node ls -o json too)")
	f.StringArrayVar(&labels, "label", nil, "label KEY=VALUE on the snapshot (repeatable)")
	return c
}

// newSandboxForkCmd is `warren sandbox fork SBX --count N`.
func newSandboxForkCmd(a *app) *cobra.Command {
	var (
		req    api.ForkRequest
		labels []string
		output string
	)
	c := &cobra.Command{
		Use:   "fork SBX [--count N] [--label K=V]... [--all-or-none]",
		Short: "Make sandboxes from a running sandbox's state now (it runs on)",
		Long: `Fork a running sandbox: a snapshot of what it wrote, then --count new
sandboxes from it, a gang (--all-or-none: all of them or none), each
isolated from the others and from the parent, which runs on. The branches
get the parent's backend, resources, network policy, TTL, labels and these
labels, and warren.dev/fork-of and warren.dev/snapshot; they go to the
parent's node when it has room. Prints their ids, one a line.`,
		Example: `  warren sandbox fork $SBX --count 8 --label branch=b   # 8 branches from step k`,
		Args:    exactArgs(1, "one sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outID, outJSON); err != nil {
				return err
			}
			var err error
			if req.Labels, err = parseKVs("label", labels, a.getenv, false); err != nil {
				return err
			}
			res, err := a.client().Fork(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			var v any = res
			if output != outJSON {
				v = nil
			}
			return a.printGang(v, &res.BatchCreateResponse, max(req.Count, 1))
		},
	}
	f := c.Flags()
	f.BoolVar(&req.WithProcesses, "with-processes", false, "the branches continue the parent's processes (CRIU; no node takes these yet)")
	f.IntVar(&req.Count, "count", 1, "how many sandboxes")
	f.BoolVar(&req.AllOrNone, "all-or-none", false, "make all of them or none")
	f.StringArrayVar(&labels, "label", nil, "label KEY=VALUE on the branches (repeatable)")
	f.StringVarP(&output, "output", "o", "", "output: id (default) or json")
	return c
}

// newSnapshotCmd is `warren snapshot ls|get`.
func newSnapshotCmd(a *app) *cobra.Command {
	snap := &cobra.Command{Use: "snapshot", Aliases: []string{"snapshots", "snap"}, Short: "List and show sandbox snapshots"}
	snap.AddCommand(newSnapshotLsCmd(a), newSnapshotGetCmd(a), newSnapshotRmCmd(a), newSnapshotLineageCmd(a))
	return snap
}

func newSnapshotLsCmd(a *app) *cobra.Command {
	var source string
	c := showCmd(a, &cobra.Command{
		Use:     "ls [--source SBX]",
		Aliases: []string{"list"},
		Short:   "List snapshots, oldest first",
		Args:    exactArgs(0, "no arguments"),
	}, "table", func(cmd *cobra.Command, args []string) (api.SnapshotList, error) {
		list, err := a.client().ListSnapshots(cmd.Context(), source)
		return api.SnapshotList{Snapshots: nonNil(list)}, err
	}, func(w io.Writer, list api.SnapshotList) error {
		now := time.Now()
		tw := newTable(w, "ID", "ENVIRONMENT", "SOURCE", "DIFF", "FREEZE", "CREATED")
		for _, s := range list.Snapshots {
			row(tw, s.ID, s.Ref, s.Source, fmtBytes(s.Layer.Size), fmt.Sprintf("%.1fms", s.Stats.FreezeMS), age(s.CreatedAt, now))
		}
		return tw.Flush()
	})
	c.Flags().StringVar(&source, "source", "", "only the snapshots of this sandbox")
	return c
}

func newSnapshotGetCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:     "get SNAP",
		Aliases: []string{"inspect"},
		Short:   "Show one snapshot (by id or NAME@VERSION)",
		Args:    exactArgs(1, "one snapshot id or NAME@VERSION"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.Snapshot, error) {
		return a.client().GetSnapshot(cmd.Context(), args[0])
	}, printSnapshot)
}

func newSnapshotRmCmd(a *app) *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:     "rm SNAP [SNAP...] [--force]",
		Aliases: []string{"delete", "remove"},
		Short:   "Remove snapshots with their environments (refused while others build on one, unless --force)",
		Args:    minArgs(1, "one or more snapshot ids or NAME@VERSIONs"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var failed int
			for _, ref := range args {
				if err := a.client().DeleteSnapshot(cmd.Context(), ref, force); err != nil {
					fmt.Fprintf(a.stderr, "warren: %s: %v\n", ref, err)
					failed++
					continue
				}
				fmt.Fprintln(a.stdout, ref)
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d not removed", failed, len(args))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&force, "force", false, "remove even what live sandboxes or other snapshots build on (their layers stay)")
	return c
}

func newSnapshotLineageCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:   "lineage SBX|SNAP",
		Short: "Show where a snapshot or sandbox comes from and everything made from it",
		Args:  exactArgs(1, "one sandbox id, snapshot id or NAME@VERSION"),
	}, "tree", func(cmd *cobra.Command, args []string) (*api.Lineage, error) {
		return a.client().Lineage(cmd.Context(), args[0])
	}, func(w io.Writer, l *api.Lineage) error {
		now := time.Now()
		fmt.Fprintf(w, "%s\n", orDash(l.Base))
		indent := "  "
		for _, s := range l.Ancestors {
			fmt.Fprintf(w, "%s└ %s\n", indent, snapshotLine(&s, now))
			indent += "  "
		}
		var walk func(n api.LineageNode, indent string)
		walk = func(n api.LineageNode, indent string) {
			if n.Snapshot != nil {
				fmt.Fprintf(w, "%s└ %s\n", indent, snapshotLine(n.Snapshot, now))
			} else if n.Sandbox != nil {
				sb := n.Sandbox
				what := "sandbox"
				if sb.Labels[api.LabelForkOf] != "" {
					what = "fork of " + sb.Labels[api.LabelForkOf]
				}
				fmt.Fprintf(w, "%s└ %s %s (%s, %s, created %s ago)\n", indent, what, sb.ID, sb.State, sb.Image, age(sb.CreatedAt, now))
			}
			for _, c := range n.Children {
				walk(c, indent+"  ")
			}
		}
		walk(l.Root, indent)
		return nil
	})
}

func snapshotLine(s *api.Snapshot, now time.Time) string {
	line := fmt.Sprintf("snapshot %s = %s of %s", s.ID, s.Ref, s.Source)
	if len(s.Labels) > 0 {
		line += " [" + kvList(s.Labels, ",") + "]"
	}
	if s.CreatedBy != "" {
		line += " by " + s.CreatedBy
	}
	return line + ", " + age(s.CreatedAt, now) + " ago"
}

func printSnapshot(w io.Writer, s *api.Snapshot) error {
	st := s.Stats
	tw := newTable(w, "Snapshot:", s.ID)
	row(tw, "Environment:", s.Ref)
	row(tw, "Source:", fmt.Sprintf("%s (from %s)", s.Source, orDash(s.SourceImage)))
	if s.Parent != "" {
		row(tw, "Parent:", s.Parent)
	}
	row(tw, "Diff layer:", fmt.Sprintf("%s (%s, %s)", s.Layer.Ref, fmtBytes(s.Layer.Size), s.Layer.Digest))
	row(tw, "Written:", fmt.Sprintf("%d files, %s", st.Files, fmtBytes(st.Bytes)))
	row(tw, "Freeze:", fmt.Sprintf("%.1fms (%s)", st.FreezeMS, st.Method))
	row(tw, "Pack:", fmt.Sprintf("%.1fms, %d of %d chunks new (%s)", st.PackMS, st.Uploaded, st.Chunks, fmtBytes(st.UploadedBytes)))
	if len(st.Residue) > 0 {
		row(tw, "Residue left out:", strings.Join(st.Residue, " "))
	}
	row(tw, "Labels:", kvList(s.Labels, ", "))
	row(tw, "Created:", stamp(s.CreatedAt, time.Now()))
	return tw.Flush()
}
