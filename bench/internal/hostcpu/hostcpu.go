// Package hostcpu reads the machine's CPU time from /proc/stat, for
// benchmarks that report how busy the host was or wait for it to settle.
package hostcpu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Times returns the host's busy and total CPU time so far, all CPUs, in
// clock ticks (/proc/stat's first line, user to steal: idle and iowait
// are not busy; guest time is already in user's).
func Times() (busy, total int64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: %q", line)
	}
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %q", line)
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, nil
}

// Busy is the fraction of the host's CPU time that was busy over d,
// measured now.
func Busy(d time.Duration) (float64, error) {
	b0, t0, err := Times()
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	b1, t1, err := Times()
	if err != nil {
		return 0, err
	}
	if t1 == t0 {
		return 0, nil
	}
	return float64(b1-b0) / float64(t1-t0), nil
}

// WaitQuiet waits until a second passes with the host's CPU at most
// below busy, or for max, and returns how long it waited and the last
// second's figure: work the kernel finishes after a burst (freeing
// cgroups, RCU callbacks) must not be counted against what is measured
// next.
func WaitQuiet(below float64, max time.Duration) (time.Duration, float64, error) {
	start := time.Now()
	for {
		b, err := Busy(time.Second)
		if err != nil || b <= below || time.Since(start) >= max {
			return time.Since(start), b, err
		}
	}
}
