package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend/microvm"
	"github.com/warrenhq/warren/internal/daemon"
)

// networkFlags are create's --network and --allow.
type networkFlags struct {
	mode  string
	allow []string
}

func (n *networkFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&n.mode, "network", "", "egress: none (default: loopback only), open (the public internet), or allowlist (what --allow names)")
	c.Flags().StringArrayVar(&n.allow, "allow", nil, "let out to a domain (pypi.org), its subdomains (*.pythonhosted.org), an address or CIDR, each optionally :PORT (repeatable; implies --network allowlist)")
}

// policy is the create request's network, nil for none.
func (n *networkFlags) policy() (*api.NetworkPolicy, error) {
	if n.mode == "" && len(n.allow) == 0 {
		return nil, nil
	}
	switch n.mode {
	case "", api.NetworkNone, api.NetworkAllowlist, api.NetworkOpen:
	default:
		return nil, usagef("--network %q: want none, allowlist or open", n.mode)
	}
	if len(n.allow) > 0 && (n.mode == api.NetworkNone || n.mode == api.NetworkOpen) {
		return nil, usagef("--allow makes an allowlist: drop --network %s", n.mode)
	}
	return &api.NetworkPolicy{Mode: n.mode, Allow: n.allow}, nil
}

func newSandboxNetworkCmd(a *app) *cobra.Command {
	var (
		denyAll, open bool
		allow         []string
		add, remove   []string
		output        string
	)
	c := &cobra.Command{
		Use:   "network SBX (--deny-all | --open | --allow ENTRY... | --add ENTRY... | --remove ENTRY...)",
		Short: "Change a running sandbox's egress policy (between task stages)",
		Long: `Change a running sandbox's egress policy. The change is in force within a
second, also for connections already open: those it no longer allows are reset.

--deny-all takes the sandbox's network away (loopback only), --open lets it out
to the public internet, --allow replaces the allowlist with the entries given;
--add and --remove edit the allowlist in place. With no flag, it prints the
policy in force and what it refused.`,
		Example: `  warren sandbox network SBX --deny-all          # build with pip, then cut egress before the agent runs
  warren sandbox network SBX --allow github.com --allow '*.githubusercontent.com'
  warren sandbox network SBX --add 198.51.100.0/24:443
  warren sandbox network SBX -o json`,
		Args: exactArgs(1, "one sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			var u api.NetworkUpdate
			set := 0
			if denyAll {
				set++
				m := api.NetworkNone
				u.Mode = &m
			}
			if open {
				set++
				m := api.NetworkOpen
				u.Mode = &m
			}
			if len(allow) > 0 {
				set++
				m := api.NetworkAllowlist
				u.Mode, u.Allow = &m, &allow
			}
			if set > 1 {
				return usagef("give one of --deny-all, --open and --allow")
			}
			u.Add, u.Remove = add, remove
			var n *api.SandboxNetwork
			if set == 0 && len(add) == 0 && len(remove) == 0 {
				sb, err := a.client().GetSandbox(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				n = sb.Network
				if n == nil {
					n = &api.SandboxNetwork{NetworkPolicy: api.NetworkPolicy{Mode: api.NetworkNone}}
				}
			} else {
				var err error
				if n, err = a.client().UpdateNetwork(cmd.Context(), args[0], u); err != nil {
					return err
				}
			}
			if output == outJSON {
				return writeJSON(a.stdout, n)
			}
			return printNetwork(a, n)
		},
	}
	f := c.Flags()
	f.BoolVar(&denyAll, "deny-all", false, "take the network away: loopback only")
	f.BoolVar(&open, "open", false, "let out to the public internet (private and platform addresses stay denied)")
	f.StringArrayVar(&allow, "allow", nil, "replace the allowlist with these entries (repeatable)")
	f.StringArrayVar(&add, "add", nil, "add an entry to the allowlist (repeatable)")
	f.StringArrayVar(&remove, "remove", nil, "remove an entry from the allowlist (repeatable)")
	f.StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
}

func printNetwork(a *app, n *api.SandboxNetwork) error {
	tw := newTable(a.stdout, "Network:", n.Mode)
	if n.Mode == api.NetworkAllowlist {
		row(tw, "Allow:", orDash(strings.Join(n.Allow, ", ")))
	}
	if n.Address != "" {
		row(tw, "Address:", n.Address)
	}
	row(tw, "Denied:", fmt.Sprintf("%d connections, %d DNS queries", n.DeniedConnections, n.DeniedQueries))
	return tw.Flush()
}

// networkConfigFlags are the node's network flags, on `warren up` and
// `warren agent`.
func networkConfigFlags(f *pflag.FlagSet, cfg *daemon.NetworkConfig) {
	f.BoolVar(&cfg.Off, "no-network", false, "give sandboxes no network at all (creates asking for one get network_unavailable)")
	f.StringVar(&cfg.DNSUpstream, "dns-upstream", "", "resolver the sandboxes' DNS proxy asks, HOST:PORT (default: the host's /etc/resolv.conf)")
	f.StringVar(&cfg.Pool, "network-pool", "", "sandbox addresses, an IPv4 /16 to /24 not used on the host (default 10.213.0.0/16)")
	f.StringVar(&cfg.Name, "network-name", "", "names this agent's nftables table and interfaces apart from other agents' on the host: 1-8 of [a-z0-9] (default 0)")
	f.StringArrayVar(&cfg.AllowPrivate, "allow-private", nil, "let sandboxes reach this private or link-local CIDR (a mirror on the LAN) despite the always-denied ranges (repeatable)")
	f.StringArrayVar(&cfg.Deny, "deny", nil, "add this address or CIDR to what no sandbox reaches, whatever its policy (repeatable)")
}

// machineFlags are the flags of the roles that run sandboxes in QEMU.
func machineFlags(f *pflag.FlagSet, cfg *daemon.MachineConfig) {
	f.StringVar(&cfg.Kernel, "vm-kernel", "", "microVM guest kernel: a vmlinuz or an unpacked linux-image package (default "+microvm.WarrenKernel+" where scripts/build-guest-kernel built it, else Debian's, "+microvm.DebianKernel+", scripts/fetch-guest-kernel)")
	f.BoolVar(&cfg.DAX, "vm-dax", false, "attach microVMs' layers on virtio-pmem with DAX, sharing the host's page cache between guests")
	f.BoolVar(&cfg.Off, "no-microvm", false, "run no microVM sandboxes on this node")
}

// layersFlags are the flags of the roles that run sandboxes: how the node
// loads their layers.
func layersFlags(f *pflag.FlagSet, cfg *daemon.LayersConfig) {
	f.BoolVar(&cfg.Lazy, "lazy-layers", false, "load layers on demand, chunk by chunk on first read (FUSE), instead of each whole before its first start")
	f.Func("chunk-cache", "with --lazy-layers: the local chunk cache's size (default 16Gi)", func(s string) error {
		q, err := api.ParseQuantity(s)
		if err != nil || q <= 0 {
			return fmt.Errorf("chunk cache %q: want a size such as 16Gi", s)
		}
		cfg.CacheBytes = int64(q)
		return nil
	})
	// For tests: a layer's prefetch trace records its first reads for
	// this long (default 30s).
	f.DurationVar(&cfg.TraceWindow, "lazy-trace-window", 0, "with --lazy-layers: how long a layer's first reads are recorded into its prefetch trace (default 30s)")
	f.MarkHidden("lazy-trace-window")
}
