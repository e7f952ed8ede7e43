package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/daemon"
)

// app carries what the client verbs share: standard streams, the
// environment and the global flags. Tests build one around buffers.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string

	addr, token string // --addr, --token
	ca          string // --ca: the cluster CA file, for https
	tokenSource string // where client() found the token: flag, env, file or ""
}

const (
	envAddr    = "WARREN_ADDR"
	envToken   = "WARREN_TOKEN"
	envDataDir = "WARREN_DATA_DIR"
	envCA      = "WARREN_CA"
)

// exitError ends the process with code after whatever was already printed.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run executes the command line and returns the process exit status.
func run(ctx context.Context, args []string, a *app) int {
	root := newRootCmd(a)
	root.SetArgs(args)
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var ee exitError
	var ue usageError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(a.stderr, "warren: %v\nRun '%s --help' for usage.\n", ue.err, cmd.CommandPath())
		return 2
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		fmt.Fprintln(a.stderr, "warren: interrupted")
		return 130
	}
	fmt.Fprintf(a.stderr, "warren: %s\n", a.describe(err))
	return 1
}

// describe renders err for people, with a hint when the cause is likely
// local configuration.
func (a *app) describe(err error) string {
	msg := err.Error()
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Sprintf("cannot reach the warren API at %s: %v (is the server up? set --addr or %s)", a.addr, op.Err, envAddr)
	}
	if client.IsUnauthenticated(err) {
		switch a.tokenSource {
		case "":
			msg += fmt.Sprintf("; no token found: pass --token, set %s, or run where `warren up` keeps %s", envToken, a.tokenFile())
		case "file":
			msg += fmt.Sprintf("; the token in %s was refused", a.tokenFile())
		}
	}
	return msg
}

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:           "warren",
		Short:         "warren runs sandboxes for training and evaluating AI agents",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	groupArgs(root)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	defAddr := a.getenv(envAddr)
	if defAddr == "" {
		defAddr = client.DefaultAddr
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.addr, "addr", defAddr, "API address (env "+envAddr+")")
	pf.StringVar(&a.ca, "ca", a.getenv(envCA), "CA certificate file (PEM) that signed the servers' certificates, for https (env "+envCA+"; default: the system's roots)")
	pf.StringVar(&a.token, "token", "", "bearer token (env "+envToken+"; default: the admin-token file in $"+envDataDir+" or "+daemon.DefaultDataDir+")")

	sandbox := &cobra.Command{Use: "sandbox", Aliases: []string{"sandboxes", "sb"}, Short: "Create, list, inspect and remove sandboxes"}
	groupArgs(sandbox)
	sandbox.AddCommand(newSandboxCreateCmd(a), newSandboxLsCmd(a), newSandboxGetCmd(a), newSandboxRmCmd(a), newSandboxStatsCmd(a), newSandboxNetworkCmd(a), newSandboxVerifyCmd(a),
		newSandboxSnapshotCmd(a), newSandboxForkCmd(a), newSandboxPauseCmd(a, false), newSandboxPauseCmd(a, true), newSandboxUpdateCmd(a), newSandboxJournalCmd(a))

	image := &cobra.Command{Use: "image", Aliases: []string{"images"}, Short: "Inspect images"}
	groupArgs(image)
	image.AddCommand(newImageLsCmd(a))
	image.AddCommand(imageCommands(a)...)

	node := &cobra.Command{Use: "node", Aliases: []string{"nodes"}, Short: "Inspect node agents"}
	groupArgs(node)
	node.AddCommand(newNodeLsCmd(a))

	root.AddCommand(newUpCmd(), newAPIServerCmd(a), newAgentCmd(a), newDemoCmd(a), sandbox, newExecCmd(a), newCpCmd(a), image, node)
	root.AddCommand(newCertCmd(a))
	root.AddCommand(layerCommands(a)...)
	root.AddCommand(projectCommands(a)...)
	root.AddCommand(newFnCmd(a))
	root.AddCommand(newPortForwardCmd(a))            // portforward.go
	root.AddCommand(newSnapshotCmd(a))               // snapshot.go
	root.AddCommand(newScreenCmd(a), newInputCmd(a)) // display.go
	root.AddCommand(newLazydCmd())                   // lazyd.go
	return root
}

// groupArgs makes a command that only groups others print its help when run
// bare and fail as a usage error on an unknown subcommand.
func groupArgs(c *cobra.Command) {
	c.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
		}
		return nil
	}
	c.RunE = func(cmd *cobra.Command, args []string) error { return cmd.Help() }
}

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %s", cmd.CommandPath(), what)
		}
		return nil
	}
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

func (a *app) tokenFile() string {
	dir := a.getenv(envDataDir)
	if dir == "" {
		dir = daemon.DefaultDataDir
	}
	return filepath.Join(dir, daemon.AdminTokenFile)
}

// client builds an API client from --addr and the first token found in
// --token, $WARREN_TOKEN and <data-dir>/admin-token.
func (a *app) client() *client.Client {
	token, src := a.token, "flag"
	if token == "" {
		token, src = a.getenv(envToken), "env"
	}
	if token == "" {
		token, src = "", ""
		if b, err := os.ReadFile(a.tokenFile()); err == nil {
			token, src = strings.TrimSpace(string(b)), "file"
		}
	}
	a.tokenSource = src
	opts := []client.Option{client.WithUserAgent("warren-cli")}
	if a.ca != "" {
		opts = append(opts, client.WithCAFile(a.ca))
	}
	return client.New(a.addr, token, opts...)
}
