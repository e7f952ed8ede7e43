package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

func newSandboxCreateCmd(a *app) *cobra.Command {
	var (
		req              api.CreateSandboxRequest
		memory, output   string
		disk             string
		labels, env      []string
		selector         []string
		ttl, idle        time.Duration
		autoPause        time.Duration
		count            int
		allOrNone, build bool
		network          networkFlags
		diskImage        string
	)
	c := &cobra.Command{
		Use:   "create (--image ENV | --env ENV@VERSION | --layer LAYER...) [flags]",
		Short: "Create a sandbox and print its id",
		Long: `Create a sandbox and print its id. Its root filesystem is an environment
(--image NAME for the latest version, --image or --env NAME@VERSION for one)
or an explicit stack of layers (--layer, repeated, bottom first).

--env takes both environment variables (KEY=VALUE, or KEY to pass the local
value) and, when its value has an "@" and no "=", the environment to start from.`,
		Example: `  warren sandbox create --image busybox --cpu 1 --memory 256Mi --ttl 30m --label task=demo
  warren sandbox create --image busybox --disk 10Gi       # writes past 10Gi fail with EDQUOT
  warren sandbox create --env swe-task-0042@1 --env DEBUG=1
  warren sandbox create --layer debian-python@12 --layer harness@7
  warren sandbox create --image busybox --node-selector rack=r1 --pool cloud
  warren sandbox create --image swe@1 --allow pypi.org --allow '*.pythonhosted.org' --allow 198.51.100.0/24:443
  warren sandbox create --image web@1 --network open
  warren sandbox create --image busybox --runtime gvisor  # gVisor's kernel in user space; no network
  warren sandbox create --backend microvm --image swe-task-0042@1 --cpu 1 --memory 512Mi  # a QEMU machine of its own
  warren sandbox create --backend vm --disk-image desktop@1 --memory 2Gi  # a whole machine with a screen
  id=$(warren sandbox create --image busybox)
  warren sandbox create --image busybox --count 16 --all-or-none   # a gang: 16 ids, or none`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outID, outJSON); err != nil {
				return err
			}
			var vars []string
			for _, e := range env {
				if !strings.Contains(e, "=") && strings.Contains(e, "@") {
					if req.Image != "" {
						return usagef("give one environment: --image or --env NAME@VERSION")
					}
					req.Image = e
					continue
				}
				vars = append(vars, e)
			}
			env = vars
			if diskImage != "" {
				// A disk image boots whole on a vm.
				if req.Image != "" || len(req.Layers) > 0 {
					return usagef("give --disk-image or --image, not both")
				}
				if req.Backend == "" {
					req.Backend = api.BackendVM
				}
				if req.Backend != api.BackendVM {
					return usagef("--disk-image boots with --backend vm")
				}
				req.Image = diskImage
			}
			switch {
			case req.Image == "" && len(req.Layers) == 0:
				return usagef("--image is required (or --env NAME@VERSION, or --layer)")
			case req.Image != "" && len(req.Layers) > 0:
				return usagef("give an environment or layers, not both")
			}
			if memory != "" {
				q, err := api.ParseQuantity(memory)
				if err != nil {
					return usagef("--memory: %v", err)
				}
				req.Resources.Memory = q
			}
			if disk != "" {
				q, err := api.ParseQuantity(disk)
				if err != nil {
					return usagef("--disk: %v", err)
				}
				req.Resources.Disk = q
			}
			if ttl < 0 || idle < 0 {
				return usagef("--ttl and --idle-timeout must not be negative")
			}
			if autoPause < 0 {
				return usagef("--auto-pause must not be negative")
			}
			req.TTL, req.IdleTimeout, req.AutoPause = api.Duration(ttl), api.Duration(idle), api.Duration(autoPause)
			if cmd.Flags().Changed("build") {
				req.Build = &build
			}
			var err error
			if req.Network, err = network.policy(); err != nil {
				return err
			}
			if req.Labels, err = parseKVs("label", labels, a.getenv, false); err != nil {
				return err
			}
			if req.Env, err = parseKVs("env", env, a.getenv, true); err != nil {
				return err
			}
			if req.NodeSelector, err = parseKVs("node-selector", selector, a.getenv, false); err != nil {
				return err
			}
			if count < 1 {
				return usagef("--count must be at least 1")
			}
			if count > 1 || allOrNone {
				if req.IdempotencyKey != "" {
					return usagef("--idempotency-key does not apply to --count")
				}
				res, err := a.client().CreateSandboxes(cmd.Context(), api.BatchCreateRequest{Count: count, Template: req, AllOrNone: allOrNone})
				if err != nil {
					return err
				}
				var v any = res
				if output != outJSON {
					v = nil
				}
				return a.printGang(v, res, count)
			}
			sb, err := a.client().CreateSandbox(cmd.Context(), req)
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
	f.StringVar(&req.Image, "image", "", "environment to start from: NAME (latest version) or NAME@VERSION")
	f.StringVar(&diskImage, "disk-image", "", "a disk image imported with 'image import qcow2:FILE', booted whole (implies --backend vm)")
	f.StringArrayVar(&req.Layers, "layer", nil, "layer NAME[@VERSION] to stack, bottom first (repeatable; instead of an environment)")
	f.StringVar(&req.Backend, "backend", "", "backend: container, fncall, microvm or vm (server default: container)")
	f.StringVar(&req.Runtime, "runtime", "", "container runtime: runc (default) or gvisor (a kernel in user space: no network, limits hold for the whole sandbox)")
	f.StringVar(&req.Project, "project", "", "project to create it in and count it against (default: the token's own)")
	f.StringVar(&req.IdempotencyKey, "idempotency-key", "", "retrying with the same key returns the same sandbox instead of a second one")
	f.Float64Var(&req.Resources.CPU, "cpu", 0, "CPU cores, e.g. 0.5 (server default when 0)")
	f.StringVar(&req.QoS, "qos", "", "QoS class: latency (default) or best-effort (runs under SCHED_IDLE, yielding the CPU to latency work; paused or evicted first under memory pressure)")
	f.StringVar(&memory, "memory", "", "memory limit, e.g. 256Mi or 1G")
	f.Int64Var(&req.Resources.PIDs, "pids", 0, "process and thread limit")
	f.StringVar(&disk, "disk", "", "writable layer limit, e.g. 10Gi (node default when empty; refused where the node cannot enforce it)")
	f.Int64Var(&req.Resources.DiskInodes, "disk-inodes", 0, "file count limit of the writable layer (default with --disk: one per 16Ki, on xfs and ext4 nodes)")
	f.DurationVar(&ttl, "ttl", 0, "lifetime, e.g. 30m (server default when 0)")
	f.DurationVar(&idle, "idle-timeout", 0, "destroy after this long without use (0: never)")
	f.DurationVar(&autoPause, "auto-pause", 0, "pause (not destroy) after this long without use (0: never)")
	f.BoolVar(&req.TTLWhilePaused, "ttl-while-paused", false, "let the TTL run on while the sandbox is paused (by default paused time does not count)")
	f.StringArrayVar(&labels, "label", nil, "label KEY=VALUE (repeatable)")
	f.StringArrayVar(&selector, "node-selector", nil, "place only on nodes with label KEY=VALUE (repeatable: every one must match)")
	f.StringVar(&req.Pool, "pool", "", "place only in this node pool: onprem or cloud (no spill to the other)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE, or KEY to pass the local value (repeatable); NAME@VERSION picks the environment")
	f.StringVarP(&output, "output", "o", "", "output: id (default) or json")
	f.IntVar(&count, "count", 1, "create a gang of this many sandboxes (one id a line), labelled "+api.LabelGang)
	f.BoolVar(&allOrNone, "all-or-none", false, "with --count: create all of them or none")
	f.BoolVar(&req.Worker, "worker", false, "a rollout worker: pausing it pauses the sandboxes it drives (--worker-of), resuming it resumes them")
	f.StringVar(&req.WorkerOf, "worker-of", "", "the worker sandbox that drives this one")
	f.BoolVar(&build, "build", false, "a build sandbox, hidden from runners (default: yes with a builder token; --build=false for an ordinary one)")
	network.register(c)
	return c
}

func newSandboxLsCmd(a *app) *cobra.Command {
	var (
		labels  []string
		state   string
		project string
		output  string
	)
	c := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON, outID); err != nil {
				return err
			}
			lm, err := parseKVs("label", labels, a.getenv, false)
			if err != nil {
				return err
			}
			list, err := a.client().ListSandboxes(cmd.Context(), client.ListOptions{Labels: lm, State: state, Project: project})
			if err != nil {
				return err
			}
			switch output {
			case outJSON:
				if list == nil {
					list = []api.Sandbox{}
				}
				return writeJSON(a.stdout, api.SandboxList{Sandboxes: list})
			case outID:
				for _, sb := range list {
					fmt.Fprintln(a.stdout, sb.ID)
				}
				return nil
			}
			now := time.Now()
			tw := newTable(a.stdout, "ID", "PROJECT", "IMAGE", "STATE", "CPU", "MEMORY", "AGE", "LABELS")
			for _, sb := range list {
				row(tw, sb.ID, displayPath(sb.Project), sb.Image, sb.State, fmtCPU(sb.Resources.CPU), orDash(memString(sb.Resources.Memory)),
					age(sb.CreatedAt, now), kvList(sb.Labels, ","))
			}
			return tw.Flush()
		},
	}
	f := c.Flags()
	f.StringArrayVar(&labels, "label", nil, "only sandboxes with label KEY=VALUE (repeatable; all must match)")
	f.StringVar(&state, "state", "", "only sandboxes in this state (creating, running, paused, stopping, stopped, failed, lost)")
	f.StringVar(&project, "project", "", "only sandboxes in this project's subtree (default: all the token may see)")
	f.StringVarP(&output, "output", "o", "", "output: table (default), json or id")
	return c
}

func memString(q api.Quantity) string {
	if q == 0 {
		return ""
	}
	return q.String()
}

func newSandboxGetCmd(a *app) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:     "get SBX",
		Aliases: []string{"inspect"},
		Short:   "Show one sandbox",
		Args:    exactArgs(1, "one sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			sb, err := a.client().GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == outJSON {
				return writeJSON(a.stdout, sb)
			}
			now := time.Now()
			tw := newTable(a.stdout, "ID:", sb.ID)
			row(tw, "Node:", sb.Node)
			row(tw, "Project:", displayPath(sb.Project))
			if sb.Build {
				row(tw, "Build:", "yes (hidden from runners)")
			}
			row(tw, "Backend:", sb.Backend)
			if sb.Runtime != "" {
				row(tw, "Runtime:", sb.Runtime)
			}
			row(tw, "Image:", sb.Image)
			if len(sb.Layers) > 0 {
				row(tw, "Layers:", strings.Join(sb.Layers, ", "))
			}
			if sb.Workdir != "" {
				row(tw, "Workdir:", sb.Workdir)
			}
			if sb.User != "" {
				row(tw, "User:", sb.User)
			}
			row(tw, "State:", sb.State)
			if p := sb.Pause; p != nil && sb.State == api.StatePaused && sb.PausedAt != nil {
				row(tw, "Paused:", fmt.Sprintf("%s by %s: memory %s -> %s (%s), frozen in %.1fms", stamp(*sb.PausedAt, now), p.By,
					fmtBytes(p.MemoryBefore), fmtBytes(p.MemoryAfter), p.Reclaim, p.FreezeMS))
			}
			if sb.Reason != "" {
				row(tw, "Reason:", sb.Reason)
			}
			row(tw, "CPU:", fmtCPU(sb.Resources.CPU))
			row(tw, "Memory:", orDash(memString(sb.Resources.Memory)))
			if sb.Resources.PIDs > 0 {
				row(tw, "PIDs:", fmt.Sprint(sb.Resources.PIDs))
			}
			if sb.Resources.Disk > 0 {
				d := sb.Resources.Disk.String()
				if sb.Resources.DiskInodes > 0 {
					d += fmt.Sprintf(" (%d inodes)", sb.Resources.DiskInodes)
				}
				row(tw, "Disk:", d)
			}
			if n := sb.Network; n != nil {
				net := n.Mode
				if n.Mode == api.NetworkAllowlist {
					net += " " + orDash(strings.Join(n.Allow, ", "))
				}
				row(tw, "Network:", net)
				row(tw, "Address:", orDash(n.Address))
				row(tw, "Denied:", fmt.Sprintf("%d connections, %d DNS queries", n.DeniedConnections, n.DeniedQueries))
			} else {
				row(tw, "Network:", api.NetworkNone)
			}
			row(tw, "TTL:", durOrDash(sb.TTL))
			row(tw, "Idle timeout:", durOrDash(sb.IdleTimeout))
			row(tw, "Labels:", kvList(sb.Labels, ", "))
			row(tw, "Env:", kvList(sb.Env, ", "))
			row(tw, "Created:", stamp(sb.CreatedAt, now))
			row(tw, "Last used:", stamp(sb.LastUsedAt, now))
			if sb.ExpiresAt != nil {
				row(tw, "Expires:", sb.ExpiresAt.Local().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
}

func durOrDash(d api.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.String()
}

// printGang prints a gang's members' ids, one a line (or v as JSON when
// not nil), and each member's error; an error if any was not made.
func (a *app) printGang(v any, res *api.BatchCreateResponse, count int) error {
	if v != nil {
		if err := writeJSON(a.stdout, v); err != nil {
			return err
		}
	} else {
		for _, sb := range res.Sandboxes {
			fmt.Fprintln(a.stdout, sb.ID)
		}
	}
	for _, e := range res.Errors {
		fmt.Fprintf(a.stderr, "warren: member %d: %s (%s)\n", e.Index, e.Error.Message, e.Error.Code)
	}
	if len(res.Errors) > 0 {
		return fmt.Errorf("%d of %d sandboxes not created", len(res.Errors), count)
	}
	return nil
}

func stamp(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s ago)", t.Local().Format(time.RFC3339), age(t, now))
}

func newSandboxRmCmd(a *app) *cobra.Command {
	var (
		all     bool
		labels  []string
		project string
	)
	c := &cobra.Command{
		Use:     "rm SBX [SBX...] | rm --all [--label KEY=VALUE...]",
		Aliases: []string{"delete", "remove"},
		Short:   "Destroy sandboxes (deleting one already gone succeeds)",
		Long: `Destroy sandboxes by id, or with --all every sandbox the token may see (narrowed
by --label and --project). --all asks nothing: it prints each id it removed.`,
		Example: `  warren sandbox rm n1-abcdefghijklmnop
  warren sandbox rm --all                    # everything the token may see
  warren sandbox rm --all --label task=demo  # only those labelled task=demo`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case all && len(args) > 0:
				return usagef("%s: give sandbox ids or --all, not both", cmd.CommandPath())
			case !all && len(args) == 0:
				return usagef("%s takes one or more sandbox ids, or --all", cmd.CommandPath())
			case !all && (len(labels) > 0 || project != ""):
				return usagef("%s: --label and --project go with --all", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c := a.client()
			ids := args
			if all {
				lm, err := parseKVs("label", labels, a.getenv, false)
				if err != nil {
					return err
				}
				list, err := c.ListSandboxes(cmd.Context(), client.ListOptions{Labels: lm, Project: project})
				if err != nil {
					return err
				}
				ids = ids[:0]
				for _, sb := range list {
					ids = append(ids, sb.ID)
				}
			}
			failed := 0
			for _, id := range ids {
				if err := c.DeleteSandbox(cmd.Context(), id); err != nil {
					if cmd.Context().Err() != nil {
						return cmd.Context().Err()
					}
					fmt.Fprintf(a.stderr, "warren: %s: %s\n", id, a.describe(err))
					failed++
					continue
				}
				fmt.Fprintln(a.stdout, id)
			}
			if failed > 0 {
				return exitError{1}
			}
			return nil
		},
	}
	f := c.Flags()
	f.BoolVar(&all, "all", false, "remove every sandbox the token may see (with --label, --project: those that match)")
	f.StringArrayVar(&labels, "label", nil, "with --all: only sandboxes with label KEY=VALUE (repeatable; all must match)")
	f.StringVar(&project, "project", "", "with --all: only sandboxes in this project's subtree")
	return c
}
