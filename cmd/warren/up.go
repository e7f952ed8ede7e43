package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newUpCmd is a placeholder; the lead replaces this file with the real
// `warren up` (apiserver + agent + embedded etcd + blob store).
func newUpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "up",
		Short: "Run a whole warren (apiserver, agent, etcd, blob store) in one process",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("warren up: not yet")
		},
	}
}
