package main

import (
	"fmt"
	"strings"

	"github.com/warrenhq/warren/client"

	"github.com/spf13/cobra"
)

func newCpCmd(a *app) *cobra.Command {
	var links string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files between the local machine and a sandbox",
		Long: `Copy a file or directory between the local machine and a sandbox. Exactly one
of SRC and DST is SBX:PATH (PATH absolute); the semantics are docker cp's:

  a file to an existing directory lands inside it, otherwise it becomes DST;
  a directory to an existing directory lands inside it as DST/NAME,
  otherwise it becomes DST; SRC ending in "/." copies a directory's contents.

A local path containing ":" must start with "./" or "/". "-" as the local
side streams a tar archive from stdin or to stdout. Archives coming from a
sandbox are unpacked so that nothing can be written outside DST; device
nodes are refused. A symbolic link the sandbox planted that leads out of
the copied tree (to /root/.warren/token, or ../../.ssh) would make whatever
reads the copy read this machine's file: --links skip (the default) leaves
such links out and names them on stderr, --links refuse fails the copy,
--links keep copies them as they are. Absolute links to paths inside the
copied tree become relative ones.`,
		Example: `  warren cp ./task $SBX:/work          # -> /work/task if /work exists
  warren cp main.py $SBX:/work/
  warren cp $SBX:/work/out.txt .
  warren cp $SBX:/work/results ./results
  tar -c . | warren cp - $SBX:/work`,
		Args: exactArgs(2, "SRC and DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := splitRemote(args[0])
			dstID, dstPath, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return usagef("exactly one of SRC and DST must be SBX:PATH")
			}
			ctx, c := cmd.Context(), a.client()
			if srcRemote {
				if dstPath == "-" {
					return c.ReadTar(ctx, srcID, srcPath, a.stdout)
				}
				policy, err := client.ParseLinkPolicy(links)
				if err != nil {
					return usagef("--links: %v", err)
				}
				return c.CopyFrom(ctx, srcID, srcPath, dstPath, client.WithLinks(policy),
					client.OnSkippedLink(func(name, target string) {
						fmt.Fprintf(a.stderr, "warren cp: skipped %s -> %s: it leads out of the copied tree (--links keep copies it)\n", name, target)
					}))
			}
			if srcPath == "-" {
				return c.WriteTar(ctx, dstID, dstPath, a.stdin)
			}
			return c.CopyTo(ctx, dstID, srcPath, dstPath)
		},
	}
	cmd.Flags().StringVar(&links, "links", "skip", "symbolic links leading out of a tree copied from a sandbox: skip, refuse or keep")
	return cmd
}

// splitRemote parses SBX:PATH. Anything starting with "/" or "." or without
// a ":" after a non-empty, slash-free prefix is a local path.
func splitRemote(arg string) (id, path string, remote bool) {
	if strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return "", arg, false
	}
	id, path, ok := strings.Cut(arg, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", arg, false
	}
	return id, path, true
}
