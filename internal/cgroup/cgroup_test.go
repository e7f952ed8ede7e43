package cgroup

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/testutil"
)

func TestParseMountinfo(t *testing.T) {
	hybrid := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime shared:9 - cgroup cgroup rw,freezer
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
`
	unified := `26 23 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
99 26 0:23 / /mnt/my\040cg rw - cgroup2 cgroup2 rw
`
	legacy := `35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
`
	for _, tc := range []struct {
		name, in string
		mode     Mode
		unified  string
		v1       map[string]string
	}{
		{"hybrid", hybrid, Hybrid, "/sys/fs/cgroup/unified", map[string]string{
			"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
			"memory": "/sys/fs/cgroup/memory", "freezer": "/sys/fs/cgroup/freezer", "name=systemd": "/sys/fs/cgroup/systemd"}},
		{"unified", unified, Unified, "/sys/fs/cgroup", map[string]string{}},
		{"legacy", legacy, Legacy, "", map[string]string{"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := parseMountinfo(bufio.NewScanner(strings.NewReader(tc.in)))
			if err != nil {
				t.Fatal(err)
			}
			if l.Mode != tc.mode || l.Unified != tc.unified {
				t.Errorf("got mode %v unified %q, want %v %q", l.Mode, l.Unified, tc.mode, tc.unified)
			}
			if len(l.V1) != len(tc.v1) {
				t.Errorf("got v1 %v, want %v", l.V1, tc.v1)
			}
			for k, v := range tc.v1 {
				if l.V1[k] != v {
					t.Errorf("v1 %s: got %q, want %q", k, l.V1[k], v)
				}
			}
			// One directory per hierarchy, cpu,cpuacct once.
			seen := map[string]bool{}
			for _, d := range l.Paths("/warren/x") {
				if seen[d.Path] {
					t.Errorf("Paths: %s twice", d.Path)
				}
				seen[d.Path] = true
				if want := tc.unified != "" && strings.HasPrefix(d.Path, tc.unified+"/"); d.V2 != want {
					t.Errorf("Paths: %+v: wrong V2", d)
				}
			}
		})
	}
	if _, err := parseMountinfo(bufio.NewScanner(strings.NewReader("1 2 0:1 / / rw - ext4 /dev/sda rw\n"))); err == nil {
		t.Error("no cgroup mount: got no error")
	}
	if got := unescape(`/mnt/my\040cg`); got != "/mnt/my cg" {
		t.Errorf("unescape: got %q", got)
	}
}

func TestKeyed(t *testing.T) {
	f := filepath.Join(t.TempDir(), "memory.events")
	os.WriteFile(f, []byte("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"), 0o644)
	fd, err := Open(filepath.Dir(f), "memory.events", os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	for key, want := range map[string]int64{"max": 12, "oom": 3, "oom_kill": 2, "oom_group_kill": 0, "absent": 0, "low": 0} {
		if got, err := fd.Keyed(key); err != nil || got != want {
			t.Errorf("%s: got %d %v, want %d", key, got, err, want)
		}
	}
	if a, b, err := fd.Keyed2("max", "oom_kill"); a != 12 || b != 2 || err != nil {
		t.Errorf("Keyed2: got %d %d %v", a, b, err)
	}
	os.WriteFile(filepath.Join(filepath.Dir(f), "memory.max"), []byte("max\n"), 0o644)
	m, _ := Open(filepath.Dir(f), "memory.max", os.O_RDWR)
	defer m.Close()
	if v, err := m.ReadInt(); v != -1 || err != nil {
		t.Errorf("max: got %d %v, want -1", v, err)
	}
}

// hierarchies are the freezable cgroup roots of this host to test in: the
// v1 freezer hierarchy and the cgroup2 mount, which has cgroup.freeze and
// cgroup.kill even with no controller in it (a hybrid host's empty one).
func hierarchies(t *testing.T) map[string]Dir {
	testutil.RequireRoot(t)
	l, err := Host()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Dir{}
	if p, ok := l.V1["freezer"]; ok {
		out["v1"] = Dir{Path: p}
	}
	if l.Unified != "" {
		out["v2"] = Dir{Path: l.Unified, V2: true}
	}
	if len(out) == 0 {
		testutil.Unavailable(t, "no freezable cgroup hierarchy")
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestKillTree kills trees of processes that resist in every way a
// process can: stopped, ignoring every catchable signal, blocked opening
// a FIFO, in a frozen child cgroup, forking; then removes the tree.
func TestKillTree(t *testing.T) {
	for name, root := range hierarchies(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			base := root.Child("warren-test-" + randomHex(4))
			if err := base.Mkdir(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { base.Destroy(ctx) })
			sub := base.Child("frozen")
			if err := sub.Mkdir(); err != nil {
				t.Fatal(err)
			}
			fifo := filepath.Join(t.TempDir(), "fifo")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			scripts := []struct {
				in   Dir
				argv []string
			}{
				{base, []string{"sh", "-c", "kill -STOP $$; sleep 100"}},
				{base, []string{"sh", "-c", "trap '' HUP INT QUIT TERM USR1 USR2 ALRM PIPE CHLD; while :; do sleep 1; done"}},
				{base, []string{"sh", "-c", "cat " + fifo}},
				{base, []string{"sh", "-c", "while :; do sleep 100 & sleep 0.01; done"}},
				{sub, []string{"sleep", "100"}},
			}
			for _, s := range scripts {
				cmd := exec.Command(s.argv[0], s.argv[1:]...)
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				go cmd.Wait()
				if err := s.in.Join(cmd.Process.Pid); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(200 * time.Millisecond)
			if err := sub.Freeze(ctx); err != nil {
				t.Fatal(err)
			}
			if pids, _ := base.TreeProcs(); len(pids) < len(scripts) {
				t.Fatalf("tree procs: %v, want at least %d", pids, len(scripts))
			}
			kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := base.Kill(kctx); err != nil {
				t.Fatal(err)
			}
			if pids, _ := base.TreeProcs(); len(pids) != 0 {
				t.Errorf("after kill: %v", pids)
			}
			if err := base.RemoveTree(); err != nil {
				t.Fatal(err)
			}
			if base.Exists() {
				t.Error("tree still there")
			}
		})
	}
}

// TestFreezeThaw freezes a cgroup and thaws it; a freeze that cannot
// finish in time leaves it thawed.
func TestFreezeThaw(t *testing.T) {
	for name, root := range hierarchies(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			d := root.Child("warren-test-" + randomHex(4))
			if err := d.Mkdir(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Destroy(ctx) })
			cmd := exec.Command("sleep", "100")
			cmd.Start()
			go cmd.Wait()
			d.Join(cmd.Process.Pid)
			if err := d.Freeze(ctx); err != nil {
				t.Fatal(err)
			}
			if st := procState(cmd.Process.Pid); st != "D" && st != "S" {
				t.Logf("frozen sleep state %q", st)
			}
			if err := d.Thaw(ctx); err != nil {
				t.Fatal(err)
			}
			done, cancel := context.WithTimeout(ctx, 0)
			defer cancel()
			if err := d.Freeze(done); err == nil {
				// The kernel may be quick enough to report it at once.
				d.Thaw(ctx)
			}
			if frozen(d) {
				t.Error("a failed freeze left the cgroup frozen")
			}
		})
	}
}

func frozen(d Dir) bool {
	if d.V2 {
		b, _ := os.ReadFile(filepath.Join(d.Path, "cgroup.freeze"))
		return strings.TrimSpace(string(b)) == "1"
	}
	b, _ := os.ReadFile(filepath.Join(d.Path, "freezer.state"))
	return strings.TrimSpace(string(b)) != "THAWED"
}

func procState(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+3 <= len(s) {
		return s[i+2 : i+3]
	}
	return ""
}
