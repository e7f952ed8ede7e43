package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

func newSandboxStatsCmd(a *app) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "stats SBX",
		Short: "Show a running sandbox's resource use now (CPU time, memory, processes)",
		Args:  exactArgs(1, "one sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			st, err := a.client().Stats(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == outJSON {
				return writeJSON(a.stdout, st)
			}
			tw := newTable(a.stdout, "CPU time:", fmt.Sprintf("%.3fs", st.CPUSeconds))
			row(tw, "Memory:", orDash(memString(api.Quantity(st.Memory))))
			row(tw, "Memory peak:", orDash(memString(api.Quantity(st.MemoryPeak))))
			row(tw, "PIDs:", fmt.Sprint(st.PIDs))
			return tw.Flush()
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
}
