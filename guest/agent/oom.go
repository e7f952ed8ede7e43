package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest/boot"
)

// watchMemory ends thrashing in the sandbox, as systemd-oomd does: a
// sandbox at its memory limit whose last reclaimable pages are its own
// programs' text (no swap in the guest) can refault them forever, every
// task stalled, without the kernel's OOM killer ever deciding: reclaim
// keeps "making progress". When the sandbox's cgroup has been at its
// limit with most of its time fully stalled on memory (PSI "full" over
// 10 seconds) the largest process in it is killed, as the kernel's OOM
// killer would have.
func watchMemory() {
	const (
		period   = 500 * time.Millisecond
		stallPct = 40.0 // full avg10
	)
	for range time.Tick(period) {
		max := readInt(filepath.Join(sandboxCg, "memory.max"))
		if max <= 0 { // "max": no limit set
			continue
		}
		if cur := readInt(filepath.Join(sandboxCg, "memory.current")); cur < max-max/20 {
			continue
		}
		if full := fullStall(filepath.Join(sandboxCg, "memory.pressure")); full < stallPct {
			continue
		}
		if pid, rss := largest(); pid > 0 {
			unix.Kill(pid, unix.SIGKILL)
			boot.Logf("sandbox thrashing at its memory limit: killed pid %d (%d KiB resident)", pid, rss)
			time.Sleep(2 * time.Second) // let the averages fall
		}
	}
}

// fullStall is the "full avg10" of a PSI file.
func fullStall(path string) float64 {
	b, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "full ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "avg10="); ok {
				x, _ := strconv.ParseFloat(v, 64)
				return x
			}
		}
	}
	return 0
}

// largest is the sandbox's process with the most resident memory.
func largest() (pid int, rss int64) {
	filepath.WalkDir(sandboxCg, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		for _, q := range procs(p) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/statm", q))
			f := strings.Fields(string(b))
			if len(f) < 2 {
				continue
			}
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			if kib := pages * 4; kib > rss {
				pid, rss = q, kib
			}
		}
		return nil
	})
	return pid, rss
}
