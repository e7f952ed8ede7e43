package main

import (
	"context"
	"fmt"
	"os"
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
	env.AddCommand(newEnvCreateCmd(a), newEnvUpdateCmd(a), newEnvLsCmd(a), newEnvGetCmd(a), newEnvRmCmd(a), newEnvExportCmd(a))
	return []*cobra.Command{layer, env}
}

func newLayerBuildCmd(a *app) *cobra.Command {
	var (
		spec   client.LayerSpec
		output string
	)
	c := &cobra.Command{
		Use:   "build --kind KIND --name NAME --version VERSION PATH",
		Short: "Build a layer from a directory or a .tar/.tar.gz file",
		Long: `Build a read-only EROFS layer on the server from PATH: a directory (sent as a
tar stream keeping numeric owners, modes and mtimes) or a .tar or .tar.gz file
(sent as is; "-" reads one from stdin). Kinds: base, workspace, toolkit, diff
(a diff needs --parent).`,
		Example: `  warren layer build --kind base --name debian-python --version 12 ./rootfs
  warren layer build --kind toolkit --name harness --version 7 ./harness.tar.gz`,
		Args: exactArgs(1, "one directory or archive"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			if spec.Kind == "" || spec.Name == "" || spec.Version == "" {
				return usagef("--kind, --name and --version are required")
			}
			var (
				l   *api.Layer
				err error
			)
			start := time.Now()
			if args[0] == "-" {
				l, err = a.client().BuildLayer(cmd.Context(), spec, a.stdin)
			} else {
				if _, serr := os.Stat(args[0]); serr != nil {
					return fmt.Errorf("layer source: %w", serr)
				}
				l, err = a.client().BuildLayerFromPath(cmd.Context(), spec, args[0])
			}
			if err != nil {
				return err
			}
			if output == outJSON {
				return writeJSON(a.stdout, l)
			}
			fmt.Fprintf(a.stdout, "%s\t%s\t%s\t%d chunks\t%s\n", l.Ref, l.Digest, fmtBytes(l.Size), l.Chunks,
				time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&spec.Kind, "kind", "", "layer kind: base, workspace, toolkit or diff (required)")
	f.StringVar(&spec.Name, "name", "", "layer name (required)")
	f.StringVar(&spec.Version, "version", "", "layer version (required)")
	f.StringVar(&spec.Parent, "parent", "", "for a diff layer: the NAME@VERSION it applies on")
	f.StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
}

func newLayerLsCmd(a *app) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:     "ls [NAME]",
		Aliases: []string{"list"},
		Short:   "List layers with their sizes, versions and users",
		Args:    maxArgs(1, "at most one name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			list, err := a.client().ListLayers(cmd.Context(), firstArg(args))
			if err != nil {
				return err
			}
			if output == outJSON {
				if list == nil {
					list = []api.Layer{}
				}
				return writeJSON(a.stdout, api.LayerList{Layers: list})
			}
			now := time.Now()
			tw := newTable(a.stdout, "NAME", "VERSION", "KIND", "SIZE", "CHUNKS", "USED BY", "CREATED")
			for _, l := range list {
				row(tw, l.Name, l.Version, l.Kind, fmtBytes(l.Size), fmt.Sprint(l.Chunks),
					orDash(strings.Join(l.UsedBy, ",")), age(l.CreatedAt, now))
			}
			return tw.Flush()
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: table (default) or json")
	return c
}

func newLayerGetCmd(a *app) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:     "get NAME[@VERSION]",
		Aliases: []string{"inspect"},
		Short:   "Show one layer (the latest version when none is given)",
		Args:    exactArgs(1, "one layer ref"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			l, err := a.client().GetLayer(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == outJSON {
				return writeJSON(a.stdout, l)
			}
			now := time.Now()
			tw := newTable(a.stdout, "Layer:", l.Ref)
			row(tw, "Kind:", l.Kind)
			row(tw, "Digest:", l.Digest)
			row(tw, "Image:", l.ImageDigest)
			row(tw, "Size:", fmtBytes(l.Size))
			row(tw, "Chunks:", fmt.Sprint(l.Chunks))
			if l.Parent != "" {
				row(tw, "Parent:", l.Parent)
			}
			row(tw, "Used by:", orDash(strings.Join(l.UsedBy, ", ")))
			row(tw, "Created:", stamp(l.CreatedAt, now))
			return tw.Flush()
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
}

func newLayerRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME@VERSION [NAME@VERSION...]",
		Aliases: []string{"delete", "remove"},
		Short:   "Remove layers no environment or sandbox uses (their data goes at the next GC)",
		Args:    minArgs(1, "one or more layer refs"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.eachRef(cmd, args, a.client().DeleteLayer)
		},
	}
}

func newGCCmd(a *app) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "gc",
		Short: "Delete the blobs no layer, environment or live sandbox references",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			res, err := a.client().CollectGarbage(cmd.Context())
			if err != nil {
				return err
			}
			if output == outJSON {
				return writeJSON(a.stdout, res)
			}
			if res.Skipped {
				fmt.Fprintln(a.stdout, "another collection is running; nothing done")
				return nil
			}
			fmt.Fprintf(a.stdout, "deleted %d of %d blobs (%s); %d live, %d within the grace period\n",
				res.Deleted, res.Blobs, fmtBytes(res.DeletedBytes), res.Live, res.Young)
			return nil
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
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
	var output string
	c := &cobra.Command{
		Use:     "ls [NAME]",
		Aliases: []string{"list"},
		Short:   "List environments with their layers and sizes",
		Args:    maxArgs(1, "at most one name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			list, err := a.client().ListEnvironments(cmd.Context(), firstArg(args))
			if err != nil {
				return err
			}
			if output == outJSON {
				if list == nil {
					list = []api.Environment{}
				}
				return writeJSON(a.stdout, api.EnvironmentList{Environments: list})
			}
			now := time.Now()
			tw := newTable(a.stdout, "NAME", "VERSION", "LAYERS", "SIZE", "CREATED")
			for _, e := range list {
				var refs []string
				for _, l := range e.Layers {
					refs = append(refs, l.Ref)
				}
				row(tw, e.Name, e.Version, strings.Join(refs, ","), fmtBytes(e.Size), age(e.CreatedAt, now))
			}
			return tw.Flush()
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: table (default) or json")
	return c
}

func newEnvGetCmd(a *app) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:     "get NAME[@VERSION]",
		Aliases: []string{"inspect"},
		Short:   "Show one environment (the latest version when none is given)",
		Args:    exactArgs(1, "one environment ref"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			env, err := a.client().GetEnvironment(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == outJSON {
				return writeJSON(a.stdout, env)
			}
			now := time.Now()
			tw := newTable(a.stdout, "Environment:", env.Ref)
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
			return tw.Flush()
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
}

func newEnvRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME@VERSION [NAME@VERSION...]",
		Aliases: []string{"delete", "remove"},
		Short:   "Remove environments (sandboxes started from them keep running)",
		Args:    minArgs(1, "one or more environment refs"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.eachRef(cmd, args, a.client().DeleteEnvironment)
		},
	}
}

// eachRef runs del on every ref, printing the ones done and reporting the
// others; exit status 1 if any failed.
func (a *app) eachRef(cmd *cobra.Command, refs []string, del func(ctx context.Context, ref string) error) error {
	failed := 0
	for _, ref := range refs {
		if err := del(cmd.Context(), ref); err != nil {
			if cmd.Context().Err() != nil {
				return cmd.Context().Err()
			}
			fmt.Fprintf(a.stderr, "warren: %s: %s\n", ref, a.describe(err))
			failed++
			continue
		}
		fmt.Fprintln(a.stdout, ref)
	}
	if failed > 0 {
		return exitError{1}
	}
	return nil
}

func minArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usagef("%s takes %s", cmd.CommandPath(), what)
		}
		return nil
	}
}

func maxArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > n {
			return usagef("%s takes %s", cmd.CommandPath(), what)
		}
		return nil
	}
}

func firstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}
