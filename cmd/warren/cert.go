package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/internal/pki"
)

// newCertCmd is `warren cert`: a cluster CA and the certificates it signs,
// so that a cluster runs over TLS without another tool.
func newCertCmd(a *app) *cobra.Command {
	cert := &cobra.Command{Use: "cert", Aliases: []string{"certs"}, Short: "Make a cluster CA and the certificates of apiservers and agents"}
	groupArgs(cert)
	initCmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Make a cluster CA: DIR/ca.crt and DIR/ca.key",
		Long: `Make a cluster CA in DIR: DIR/ca.crt (give it to clients and agents as --ca or
WARREN_CA) and DIR/ca.key (mode 0600: keep it where only the operator reads it).
An existing CA is never overwritten. Keys are ECDSA P-256; the CA lasts 10 years.`,
		Args: exactArgs(1, "one directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := pki.InitCA(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s\n", filepath.Join(args[0], pki.CACert))
			fmt.Fprintf(a.stderr, "CA made: %s (share it) and %s (keep it private)\n",
				filepath.Join(args[0], pki.CACert), filepath.Join(args[0], pki.CAKey))
			return nil
		},
	}
	issue := &cobra.Command{
		Use:   "issue DIR NAME [NAME...]",
		Short: "Make a certificate signed by DIR's CA for DNS names and IP addresses",
		Long: `Make a certificate signed by the CA in DIR, valid for every NAME (DNS names and
IP addresses, as subject alternative names) as a server and as a client
certificate: DIR/NAME.crt and DIR/NAME.key (0600), named by the first NAME.
Give them to "warren apiserver" or "warren agent" as --tls-cert and --tls-key.
Include every name callers dial: the load balancer's name for apiservers, the
advertised address for agents. Certificates last 2 years; issue again to renew.`,
		Example: `  warren cert init /etc/warren/pki
  warren cert issue /etc/warren/pki api.warren.internal 10.0.0.10
  warren cert issue /etc/warren/pki rack2-node7 10.0.2.7`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usagef("%s takes a CA directory and one or more names", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			crt, err := pki.Issue(args[0], args[1:]...)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s\n", crt)
			fmt.Fprintf(a.stderr, "certificate for %v: %s, key %s\n", args[1:], crt, crt[:len(crt)-len(".crt")]+".key")
			return nil
		},
	}
	cert.AddCommand(initCmd, issue)
	return cert
}
