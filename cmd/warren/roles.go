package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/daemon"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/placement"
	"github.com/warrenhq/warren/internal/swap"
)

const envNodeToken = "WARREN_NODE_TOKEN"

// backendFake is `warren agent --backend fake`: a simulated node over the
// fake backend, which isolates nothing. Only a binary built with
// -tags warrenfake has it (fake.go sets simulatedBackend).
const backendFake = "fake"

var simulatedBackend func(dir string) (backend.Backend, error)

// serve runs a server role until SIGINT or SIGTERM, logging to stderr.
func serve(verbose bool, run func(ctx context.Context, log *slog.Logger) error) error {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, log)
}

func newAPIServerCmd(a *app) *cobra.Command {
	cfg := daemon.APIServerConfig{}
	var verbose bool
	var strategy string
	cmd := &cobra.Command{
		Use:   "apiserver",
		Short: "Run one stateless apiserver replica over an etcd cluster and a fleet of agents",
		Long: `Run one apiserver replica. It keeps no state of its own: run two or more behind
any load balancer, all with the same --etcd. Nodes join with "warren agent".

The first apiserver of a fresh cluster creates the admin token and writes it to
<data-dir>/admin-token, and mints a node token that it writes to
<data-dir>/node-token: give it to agents as --token, or mint one per node with
"warren token create --role node" (revoke any with "warren token revoke"). Each
agent registers a secret of its own, which apiservers present when they call it.

--tls-cert and --tls-key serve the API over TLS; --ca (or WARREN_CA) is the CA
that signed the agents' certificates, which the apiserver verifies when it
calls an agent registered with an https address. "warren cert" makes both.

Every apiserver and agent must reach the same blob store (--blobs): a directory
on a filesystem they share, or an S3 bucket, s3://bucket/prefix?endpoint=host:port
(https; http://host:port for plain HTTP; no endpoint: AWS S3), with &region=R if
needed and the credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(cfg.Etcd) == 0 {
				return usagef("--etcd is required")
			}
			cfg.Placement.Strategy = placement.Strategy(strategy)
			cfg.TLS.CA = a.ca
			return serve(verbose, func(ctx context.Context, log *slog.Logger) error {
				cfg.Log = log
				return daemon.APIServer(ctx, cfg)
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Etcd, "etcd", nil, "etcd endpoints, comma-separated (http://10.0.0.1:2379,...)")
	f.StringVar(&cfg.Listen, "listen", ":7443", "API listen address")
	tlsFlags(f, &cfg.TLS)
	f.StringVar(&cfg.DataDir, "data-dir", dataDirDefault(), "directory for local state (env "+envDataDir+")")
	f.StringVar(&cfg.Blobs, "blobs", "", "blob store shared by every apiserver and agent: a directory or s3://bucket/prefix?endpoint=host:port (default <data-dir>/blobs)")
	f.IntVar(&cfg.Placement.K, "k", 0, "nodes sampled per placement (power-of-k; 0: 2)")
	f.StringVar(&strategy, "placement", string(placement.PowerOfK), "placement strategy: power-of-k, oracle or random")
	f.DurationVar(&cfg.Fleet.PollInterval, "poll-interval", 0, "how often each node's status is polled (0: 1s)")
	f.IntVar(&cfg.Fleet.MaxMissed, "max-missed", 0, "polls missed in a row that make a node unreachable (0: 3)")
	f.DurationVar(&cfg.Refresh, "list-refresh", 0, "how often each node's sandboxes are re-listed for quota usage and lost-sandbox reports (0: 2s)")
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}

func newAgentCmd(a *app) *cobra.Command {
	cfg := daemon.AgentConfig{}
	var verbose bool
	var labels []string
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run a node agent that joins a warren cluster",
		Long: `Run a node agent: it owns the sandboxes of this host, serves the node API on
--listen and registers itself, through etcd (--etcd) or through an apiserver
(--apiserver), with its address, pool, labels, backends and capacity. --token is
a node token: one from "warren token create --role node", or the first
apiserver's <data-dir>/node-token. It is checked at every registration, so a
revoked token ends the agent. The node API takes only a secret the agent draws
at every start and registers with the node. Several agents can share a host if
their --data-dir differ.

Sandboxes outlive the agent: the next agent on the same --data-dir re-adopts
them, ends those whose TTL ran out meanwhile, and removes what no sandbox
record accounts for (cgroups, mounts, runc state), logging each. With
--stop-sandboxes the agent ends all its sandboxes when it stops instead.

--tls-cert and --tls-key serve the node API over TLS (the agent then registers
an https address, which apiservers verify with their --ca); --ca is also the CA
the agent verifies an https --apiserver with. --node-name names the node; a node
token bound to a name (warren token create --role node --node NAME) registers
only that name, and no agent takes over the registration of another that is
alive. Register through --apiserver where hosts are not all trusted: an agent
given --etcd holds the keys of the whole cluster.

--blobs is the blob store the apiservers use: a directory they all mount, or
s3://bucket/prefix?endpoint=host:port (see "warren apiserver --help").`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (len(cfg.Etcd) == 0) == (len(cfg.APIServers) == 0) {
				return usagef("give --apiserver or --etcd (one of them)")
			}
			if cfg.Token == "" {
				return usagef("--token (or $%s) is required: the node token", envNodeToken)
			}
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok || k == "" {
					return usagef("--label %q: want key=value", l)
				}
				if cfg.Labels == nil {
					cfg.Labels = map[string]string{}
				}
				cfg.Labels[k] = v
			}
			if cfg.Backend == backendFake {
				if simulatedBackend == nil {
					return usagef("--backend fake: this warren was built without the fake backend, which isolates nothing (tests build it with -tags warrenfake)")
				}
				cfg.Backend, cfg.Simulated = "", simulatedBackend
			}
			cfg.TLS.CA = a.ca
			return serve(verbose, func(ctx context.Context, log *slog.Logger) error {
				cfg.Log = log
				return daemon.Agent(ctx, cfg)
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.APIServers, "apiserver", nil, "register through an apiserver (URL; several, comma-separated, are tried in order)")
	f.StringSliceVar(&cfg.Etcd, "etcd", nil, "register in etcd directly (endpoints, comma-separated)")
	f.StringVar(&cfg.Listen, "listen", ":7444", "node API listen address")
	f.StringVar(&cfg.Advertise, "advertise", "", "address apiservers dial (default: --listen, its host resolved; https:// with --tls-cert)")
	f.StringVar(&cfg.NodeName, "node-name", "", "the node's name, unique in the cluster (default: the name the node token is bound to, if any)")
	tlsFlags(f, &cfg.TLS)
	// Shadows the client verbs' --token: here it is the node token.
	f.StringVar(&cfg.Token, "token", a.getenv(envNodeToken), "node token: an IAM token of role node (env "+envNodeToken+")")
	f.StringVar(&cfg.DataDir, "data-dir", filepath.Join(dataDirDefault(), "agent"), "directory for the node's state")
	f.StringVar(&cfg.Pool, "pool", "onprem", "node pool: onprem or cloud")
	fnFlags(f, &cfg.Fn)
	f.StringArrayVar(&labels, "label", nil, "node label key=value (repeatable)")
	f.StringVar(&cfg.Blobs, "blobs", "", "blob store shared with the apiservers: a directory or s3://bucket/prefix?endpoint=host:port (default <data-dir>/blobs)")
	limitFlags(f, &cfg.Limits)
	swapFlag(f, &cfg.Swap)
	reclaimFlag(f, &cfg.ReclaimIdle)
	mergeFlag(f, &cfg.NoMemoryMerge)
	quantityVar(f, &cfg.DefaultDisk, "default-disk", "writable layer limit of a sandbox that asks for none, e.g. 10Gi (0: none; needs a data dir on btrfs, or xfs or ext4 with project quotas)")
	f.StringVar(&cfg.Backend, "backend", "container", "sandbox backend: container")
	f.BoolVar(&cfg.StopSandboxes, "stop-sandboxes", false, "end every sandbox of this node when the agent stops (default: they keep running and the next agent on --data-dir re-adopts them)")
	networkConfigFlags(f, &cfg.Network)
	machineFlags(f, &cfg.Machines)
	layersFlags(f, &cfg.Layers)
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}

// tlsFlags are the flags of the roles that serve TLS; --ca is global.
func tlsFlags(f *pflag.FlagSet, cfg *daemon.TLSConfig) {
	f.StringVar(&cfg.Cert, "tls-cert", "", "serve TLS with this certificate (PEM; warren cert issue); plain HTTP without")
	f.StringVar(&cfg.Key, "tls-key", "", "the --tls-cert certificate's key (PEM)")
}

// quantityVar defines a size flag ("10Gi", "1G", bytes) stored in bytes.
func quantityVar(f *pflag.FlagSet, p *int64, name, usage string) {
	f.Var((*quantityValue)(p), name, usage)
}

type quantityValue int64

func (q *quantityValue) String() string { return api.Quantity(*q).String() }
func (q *quantityValue) Type() string   { return "size" }
func (q *quantityValue) Set(s string) error {
	v, err := api.ParseQuantity(s)
	if err != nil {
		return err
	}
	*q = quantityValue(v)
	return nil
}

// fnFlags are the FnCall flags of the roles that run a node.
func fnFlags(f *pflag.FlagSet, cfg *daemon.FnConfig) {
	f.BoolVar(&cfg.Disabled, "no-fn", false, "serve no FnCall on this node")
	f.StringVar(&cfg.RuntimesFile, "fn-runtimes", "", `FnCall runtimes, a JSON file {"runtimes": [...]} (default: python3, c, cpp, sh)`)
}

// swapFlag is --swap zram:SIZE (daemon.AgentConfig.Swap).
func swapFlag(f *pflag.FlagSet, size *int64) {
	f.Func("swap", "give the host a zram swap device of SIZE if it has no swap (zram:4Gi), so that paused sandboxes' anonymous memory is pushed out too", func(s string) error {
		n, err := swap.ParseSpec(s)
		*size = n
		return err
	})
}

// limitFlags are what a node admits (node.Limits), for warren up and
// warren agent alike.
func limitFlags(f *pflag.FlagSet, l *node.Limits) {
	f.IntVar(&l.Sandboxes, "max-sandboxes", 0, "sandboxes this node admits (0: one per 2Mi of the host's memory, and 1 open file each within the agent's limit)")
	f.Float64Var(&l.CPUOvercommit, "cpu-overcommit", 0, "CPU requests may add up to this many times the node's cores (0: 50); latency creates are refused when its cores are 90% busy outside the best-effort class")
	f.Float64Var(&l.MemoryOvercommit, "memory-overcommit", 0, "memory requests may add up to this many times the host's memory less the reserve, plus swap (0: 4); creates are refused when the memory in use would pass the host's less the reserve")
	quantityVar(f, &l.Reserve, "memory-reserve", "memory kept for the host and the agent, e.g. 2Gi (0: 10% of the host's, at least 1Gi); past it best-effort sandboxes are paused, then evicted")
}

func mergeFlag(f *pflag.FlagSet, off *bool) {
	f.BoolVar(off, "no-memory-merge", false, "never merge sandboxes' equal memory pages (KSM), even for projects that ask (by default the node merges one such project's sandboxes at a time, and turns the host's KSM on for them)")
}

func reclaimFlag(f *pflag.FlagSet, d *time.Duration) {
	f.DurationVar(d, "reclaim-idle", 0, "reclaim the memory of sandboxes without a call for this long (0: "+daemon.DefaultReclaimIdle.String()+"; -1s: never)")
}
