package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

func newImageLsCmd(a *app) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			images, err := a.client().ListImages(cmd.Context())
			if err != nil {
				return err
			}
			if output == outJSON {
				if images == nil {
					images = []api.Image{}
				}
				return writeJSON(a.stdout, api.ImageList{Images: images})
			}
			now := time.Now()
			tw := newTable(a.stdout, "NAME", "LAYERS", "SIZE", "CREATED")
			for _, im := range images {
				row(tw, im.Name, fmt.Sprint(len(im.Layers)), fmtBytes(im.Size), age(im.CreatedAt, now))
			}
			return tw.Flush()
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: table (default) or json")
	return c
}

func newNodeLsCmd(a *app) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List node agents with their capacity, usage and health",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			nodes, err := a.client().ListNodes(cmd.Context())
			if err != nil {
				return err
			}
			if output == outJSON {
				if nodes == nil {
					nodes = []api.Node{}
				}
				return writeJSON(a.stdout, api.NodeList{Nodes: nodes})
			}
			tw := newTable(a.stdout, "ID", "POOL", "HEALTHY", "ADDRESS", "BACKENDS", "LAYERS", "CPU", "MEMORY", "IN-USE", "SANDBOXES", "QOS", "MERGE", "DISK-QUOTA", "NETWORK", "SECURITY", "SNAPSHOTS", "PROBLEMS")
			for _, n := range nodes {
				health := "yes"
				if !n.Healthy {
					health = "no"
				}
				pool := n.Pool
				if pool == "" {
					pool = api.PoolOnPrem
				}
				network := "no"
				if n.Network {
					network = "yes"
				}
				row(tw, n.ID, pool, health, orDash(n.Address), orDash(backendSummary(n)), orDash(n.LayerLoading),
					num(n.Usage.CPU)+"/"+num(n.Capacity.CPU),
					memHuman(n.Usage.Memory)+"/"+memHuman(n.Capacity.Memory),
					inUseSummary(n.InUse), sandboxCount(n), qosSummary(n.QoS), mergeSummary(n.MemoryMerge),
					orDash(n.DiskQuota), network, securitySummary(n.Security), snapshotKinds(n.Snapshots),
					orDash(strings.Join(n.Problems, "; ")))
			}
			return tw.Flush()
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "output: table (default) or json")
	return c
}

// inUseSummary is what the node measures its sandboxes using, against
// what it lets them have: "cpu:0.42+1.1be/2,mem:3.1G/21.8G" (best-effort
// cores apart; "cpu:?" when not measured).
func inUseSummary(u *api.NodeInUse) string {
	if u == nil {
		return "-"
	}
	cpu := "cpu:?"
	if u.CPUUnmeasured == "" {
		cpu = "cpu:" + num(u.CPU)
		if u.CPUBestEffort > 0 {
			cpu += "+" + num(u.CPUBestEffort) + "be"
		}
		cpu += "/" + num(u.Cores)
	}
	return cpu + ",mem:" + fmtBytes(int64(u.Memory)) + "/" + fmtBytes(int64(u.MemoryLimit))
}

// qosSummary says how many of the node's sandboxes are best-effort and
// how their cgroups yield: "be:2,cpu.idle".
func qosSummary(q *api.NodeQoS) string {
	if q == nil {
		return "-"
	}
	return fmt.Sprintf("be:%d,%s", q.BestEffort, q.Group)
}

// mergeSummary says whether the node merges sandboxes' memory and whose:
// "ksm" (none merging now), "ksm:GROUP(12),saved:1.2G", "off" (-o json
// says why).
func mergeSummary(m *api.NodeMemoryMerge) string {
	switch {
	case m == nil:
		return "-"
	case m.Mechanism != "ksm":
		return "off"
	case m.Group == "":
		return "ksm"
	}
	return fmt.Sprintf("ksm:%s(%d),saved:%s", m.Group, m.Sandboxes, fmtBytes(int64(m.Saved)))
}

// backendSummary lists the node's backends, each with the runtimes it
// runs besides its default and each QEMU one with its accelerator:
// "container+gvisor,microvm(tcg)". A runtime the node cannot run is left
// out (its problem line says why).
func backendSummary(n api.Node) string {
	accel := map[string]string{}
	for _, m := range n.Machines {
		accel[m.Backend] = m.Accel
	}
	extra := map[string]string{}
	seen := map[string]bool{}
	for _, r := range n.Runtimes {
		if seen[r.Backend] && r.Available { // the first is the default
			extra[r.Backend] += "+" + r.Name
		}
		seen[r.Backend] = true
	}
	names := make([]string, len(n.Backends))
	for i, b := range n.Backends {
		names[i] = b + extra[b]
		if a := accel[b]; a != "" {
			names[i] += "(" + a + ")"
		}
	}
	return strings.Join(names, ",")
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// memHuman is q's exact form ("256Mi") when it has one, else a rounded one.
func memHuman(q api.Quantity) string {
	if s := q.String(); q < 1024 || strings.ContainsAny(s, "KMGT") {
		return s
	}
	return fmtBytes(int64(q))
}

// securitySummary is node ls's SECURITY column: how many of guard's
// measures the node enforces, and each LSM as applied, unused (the host
// runs it, the node could not apply it: its note says why) or off.
func securitySummary(s *api.NodeSecurity) string {
	if s == nil {
		return "-"
	}
	parts := []string{fmt.Sprintf("%d-measures", len(s.Enforced))}
	for _, l := range s.LSMs {
		state := "off"
		switch {
		case l.Applied:
			state = "applied"
		case l.Active:
			state = "unused"
		}
		parts = append(parts, l.Name+":"+state)
	}
	switch {
	case s.UserNS == "per-sandbox":
		parts = append(parts, "userns:per-sandbox")
	case s.UserNS != "":
		parts = append(parts, "userns:off")
	}
	return strings.Join(parts, ",")
}

// snapshotKinds is node ls's SNAPSHOTS column: the kinds the node takes
// ("filesystem"), "-" for none.
func snapshotKinds(s *api.NodeSnapshots) string {
	if s == nil || len(s.Kinds) == 0 {
		return "-"
	}
	return strings.Join(s.Kinds, ",")
}

// sandboxCount is node ls's SANDBOXES column: used of capacity, and how
// many of them are paused.
func sandboxCount(n api.Node) string {
	s := fmt.Sprintf("%d/%d", n.Usage.Sandboxes, n.Capacity.Sandboxes)
	if n.Usage.Paused > 0 {
		s += fmt.Sprintf(",%d-paused", n.Usage.Paused)
	}
	return s
}
