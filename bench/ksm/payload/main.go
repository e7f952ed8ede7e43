// Command payload is what each sandbox of bench/ksm runs: it maps MB of
// anonymous memory, fills it as many sandboxes of one environment would
// (the same interpreter, libraries and data in each: every page's
// content is a function of its index alone), makes UNIQUE percent of the
// pages its own, and sleeps.
//
//	payload MB UNIQUE SEED
package main

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) != 4 {
		os.Stderr.WriteString("usage: payload MB UNIQUE SEED\n")
		os.Exit(2)
	}
	mb, _ := strconv.Atoi(os.Args[1])
	unique, _ := strconv.Atoi(os.Args[2])
	seed, _ := strconv.ParseUint(os.Args[3], 10, 64)
	const page = 4096
	m, err := syscall.Mmap(-1, 0, mb<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	own := rand.New(rand.NewPCG(seed, seed))
	for p := 0; p < len(m)/page; p++ {
		src := rand.New(rand.NewPCG(uint64(p), 42)) // the shared content
		if own.IntN(100) < unique {
			src = own
		}
		b := m[p*page : (p+1)*page]
		for i := 0; i < page; i += 8 {
			binary.LittleEndian.PutUint64(b[i:], src.Uint64())
		}
	}
	os.Stdout.WriteString("ready\n")
	for {
		time.Sleep(time.Hour)
		_ = m[0]
	}
}
