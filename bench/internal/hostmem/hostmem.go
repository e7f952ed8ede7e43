// Package hostmem reads host memory the way the benchmark programs report
// it: /proc/meminfo (used = MemTotal - MemAvailable, what the host could
// not hand out without swapping), the proportional set size of processes
// (smaps_rollup's Pss: a page shared by n processes counts 1/n to each, so
// a sum over processes counts every page once), and a sampler of peaks.
package hostmem

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Meminfo is the part of /proc/meminfo the benchmarks use, in bytes.
type Meminfo struct {
	Total, Free, Available, Cached, Shmem int64
	// Kernel is the kernel's own: Slab + KernelStack + PageTables +
	// Percpu (a memory cgroup's shrinker slots are in Slab).
	Kernel int64
}

// Used is MemTotal - MemAvailable: memory the kernel could not free
// without swap (the page cache it can drop does not count).
func (m Meminfo) Used() int64 { return m.Total - m.Available }

// UsedWithCache is MemTotal - MemFree: Used plus the page cache.
func (m Meminfo) UsedWithCache() int64 { return m.Total - m.Free }

// Read reads /proc/meminfo.
func Read() (Meminfo, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return Meminfo{}, err
	}
	defer f.Close()
	var m Meminfo
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := parseKB(sc.Text())
		if !ok {
			continue
		}
		switch k {
		case "MemTotal":
			m.Total = v
		case "MemFree":
			m.Free = v
		case "MemAvailable":
			m.Available = v
		case "Cached":
			m.Cached = v
		case "Shmem":
			m.Shmem = v
		case "Slab", "KernelStack", "PageTables", "Percpu":
			m.Kernel += v
		}
	}
	return m, sc.Err()
}

// Parse reads a meminfo text (a guest's /proc/meminfo) into a map of
// bytes by key.
func Parse(text string) map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := parseKB(line); ok {
			out[k] = v
		}
	}
	return out
}

// parseKB parses "Key:   123 kB" into ("Key", 123*1024).
func parseKB(line string) (string, int64, bool) {
	k, rest, ok := strings.Cut(line, ":")
	if !ok {
		return "", 0, false
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", 0, false
	}
	v, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return "", 0, false
	}
	if len(f) > 1 && f[1] == "kB" {
		v <<= 10
	}
	return k, v, true
}

// Rollup is a process's smaps_rollup, in bytes.
type Rollup struct {
	RSS, PSS, PSSAnon, PSSFile, PSSShmem, SharedClean int64
}

// Add adds o to r.
func (r *Rollup) Add(o Rollup) {
	r.RSS += o.RSS
	r.PSS += o.PSS
	r.PSSAnon += o.PSSAnon
	r.PSSFile += o.PSSFile
	r.PSSShmem += o.PSSShmem
	r.SharedClean += o.SharedClean
}

// ReadRollup reads /proc/PID/smaps_rollup.
func ReadRollup(pid int) (Rollup, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return Rollup{}, err
	}
	var r Rollup
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := parseKB(line)
		if !ok {
			continue
		}
		switch k {
		case "Rss":
			r.RSS = v
		case "Pss":
			r.PSS = v
		case "Pss_Anon":
			r.PSSAnon = v
		case "Pss_File":
			r.PSSFile = v
		case "Pss_Shmem":
			r.PSSShmem = v
		case "Shared_Clean":
			r.SharedClean = v
		}
	}
	return r, nil
}

// SumRollups adds up the smaps_rollup of pids (those that have ended
// count nothing).
func SumRollups(pids []int) Rollup {
	var sum Rollup
	for _, pid := range pids {
		if r, err := ReadRollup(pid); err == nil {
			sum.Add(r)
		}
	}
	return sum
}

// DropCaches writes back dirty pages and drops the page cache, dentries
// and inodes (echo 3 > /proc/sys/vm/drop_caches), so that what follows
// starts from the same cold cache.
func DropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

// Sample is one reading of a Sampler.
type Sample struct {
	At   time.Duration // since the sampler started
	Host Meminfo
	PSS  Rollup // of the processes the sampler's pids function returned
	N    int    // how many processes that was
}

// Sampler reads meminfo and the smaps_rollup of a changing set of
// processes every interval, until Stop, and keeps each field's peak.
type Sampler struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	samples []Sample
}

// StartSampler samples every interval; pids says which processes' PSS to
// add up at each sample.
func StartSampler(interval time.Duration, pids func() []int) *Sampler {
	s := &Sampler{stop: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			m, _ := Read()
			ps := pids()
			smp := Sample{At: time.Since(start), Host: m, PSS: SumRollups(ps), N: len(ps)}
			s.mu.Lock()
			s.samples = append(s.samples, smp)
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends the sampling and returns the samples.
func (s *Sampler) Stop() []Sample {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// Peak is the largest value of f over samples, and the sample it was in.
func Peak(samples []Sample, f func(Sample) int64) (int64, Sample) {
	var best int64
	var at Sample
	for i, s := range samples {
		if v := f(s); i == 0 || v > best {
			best, at = v, s
		}
	}
	return best, at
}

// MiB formats bytes as MiB.
func MiB(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// Mapping is one mapping of a process (/proc/PID/smaps), in bytes.
type Mapping struct {
	Size, PSS int64
	Name      string // the file, [heap], or "" for anonymous memory
}

// Mappings reads /proc/PID/smaps.
func Mappings(pid int) ([]Mapping, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	var ms []Mapping
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			lo, hi, _ := strings.Cut(f[0], "-")
			a, err1 := strconv.ParseUint(lo, 16, 64)
			z, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			m := Mapping{Size: int64(z - a)}
			if len(f) >= 6 {
				m.Name = f[5]
			}
			ms = append(ms, m)
			continue
		}
		if k, v, ok := parseKB(line); ok && k == "Pss" && len(ms) > 0 {
			ms[len(ms)-1].PSS = v
		}
	}
	return ms, nil
}

// QEMUSplit is where a QEMU process's PSS is, by mapping: its guest's
// RAM, TCG's translation cache, layers mapped as virtio-pmem (EROFS
// files), and the rest (QEMU's heap, stacks, binary and libraries, the
// initramfs it mapped).
type QEMUSplit struct {
	GuestRAM, TCG, Layers, Rest int64
}

// SplitQEMU adds up the PSS of QEMU processes pids by mapping: the
// anonymous mapping of guestRAM bytes is the guest's memory, an
// anonymous one of tcgCache bytes (or a page less: QEMU's guard) TCG's
// translation cache (0: none).
func SplitQEMU(pids []int, guestRAM, tcgCache int64) QEMUSplit {
	var s QEMUSplit
	for _, pid := range pids {
		ms, err := Mappings(pid)
		if err != nil {
			continue
		}
		for _, m := range ms {
			switch {
			case m.Name == "" && m.Size == guestRAM:
				s.GuestRAM += m.PSS
			case m.Name == "" && tcgCache > 0 && m.Size <= tcgCache && m.Size >= tcgCache-64<<10:
				s.TCG += m.PSS
			case strings.HasSuffix(m.Name, ".erofs"):
				s.Layers += m.PSS
			default:
				s.Rest += m.PSS
			}
		}
	}
	return s
}

// Settle waits until host used memory (MemTotal - MemAvailable) has
// moved less than 2 MiB over a second, or max has passed: what removed
// sandboxes free is freed over a few seconds.
func Settle(max time.Duration) {
	deadline := time.Now().Add(max)
	prev, _ := Read()
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		m, _ := Read()
		if d := m.Used() - prev.Used(); d < 2<<20 && d > -2<<20 {
			return
		}
		prev = m
	}
}
