package main

import (
	"strings"

	"github.com/spf13/cobra"
)

func newCpCmd(a *app) *cobra.Command {
	return &cobra.Command{
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
nodes are refused.`,
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
				return c.CopyFrom(ctx, srcID, srcPath, dstPath)
			}
			if srcPath == "-" {
				return c.WriteTar(ctx, dstID, dstPath, a.stdin)
			}
			return c.CopyTo(ctx, dstID, srcPath, dstPath)
		},
	}
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
