// Command network measures warren's network paths against peers in the
// same run. Results and how to read them: docs/BENCHMARKS.md.
//
//	sudo go run ./bench/network                    # every part, -rounds 3 -dur 5s
//	sudo go run ./bench/network -parts ports -conc 1,8
//
// Parts:
//
//   - ports: HTTP requests to a server inside a sandbox with no network,
//     through the API's /ports path and through port-forward, against a
//     direct loopback connection to the same server (ports.go).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

type config struct {
	rounds    int
	dur, warm time.Duration
	conc      []int
	size      int // response body, bytes
	keep      bool
}

func main() {
	var cfg config
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds (report median and spread)")
	flag.DurationVar(&cfg.dur, "dur", 5*time.Second, "measured window per peer, concurrency and round")
	flag.DurationVar(&cfg.warm, "warm", time.Second, "warm-up before each window")
	conc := flag.String("conc", "1,8", "concurrencies (workers sending requests back to back)")
	flag.IntVar(&cfg.size, "size", 64, "ports: response body size in bytes")
	parts := flag.String("parts", "ports", "parts to run (ports)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary dir")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (warren's in-process servers included) to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/network:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	for _, s := range strings.Split(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench/network: -conc %q: want positive numbers\n", *conc)
			os.Exit(2)
		}
		cfg.conc = append(cfg.conc, n)
	}
	for _, p := range strings.Split(*parts, ",") {
		var err error
		switch p {
		case "ports":
			err = runPorts(cfg)
		default:
			err = fmt.Errorf("unknown part %q", p)
		}
		if err != nil {
			pprof.StopCPUProfile()
			fmt.Fprintln(os.Stderr, "bench/network:", err)
			os.Exit(1)
		}
	}
}
