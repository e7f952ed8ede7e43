package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/client"
)

// The shapes the object verbs (layer, env, project, token) share, so that
// -o, argument checks and partial failures read and behave the same in all.

// showCmd completes c as a verb that fetches one value and prints it: as
// indented JSON with -o json, else with text. def names the default format
// in the flag's help ("text", "table", "tree"). -o is checked before fetch
// runs, so a bad one costs no request.
func showCmd[T any](a *app, c *cobra.Command, def string,
	fetch func(cmd *cobra.Command, args []string) (T, error), text func(w io.Writer, v T) error) *cobra.Command {
	var output string
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(output, outDefault, outJSON); err != nil {
			return err
		}
		v, err := fetch(cmd, args)
		if err != nil {
			return err
		}
		if output == outJSON {
			return writeJSON(a.stdout, v)
		}
		return text(a.stdout, v)
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: "+def+" (default) or json")
	return c
}

// nonNil makes an empty list print as [] rather than null in JSON.
func nonNil[T any](list []T) []T {
	if list == nil {
		return []T{}
	}
	return list
}

// eachCmd completes c as a verb that calls fn on each of its one or more
// arguments (what names them in the usage error), printing the ones done
// and the errors of the others; exit status 1 if any failed. fn is a
// method expression such as (*client.Client).DeleteLayer: the client is
// built when the verb runs, after the flags are parsed.
func eachCmd(a *app, c *cobra.Command, what string, fn func(c *client.Client, ctx context.Context, arg string) error) *cobra.Command {
	c.Args = minArgs(1, what)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		cl := a.client()
		failed := 0
		for _, arg := range args {
			if err := fn(cl, cmd.Context(), arg); err != nil {
				if cmd.Context().Err() != nil {
					return cmd.Context().Err()
				}
				fmt.Fprintf(a.stderr, "warren: %s: %s\n", arg, a.describe(err))
				failed++
				continue
			}
			fmt.Fprintln(a.stdout, arg)
		}
		if failed > 0 {
			return exitError{1}
		}
		return nil
	}
	return c
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
