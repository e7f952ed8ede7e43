package main

import "github.com/spf13/cobra"

// imageCommands returns the `image` subcommands beyond ls (import, ...).
func imageCommands(a *app) []*cobra.Command { return nil }
