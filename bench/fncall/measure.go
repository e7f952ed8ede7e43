package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// sample is one peer's figures for one job at one concurrency in one
// round.
type sample struct {
	n        int // calls that succeeded inside the window
	calls    int // every call of the cell, warm-up and drain included
	failed   int // of calls: errors and wrong answers
	firstErr string
	window   time.Duration
	rate     float64 // n per second of window
	p50, p99 time.Duration
	cpuGroup time.Duration // per call: this process's cgroup (the driver and every local peer's processes) and the peer's daemon
	cpuHost  time.Duration // per call: the machine's busy time
	others   float64       // cores busy with anything else during the cell (host minus cgroup)
}

// maxStretch bounds each phase's wait for enough calls, so that a peer
// that hangs cannot stall the run.
const maxStretch = time.Minute

// drive runs conc workers calling p back to back and measures the calls
// that end inside a window. Warm-up lasts warm and at least until conc
// calls have ended, so that the workers, started together, are out of
// step; the window lasts dur and at least until max(minCalls, conc) calls
// have ended in it (one call per worker on average: at high concurrency a
// shorter window would catch part of a wave). Workers start no call after
// the window but finish the one they are in; CPU is counted over the
// whole cell (warm-up, window, drain) and divided by every call made in
// it.
func drive(ctx context.Context, p *peer, j *job, conc int, warm, dur time.Duration, minCalls int, g *cpuGroup) sample {
	cpu := func() time.Duration {
		d := g.usage()
		if p.cpu != nil {
			d += p.cpu()
		}
		return d
	}
	start := time.Now()
	cpu0, host0 := cpu(), hostCPU()
	var (
		mu           sync.Mutex
		ended        []time.Time // successful calls' ends, and their latencies
		lat          []time.Duration
		s            sample
		completed    atomic.Int64 // calls ended, failed ones too
		stopped      atomic.Bool
		from, winEnd time.Time
	)
	// waitFor polls cond until it holds, deadline passes or ctx ends.
	waitFor := func(cond func() bool, deadline time.Time) {
		for !cond() && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		waitFor(func() bool { return false }, start.Add(warm))
		waitFor(func() bool { return completed.Load() >= int64(conc) }, time.Now().Add(maxStretch))
		from = time.Now()
		base := completed.Load()
		waitFor(func() bool { return false }, from.Add(dur))
		need := int64(max(minCalls, conc))
		waitFor(func() bool { return completed.Load()-base >= need }, time.Now().Add(maxStretch))
		winEnd = time.Now()
		stopped.Store(true)
	}()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var myEnd []time.Time
			var mine []time.Duration
			calls, failed := 0, 0
			var firstErr error
			for !stopped.Load() && ctx.Err() == nil {
				t := time.Now()
				out, err := p.call(context.WithoutCancel(ctx), j) // an interrupt lets it finish
				end := time.Now()
				completed.Add(1)
				if err == nil && out != j.want {
					err = fmt.Errorf("stdout %q, want %q", out, j.want)
				}
				calls++
				if err != nil {
					failed++
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				myEnd = append(myEnd, end)
				mine = append(mine, end.Sub(t))
			}
			mu.Lock()
			ended = append(ended, myEnd...)
			lat = append(lat, mine...)
			s.calls += calls
			s.failed += failed
			if s.firstErr == "" && firstErr != nil {
				s.firstErr = firstErr.Error()
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	<-done
	cpu1, host1 := cpu(), hostCPU()
	s.others = max(0, (host1-host0-(cpu1-cpu0)).Seconds()/time.Since(start).Seconds())
	in := lat[:0]
	for i, d := range lat {
		if !ended[i].Before(from) && !ended[i].After(winEnd) {
			in = append(in, d)
		}
	}
	lat = in
	s.n = len(lat)
	s.window = winEnd.Sub(from)
	s.rate = float64(s.n) / s.window.Seconds()
	if s.calls > 0 {
		s.cpuGroup = (cpu1 - cpu0) / time.Duration(s.calls)
		s.cpuHost = (host1 - host0) / time.Duration(s.calls)
	}
	if len(lat) > 0 {
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		s.p50 = lat[len(lat)/2]
		s.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return s
}

// clockTick is USER_HZ, the unit of /proc's CPU times (100 on Linux).
const clockTick = 100

// procCPU is a process's own utime+stime (all its threads), or 0 if it
// is gone.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name may hold spaces: fields start after the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 15 {
		return 0
	}
	var sum int64
	for _, i := range []int{11, 12} { // utime stime
		v, _ := strconv.ParseInt(f[i], 10, 64)
		sum += v
	}
	return time.Duration(sum) * time.Second / clockTick
}

// childrenCPU is the utime+stime of pid's live children named comm.
func childrenCPU(pid int, comm string) time.Duration {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var sum time.Duration
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, c := range strings.Fields(string(b)) {
			name, _ := os.ReadFile("/proc/" + c + "/comm")
			if strings.TrimSpace(string(name)) == comm {
				n, _ := strconv.Atoi(c)
				sum += procCPU(n)
			}
		}
	}
	return sum
}

// hostCPU is the machine's busy time so far, all CPUs: /proc/stat's user,
// nice, system, irq, softirq and steal.
func hostCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var sum int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		sum += v
	}
	return time.Duration(sum) * time.Second / clockTick
}
