// Command network measures sandbox networking against peers in the same
// run, each part printing medians and spreads over rounds and the ratio
// to its peer:
//
//		sudo go run ./bench/network -rounds 5                 # every part
//		sudo go run ./bench/network -parts create,egress
//
//	  - create: sandbox creation through `warren up` with network none,
//	    allowlist and open, against the same create with no network field
//	    (target: allowlist within 1.3x of none).
//	  - egress: TCP throughput and connection rate from a network namespace
//	    through the node's firewall (allowlist and open), against a plain
//	    veth + NAT namespace (target >= 0.9x), to a fake internet on
//	    203.0.113.0/24 in a namespace of its own (the route checked first:
//	    nothing leaves the machine).
//	  - dns: queries per second, p50, p99 and CPU per query through the
//	    node's DNS proxy (cache on and off) against the same queries sent
//	    straight to its upstream, a DNS server on 127.0.0.1 (dns.go).
//	  - ports: HTTP requests/s, p50 and p99 to a server inside a sandbox
//	    with no network through the API's /ports path and through
//	    port-forward, against a direct loopback connection to the same
//	    server (ports.go; -ports-* flags).
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
)

var parts = map[string]func(rounds int) error{
	"create": runCreate,
	"dns":    runDNS,
	"egress": runEgress,
	"ports":  runPorts,
}

func main() {
	rounds := flag.Int("rounds", 3, "rounds (report median and spread)")
	only := flag.String("parts", "", "comma-separated parts to run (default all: "+strings.Join(partNames(), ",")+")")
	flag.Parse()
	names := partNames()
	if *only != "" {
		names = strings.Split(*only, ",")
	}
	for _, n := range names {
		f, ok := parts[n]
		if !ok {
			fmt.Fprintf(os.Stderr, "bench/network: unknown part %q (have %s)\n", n, strings.Join(partNames(), ", "))
			os.Exit(2)
		}
		fmt.Printf("== %s\n", n)
		if err := f(*rounds); err != nil {
			fmt.Fprintf(os.Stderr, "bench/network: %s: %v\n", n, err)
			os.Exit(1)
		}
	}
}

func partNames() []string {
	var out []string
	for n := range parts {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// medianSpread prints "median (min-max)" of xs.
func medianSpread(xs []float64, format string) string {
	if len(xs) == 0 {
		return "-"
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf(format+" ("+format+"-"+format+")", m, s[0], s[len(s)-1])
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
