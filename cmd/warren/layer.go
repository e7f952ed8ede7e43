package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// layerCommands returns the top-level `layer` and `env` verbs.
func layerCommands(a *app) []*cobra.Command {
	layer := &cobra.Command{Use: "layer", Aliases: []string{"layers"}, Short: "Build, list and remove layers"}
	groupArgs(layer)
	layer.AddCommand(newLayerBuildCmd(a), newLayerLsCmd(a), newLayerGetCmd(a), newLayerRmCmd(a), newGCCmd(a))

	env := &cobra.Command{Use: "env", Aliases: []string{"envs", "environment", "environments"},
		Short: "Compose environments from layers; list and remove them"}
	groupArgs(env)
	env.AddCommand(newEnvCreateCmd(a), newEnvUpdateCmd(a), newEnvLsCmd(a), newEnvGetCmd(a), newEnvRmCmd(a), newEnvExportCmd(a),
		newEnvPublishCmd(a), newEnvSquashCmd(a))
	return []*cobra.Command{layer, env}
}

func newLayerBuildCmd(a *app) *cobra.Command {
	var (
		spec  client.LayerSpec
		start time.Time
	)
	c := showCmd(a, &cobra.Command{
		Use:   "build --kind KIND --name NAME --version VERSION PATH",
		Short: "Build a layer from a directory or a .tar/.tar.gz file",
		Long: `Build a read-only EROFS layer on the server from PATH: a directory (sent as a
tar stream keeping numeric owners, modes and mtimes) or a .tar or .tar.gz file
(sent as is; "-" reads one from stdin). Kinds: base, workspace, toolkit, diff
(a diff needs --parent).`,
		Example: `  warren layer build --kind base --name debian-python --version 12 ./rootfs
  warren layer build --kind toolkit --name harness --version 7 ./harness.tar.gz`,
		Args: exactArgs(1, "one directory or archive"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.Layer, error) {
		if spec.Kind == "" || spec.Name == "" || spec.Version == "" {
			return nil, usagef("--kind, --name and --version are required")
		}
		start = time.Now()
		if args[0] == "-" {
			return a.client().BuildLayer(cmd.Context(), spec, a.stdin)
		}
		if _, err := os.Stat(args[0]); err != nil {
			return nil, fmt.Errorf("layer source: %w", err)
		}
		return a.client().BuildLayerFromPath(cmd.Context(), spec, args[0])
	}, func(w io.Writer, l *api.Layer) error {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d chunks\t%s\n", l.Ref, l.Digest, fmtBytes(l.Size), l.Chunks,
			time.Since(start).Round(time.Millisecond))
		return nil
	})
	f := c.Flags()
	f.StringVar(&spec.Kind, "kind", "", "layer kind: base, workspace, toolkit or diff (required)")
	f.StringVar(&spec.Name, "name", "", "layer name (required)")
	f.StringVar(&spec.Version, "version", "", "layer version (required)")
	f.StringVar(&spec.Parent, "parent", "", "for a diff layer: the NAME@VERSION it applies on")
	return c
}

func newLayerLsCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:     "ls [NAME]",
		Aliases: []string{"list"},
		Short:   "List layers with their sizes, versions and users",
		Args:    maxArgs(1, "at most one name"),
	}, "table", func(cmd *cobra.Command, args []string) (api.LayerList, error) {
		list, err := a.client().ListLayers(cmd.Context(), firstArg(args))
		return api.LayerList{Layers: nonNil(list)}, err
	}, func(w io.Writer, list api.LayerList) error {
		now := time.Now()
		tw := newTable(w, "NAME", "VERSION", "KIND", "SIZE", "CHUNKS", "USED BY", "CREATED")
		for _, l := range list.Layers {
			row(tw, l.Name, l.Version, l.Kind, fmtBytes(l.Size), fmt.Sprint(l.Chunks),
				orDash(strings.Join(l.UsedBy, ",")), age(l.CreatedAt, now))
		}
		return tw.Flush()
	})
}

func newLayerGetCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:     "get NAME[@VERSION]",
		Aliases: []string{"inspect"},
		Short:   "Show one layer (the latest version when none is given)",
		Args:    exactArgs(1, "one layer ref"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.Layer, error) {
		return a.client().GetLayer(cmd.Context(), args[0])
	}, func(w io.Writer, l *api.Layer) error {
		now := time.Now()
		tw := newTable(w, "Layer:", l.Ref)
		row(tw, "Kind:", l.Kind)
		row(tw, "Digest:", l.Digest)
		row(tw, "Image:", l.ImageDigest)
		row(tw, "Size:", fmtBytes(l.Size))
		row(tw, "Chunks:", fmt.Sprint(l.Chunks))
		if l.Parent != "" {
			row(tw, "Parent:", l.Parent)
		}
		row(tw, "Used by:", orDash(strings.Join(l.UsedBy, ", ")))
		row(tw, "Prefetch trace:", orDash(l.PrefetchTrace))
		row(tw, "Created:", stamp(l.CreatedAt, now))
		return tw.Flush()
	})
}

func newLayerRmCmd(a *app) *cobra.Command {
	return eachCmd(a, &cobra.Command{
		Use:     "rm NAME@VERSION [NAME@VERSION...]",
		Aliases: []string{"delete", "remove"},
		Short:   "Remove layers no environment or sandbox uses (their data goes at the next GC)",
	}, "one or more layer refs", (*client.Client).DeleteLayer)
}

func newGCCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:   "gc",
		Short: "Delete the blobs no layer, environment or live sandbox references",
		Args:  noArgs,
	}, "text", func(cmd *cobra.Command, args []string) (*api.GCResult, error) {
		return a.client().CollectGarbage(cmd.Context())
	}, func(w io.Writer, res *api.GCResult) error {
		if res.Skipped {
			fmt.Fprintln(w, "another collection is running; nothing done")
			return nil
		}
		fmt.Fprintf(w, "deleted %d of %d blobs (%s); %d live, %d within the grace period\n",
			res.Deleted, res.Blobs, fmtBytes(res.DeletedBytes), res.Live, res.Young)
		return nil
	})
}

// envFlags are the flags env create and env update share.
type envFlags struct {
	base, workspace, workdir, user string
	toolkits, env, entrypoint      []string
	output                         string
}

func (f *envFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.base, "base", "", "base layer NAME[@VERSION]")
	fl.StringVar(&f.workspace, "workspace", "", "workspace layer NAME[@VERSION]")
	fl.StringArrayVar(&f.toolkits, "toolkit", nil, "toolkit layer NAME[@VERSION] (repeatable; later ones on top)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "default environment variable KEY=VALUE (repeatable)")
	fl.StringVar(&f.workdir, "workdir", "", "default working directory for exec")
	fl.StringVar(&f.user, "user", "", "default user for exec: name, uid or uid:gid")
	fl.StringArrayVar(&f.entrypoint, "entrypoint", nil, "entrypoint argv element (repeatable), kept for export")
	fl.StringVarP(&f.output, "output", "o", "", "output: text (default) or json")
}

func (f *envFlags) request(a *app) (api.CreateEnvironmentRequest, error) {
	req := api.CreateEnvironmentRequest{
		Base: f.base, Workspace: f.workspace, Toolkits: f.toolkits,
		Workdir: f.workdir, User: f.user, Entrypoint: f.entrypoint,
	}
	var err error
	req.Env, err = parseKVs("env", f.env, a.getenv, false)
	return req, err
}

func (a *app) printEnv(env *api.Environment, output string) error {
	if output == outJSON {
		return writeJSON(a.stdout, env)
	}
	var refs []string
	for _, l := range env.Layers {
		refs = append(refs, l.Ref)
	}
	fmt.Fprintf(a.stdout, "%s\t%s\t%s\n", env.Ref, strings.Join(refs, " < "), fmtBytes(env.Size))
	return nil
}

func newEnvCreateCmd(a *app) *cobra.Command {
	var f envFlags
	c := &cobra.Command{
		Use:   "create NAME@VERSION --base LAYER [--workspace LAYER] [--toolkit LAYER]... [flags]",
		Short: "Create an environment from layers",
		Example: `  warren env create swe-task-0042@1 --base debian-python@12 --workspace swe-task-0042@1 \
      --toolkit harness@7 --env PYTHONUNBUFFERED=1 --workdir /work --user 1000`,
		Args: exactArgs(1, "one NAME@VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(f.output, outDefault, outJSON); err != nil {
				return err
			}
			name, version, ok := strings.Cut(args[0], "@")
			if !ok || name == "" || version == "" {
				return usagef("environment %q: want NAME@VERSION", args[0])
			}
			if f.base == "" {
				return usagef("--base is required")
			}
			req, err := f.request(a)
			if err != nil {
				return err
			}
			req.Name, req.Version = name, version
			env, err := a.client().CreateEnvironment(cmd.Context(), req)
			if err != nil {
				return err
			}
			return a.printEnv(env, f.output)
		},
	}
	f.register(c)
	return c
}

func newEnvUpdateCmd(a *app) *cobra.Command {
	var (
		f  envFlags
		as string
	)
	c := &cobra.Command{
		Use:   "update NAME[@VERSION] [--toolkit LAYER]... [flags]",
		Short: "Derive a new environment version with some layers or defaults replaced",
		Long: `Create a new version of an environment that shares every layer of the given
one except those replaced: --base and --workspace replace theirs, each --toolkit
replaces the toolkit of the same name (or goes on top). Environments are
immutable, so sandboxes started from the old version are not affected; the new
version is NAME@<next number> unless --as names it. No data is copied.`,
		Example: `  warren env update swe-task-0042@1 --toolkit harness@8      # creates swe-task-0042@2
  warren env update swe-task-0042@1 --toolkit harness@8 --as swe-task-0042@1-h8`,
		Args: exactArgs(1, "one environment ref"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(f.output, outDefault, outJSON); err != nil {
				return err
			}
			req, err := f.request(a)
			if err != nil {
				return err
			}
			req.From = args[0]
			if as != "" {
				name, version, ok := strings.Cut(as, "@")
				if !ok || name == "" || version == "" {
					return usagef("--as %q: want NAME@VERSION", as)
				}
				req.Name, req.Version = name, version
			}
			env, err := a.client().CreateEnvironment(cmd.Context(), req)
			if err != nil {
				return err
			}
			return a.printEnv(env, f.output)
		},
	}
	f.register(c)
	c.Flags().StringVar(&as, "as", "", "NAME@VERSION of the new environment (default: next version)")
	return c
}

func newEnvLsCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:     "ls [NAME]",
		Aliases: []string{"list"},
		Short:   "List environments with their layers and sizes",
		Args:    maxArgs(1, "at most one name"),
	}, "table", func(cmd *cobra.Command, args []string) (api.EnvironmentList, error) {
		list, err := a.client().ListEnvironments(cmd.Context(), firstArg(args))
		return api.EnvironmentList{Environments: nonNil(list)}, err
	}, func(w io.Writer, list api.EnvironmentList) error {
		now := time.Now()
		tw := newTable(w, "NAME", "VERSION", "LAYERS", "SIZE", "CREATED")
		for _, e := range list.Environments {
			var refs []string
			for _, l := range e.Layers {
				refs = append(refs, l.Ref)
			}
			row(tw, e.Name, e.Version, strings.Join(refs, ","), fmtBytes(e.Size), age(e.CreatedAt, now))
		}
		return tw.Flush()
	})
}

func newEnvGetCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:     "get NAME[@VERSION]",
		Aliases: []string{"inspect"},
		Short:   "Show one environment (the latest version when none is given)",
		Args:    exactArgs(1, "one environment ref"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.Environment, error) {
		return a.client().GetEnvironment(cmd.Context(), args[0])
	}, func(w io.Writer, env *api.Environment) error {
		now := time.Now()
		tw := newTable(w, "Environment:", env.Ref)
		for i := len(env.Layers) - 1; i >= 0; i-- { // top first, as overlay stacks them
			l := env.Layers[i]
			row(tw, "Layer:", fmt.Sprintf("%s (%s, %s)", l.Ref, l.Kind, fmtBytes(l.Size)))
		}
		row(tw, "Size:", fmtBytes(env.Size))
		row(tw, "Env:", kvList(env.Env, ", "))
		row(tw, "Workdir:", orDash(env.Workdir))
		row(tw, "User:", orDash(env.User))
		if len(env.Entrypoint) > 0 {
			row(tw, "Entrypoint:", strings.Join(env.Entrypoint, " "))
		}
		row(tw, "Created:", stamp(env.CreatedAt, now))
		if env.Snapshot != "" {
			row(tw, "Snapshot:", env.Snapshot)
		}
		if env.Unpublished {
			row(tw, "Published:", "no (builders only: warren env publish)")
		}
		if c := env.Check; c != nil {
			verdict := "passed"
			if !c.Passed {
				verdict = fmt.Sprintf("FAILED (exit %d)", c.ExitCode)
				if c.TimedOut {
					verdict = "FAILED (timed out)"
				}
			}
			row(tw, "Check:", fmt.Sprintf("%s: %s in %.0fms, %s", c.Command, verdict, c.DurationMS, stamp(c.CheckedAt, now)))
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, out := range []struct{ name, text string }{{"stdout", c.Stdout}, {"stderr", c.Stderr}} {
				if out.text != "" {
					fmt.Fprintf(w, "--- check %s:\n%s", out.name, out.text)
					if !strings.HasSuffix(out.text, "\n") {
						fmt.Fprintln(w)
					}
				}
			}
			return nil
		}
		return tw.Flush()
	})
}

func newEnvPublishCmd(a *app) *cobra.Command {
	var req api.PublishRequest
	var timeout time.Duration
	c := showCmd(a, &cobra.Command{
		Use:   "publish NAME@VERSION [--check CMD] [--timeout 10m]",
		Short: "Publish a snapshot's environment to runners, if its check passes",
		Long: `Publish an environment made by a snapshot: until then only builders see it
and create sandboxes from it. With --check, the command runs (sh -c) in a
fresh sandbox made from the environment and must exit 0 within --timeout
(default 10m), or the environment stays unpublished; its output and exit
code are kept on the environment either way (warren env get; builders
only).`,
		Example: `  warren env publish swe-task-0042@2 --check 'cd /work && python3 -m pytest -q tests/smoke'`,
		Args:    exactArgs(1, "one environment ref"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.Environment, error) {
		req.Timeout = api.Duration(timeout)
		return a.client().PublishEnvironment(cmd.Context(), args[0], req)
	}, func(w io.Writer, env *api.Environment) error {
		_, err := fmt.Fprintf(w, "published %s\n", env.Ref)
		return err
	})
	c.Flags().StringVar(&req.Check, "check", "", "command that must pass first, in a fresh sandbox from the environment")
	c.Flags().DurationVar(&timeout, "timeout", 0, "how long the check may run (default 10m)")
	return c
}

// newEnvSquashCmd is `warren env squash NAME@VERSION`.
func newEnvSquashCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:   "squash NAME@VERSION",
		Short: "Squash the diff layers on top of an environment into one",
		Long: `Squash the chain of diff layers on top of an environment (snapshots of
sandboxes made from snapshots) into one diff layer with the same files,
NAME-squashed@VERSION; the environment then names it instead. Snapshots
do this by themselves in the background past ` + strconv.Itoa(api.MaxDiffDepth) + ` diffs. Sandboxes made
before keep the chain.`,
		Args: exactArgs(1, "one environment ref"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.SquashResult, error) {
		return a.client().SquashEnvironment(cmd.Context(), args[0])
	}, func(w io.Writer, res *api.SquashResult) error {
		env := res.Environment
		if !res.Squashed {
			_, err := fmt.Fprintf(w, "%s: %d diff layer(s) on top, nothing to squash\n", env.Ref, api.DiffDepth(env.Layers))
			return err
		}
		top := env.Layers[len(env.Layers)-1]
		_, err := fmt.Fprintf(w, "squashed %s: %d diff layers into %s (%s)\n", env.Ref, len(env.Squashed.From), top.Ref, fmtBytes(top.Size))
		return err
	})
}

func newEnvRmCmd(a *app) *cobra.Command {
	return eachCmd(a, &cobra.Command{
		Use:     "rm NAME@VERSION [NAME@VERSION...]",
		Aliases: []string{"delete", "remove"},
		Short:   "Remove environments (sandboxes started from them keep running)",
	}, "one or more environment refs", (*client.Client).DeleteEnvironment)
}
