package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is one process of the benchmark: this binary re-executed in a
// role. It prints one JSON line (its ready message) on stdout once it
// serves, and exits when its stdin closes, so that it never outlives the
// driver.
type child struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	log     string // its stderr
	ready   readyMsg
	stopped sync.Once
}

// readyMsg is what a role says once it serves.
type readyMsg struct {
	Addr  string   `json:"addr,omitempty"`  // API address (etcd client URL, apiserver, relay)
	Addrs []string `json:"addrs,omitempty"` // node addresses (barenodes)
	Pprof string   `json:"pprof,omitempty"` // net/http/pprof address
	Err   string   `json:"err,omitempty"`
}

// startChild starts this binary as role with args, logging to dir, and
// waits up to timeout for its ready line.
func startChild(dir, role string, timeout time.Duration, args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, role+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	cmd := exec.Command(exe, append([]string{"-role", role, "-dir", dir}, args...)...)
	cmd.Stderr = lf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{name: role, cmd: cmd, stdin: stdin, log: logPath}
	got := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadBytes('\n')
		if err != nil {
			got <- fmt.Errorf("no ready line: %w", err)
			return
		}
		if err := json.Unmarshal(line, &c.ready); err != nil {
			got <- fmt.Errorf("ready line %q: %w", line, err)
			return
		}
		if c.ready.Err != "" {
			got <- fmt.Errorf("%s", c.ready.Err)
			return
		}
		got <- nil
		io.Copy(io.Discard, stdout)
	}()
	select {
	case err = <-got:
	case <-time.After(timeout):
		err = fmt.Errorf("not ready after %v", timeout)
	}
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("%s: %w (log: %s)\n%s", role, err, logPath, tail(logPath, 2000))
	}
	return c, nil
}

// stop closes the child's stdin (it shuts down) and waits for it, killing
// it after 20 s. Only the first call does anything.
func (c *child) stop() { c.stopped.Do(c.shutdown) }

func (c *child) shutdown() {
	c.stdin.Close()
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go runs on.
const clockTick = 100

// cpuTime returns the user+system CPU time process pid has used so far
// (all its threads).
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name may hold spaces: fields start after the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// utime and stime are fields 14 and 15 of the whole line, 12 and 13
	// after the name.
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTick
}

// machineBusy returns the CPU time every process of the machine has used
// so far (all cores, /proc/stat: everything but idle and iowait).
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 8 { // guest time is counted in user already
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * time.Second / clockTick
}
