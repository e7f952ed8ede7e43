package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/cobra"
)

// portSpec is one [LOCAL:]REMOTE of port-forward; local 0 picks a free
// port.
type portSpec struct{ local, remote int }

func parsePortSpec(s string) (portSpec, error) {
	local, remote, ok := strings.Cut(s, ":")
	if !ok {
		local, remote = s, s
	}
	if local == "" {
		local = "0"
	}
	r, err := strconv.Atoi(remote)
	if err != nil || r < 1 || r > 65535 {
		return portSpec{}, usagef("port %q: want [LOCAL:]REMOTE with REMOTE from 1 to 65535", s)
	}
	l, err := strconv.Atoi(local)
	if err != nil || l < 0 || l > 65535 {
		return portSpec{}, usagef("port %q: LOCAL must be from 0 (any free port) to 65535", s)
	}
	return portSpec{l, r}, nil
}

func newPortForwardCmd(a *app) *cobra.Command {
	var addrs []string
	c := &cobra.Command{
		Use:   "port-forward SBX [LOCAL:]REMOTE...",
		Short: "Forward local ports to TCP ports inside a sandbox, through the API",
		Long: `Listen on local ports and forward each connection to a port inside a
sandbox, like kubectl port-forward. The connection goes through the API
(GET /v1/sandboxes/SBX/portforward/PORT) and the node connects to
127.0.0.1:PORT inside the sandbox, so it works whatever the sandbox's
network, none included. Each local connection is one tunnel; both
directions close independently. Ctrl-C stops forwarding.

LOCAL defaults to REMOTE; ":REMOTE" or "0:REMOTE" listens on a free port.
For HTTP without a tunnel, requests can also go to
/v1/sandboxes/SBX/ports/PORT/PATH on the API with the same token.`,
		Example: `  warren port-forward $SBX 8080:8000          # http://127.0.0.1:8080 reaches the sandbox's :8000
  warren port-forward $SBX 5432 :6379         # several at once; :6379 on a free local port
  warren port-forward $SBX 8888 --address 0.0.0.0`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usagef("port-forward needs a sandbox id and at least one [LOCAL:]REMOTE port")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			var specs []portSpec
			for _, s := range args[1:] {
				p, err := parsePortSpec(s)
				if err != nil {
					return err
				}
				specs = append(specs, p)
			}
			if len(addrs) == 0 {
				return usagef("--address needs at least one address")
			}
			cl := a.client()
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			if _, err := cl.GetSandbox(ctx, id); err != nil {
				return err
			}
			type forward struct {
				ln     net.Listener
				remote int
			}
			var fws []forward
			for _, addr := range addrs {
				for _, p := range specs {
					ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(p.local)))
					if err != nil {
						for _, f := range fws {
							f.ln.Close()
						}
						return fmt.Errorf("listen: %w", err)
					}
					fws = append(fws, forward{ln, p.remote})
				}
			}
			stderr := &lockedWriter{w: a.stderr}
			for _, f := range fws {
				fmt.Fprintf(a.stdout, "Forwarding from %s -> %d\n", f.ln.Addr(), f.remote)
			}
			errc := make(chan error, len(fws))
			for _, f := range fws {
				go func() {
					errc <- cl.ForwardPort(ctx, f.ln, id, f.remote, func(err error) {
						fmt.Fprintf(stderr, "warren: port-forward %s -> %d: %s\n", f.ln.Addr(), f.remote, a.describe(err))
					})
				}()
			}
			var first error
			for range fws {
				if err := <-errc; err != nil && first == nil {
					first = err
					cancel() // the sandbox is gone or refused: stop every port
				}
			}
			return first
		},
	}
	c.Flags().StringSliceVar(&addrs, "address", []string{"127.0.0.1"}, "local addresses to listen on (comma-separated)")
	return c
}

// lockedWriter serialises writes from the tunnels' goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
