package main

import "github.com/spf13/cobra"

// layerCommands returns the top-level `layer` and `env` verbs.
func layerCommands(a *app) []*cobra.Command { return nil }
