package fncall

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fncall/proto"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/image/imagetest"
	"github.com/warrenhq/warren/internal/qos"
	"github.com/warrenhq/warren/internal/testutil"
)

// fninitBin is warren-fninit built once for the package's tests.
var fninitBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fninit-")
	if err != nil {
		panic(err)
	}
	fninitBin = filepath.Join(dir, "warren-fninit")
	if out, err := exec.Command("../../scripts/build-helpers", dir).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build warren-fninit: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// layerMap is a Layers over layers built in the test.
type layerMap map[string]backend.Layer

func (m layerMap) Fetch(_ context.Context, digest string) (backend.Layer, error) {
	l, ok := m[digest]
	if !ok {
		return l, errdefs.New(errdefs.ErrNotFound, api.CodeLayerNotFound, "layer %s not found", digest)
	}
	return l, nil
}

// newService returns a started Service with the sh runtime on a busybox
// layer.
func newService(t testing.TB, pool PoolConfig) *Service {
	t.Helper()
	requireFn(t)
	l := imagetest.BusyboxLayer(t)
	rt := Runtime{Name: "sh", Env: "busybox@1", Source: "main.sh", Run: []string{"sh", "main.sh"}, Pool: pool}
	return startService(t, map[string]backend.Layer{"busybox@1": l}, rt)
}

func newServiceB(b *testing.B) *Service {
	return newService(b, PoolConfig{Min: 8, Max: 32})
}

func requireFn(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t)
	if err := checkCgroups(); err != nil {
		testutil.Unavailable(t, "%v", err)
	}
}

// startService starts a Service over envs (one layer each) with runtimes.
func startService(t testing.TB, envs map[string]backend.Layer, runtimes ...Runtime) *Service {
	t.Helper()
	images, layers := imagetest.Images{}, layerMap{}
	for name, l := range envs {
		images[name] = api.Image{Name: name, Layers: []string{l.Digest}}
		layers[l.Digest] = l
	}
	mounts := image.NewMounts(filepath.Join(t.TempDir(), "layers"))
	s, err := New(Config{
		Runtimes:     runtimes,
		Images:       images,
		Layers:       layers,
		Mounts:       mounts,
		StateDir:     t.TempDir(),
		CgroupParent: "/warren-test/fn-" + randomHex(3),
		Init:         fninitBin,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Available(); err != nil {
		testutil.Unavailable(t, "%v", err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Close()
		if err := mounts.Prune(); err != nil {
			t.Errorf("prune mounts: %v", err)
		}
	})
	return s
}

func sh(script string) api.FnRunRequest {
	return api.FnRunRequest{Runtime: "sh", Source: script}
}

func run(t *testing.T, s *Service, req api.FnRunRequest) api.FnResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := s.Run(ctx, req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func one(t *testing.T, res api.FnResult) api.FnCaseResult {
	t.Helper()
	if len(res.Cases) != 1 {
		t.Fatalf("want 1 case, got %+v", res)
	}
	return res.Cases[0]
}

func TestRunEcho(t *testing.T) {
	s := newService(t, PoolConfig{Min: 1, Max: 4})
	res := run(t, s, api.FnRunRequest{Runtime: "sh", Source: "read x; echo \"got $x\"; echo err >&2", Stdin: "hi\n"})
	c := one(t, res)
	if res.Status != api.FnOK || c.Status != api.FnOK || c.Stdout != "got hi\n" || c.Stderr != "err\n" {
		t.Fatalf("result %+v", res)
	}
}

func TestCasesAndCompare(t *testing.T) {
	s := newService(t, PoolConfig{Min: 1, Max: 4})
	want := func(s string) *string { return &s }
	req := sh("read a b; echo $((a+b))")
	req.Cases = []api.FnCase{
		{Stdin: "1 2\n", Expected: want("3")},         // trailing newline ignored by "lines"
		{Stdin: "2 2\n", Expected: want("5\n")},       // wrong
		{Stdin: "5 5\n", Expected: want("10   \n\n")}, // trailing blanks ignored
	}
	res := run(t, s, req)
	got := []string{res.Cases[0].Status, res.Cases[1].Status, res.Cases[2].Status}
	if strings.Join(got, ",") != "OK,WrongAnswer,OK" || res.Status != api.FnWrongAnswer {
		t.Fatalf("statuses %v, call %s", got, res.Status)
	}
	req.StopOnFail = true
	res = run(t, s, req)
	got = []string{res.Cases[0].Status, res.Cases[1].Status, res.Cases[2].Status}
	if strings.Join(got, ",") != "OK,WrongAnswer,Skipped" {
		t.Fatalf("stop on fail: %v", got)
	}
	req.StopOnFail, req.Compare = false, "exact"
	res = run(t, s, req)
	if res.Cases[0].Status != api.FnWrongAnswer { // "3\n" != "3"
		t.Fatalf("exact compare: %+v", res.Cases[0])
	}
}

func TestStatuses(t *testing.T) {
	s := newService(t, PoolConfig{Min: 2, Max: 8})
	lim := api.FnLimits{CPUTime: api.Duration(300 * time.Millisecond), WallTime: api.Duration(time.Second),
		Memory: 32 << 20, PIDs: 32, Output: 64 << 10, FileSize: 1 << 20}
	for _, tc := range []struct {
		name, script, status string
		wall                 time.Duration // default lim's
		check                func(api.FnCaseResult) error
	}{
		{"exit", "exit 3", api.FnNonZeroExit, 0, func(c api.FnCaseResult) error {
			if c.ExitCode != 3 {
				return fmt.Errorf("exit code %d", c.ExitCode)
			}
			return nil
		}},
		{"signal", "kill -SEGV $$", api.FnSignal, 0, func(c api.FnCaseResult) error {
			if c.Signal != "SIGSEGV" {
				return fmt.Errorf("signal %q", c.Signal)
			}
			return nil
		}},
		// A long wall limit, so CPU time is what ends it even on a busy
		// machine.
		{"cpu spin", "while :; do :; done", api.FnTimeLimit, 20 * time.Second, func(c api.FnCaseResult) error {
			if c.CPUMs < 300 || c.CPUMs > 1000 || !strings.Contains(c.Message, "CPU") {
				return fmt.Errorf("cpu_ms %d (%s), want just over 300", c.CPUMs, c.Message)
			}
			return nil
		}},
		{"sleep", "sleep 30", api.FnTimeLimit, 0, func(c api.FnCaseResult) error {
			if c.WallMs < 1000 || c.WallMs > 3000 || c.CPUMs > 100 {
				return fmt.Errorf("wall_ms %d cpu_ms %d", c.WallMs, c.CPUMs)
			}
			return nil
		}},
		{"infinite output", "yes", api.FnOutputLimit, 0, func(c api.FnCaseResult) error {
			if !c.StdoutTruncated || len(c.Stdout) != 64<<10 || c.StdoutBytes <= 64<<10 {
				return fmt.Errorf("stdout %d bytes kept of %d, truncated %v", len(c.Stdout), c.StdoutBytes, c.StdoutTruncated)
			}
			return nil
		}},
		{"huge file", "exec dd if=/dev/zero of=big bs=64k count=1000", api.FnOutputLimit, 0, func(c api.FnCaseResult) error {
			if c.Signal != "SIGXFSZ" {
				return fmt.Errorf("signal %q", c.Signal)
			}
			return nil
		}},
		{"memory balloon", `awk 'BEGIN { s = "x"; while (1) s = s s }'`, api.FnMemoryLimit, 20 * time.Second, func(c api.FnCaseResult) error {
			if c.PeakMemory < 24<<20 {
				return fmt.Errorf("peak %d", c.PeakMemory)
			}
			return nil
		}},
		// The pids limit refuses forks; the bomb's shells end on their
		// own. The message says what happened.
		{"fork bomb", "f() { f & f & wait; }; f", "", 0, func(c api.FnCaseResult) error {
			if c.Status == api.FnSandboxError || !strings.Contains(c.Message, "pids limit 32 reached") {
				return fmt.Errorf("status %s message %q", c.Status, c.Message)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := sh(tc.script)
			req.Limits = lim
			if tc.wall > 0 {
				req.Limits.WallTime = api.Duration(tc.wall)
			}
			if tc.status == api.FnMemoryLimit || tc.name == "fork bomb" {
				// Under TCG the balloon and the bomb are slow enough to
				// reach the CPU limit first (WARREN_TEST_TIME_SCALE; 1
				// elsewhere): the balloon copies twice its final size,
				// which took 1.25 s of CPU for 19 MB in a TCG guest, so
				// it gets a second of CPU before the scale.
				cpu := time.Duration(lim.CPUTime)
				if tc.status == api.FnMemoryLimit {
					cpu = time.Second
				}
				req.Limits.CPUTime = api.Duration(testutil.Scale(cpu))
			}
			c := one(t, run(t, s, req))
			if tc.status != "" && c.Status != tc.status {
				t.Fatalf("status %s (%s), want %s; %+v", c.Status, c.Message, tc.status, c)
			}
			if tc.check != nil {
				if err := tc.check(c); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	// Every hostile program above left the pool healthy.
	c := one(t, run(t, s, sh("echo ok")))
	if c.Status != api.FnOK || c.Stdout != "ok\n" {
		t.Fatalf("after the hostile runs: %+v", c)
	}
}

// TestIsolation checks what a program sees, in both shapes of root.
func TestIsolation(t *testing.T) {
	for _, writable := range []bool{false, true} {
		root := map[bool]string{false: "read-only", true: "overlay"}[writable]
		t.Run(root, func(t *testing.T) {
			requireFn(t)
			rt := Runtime{Name: "sh", Env: "busybox@1", Source: "main.sh", Run: []string{"sh", "main.sh"},
				WritableRoot: writable, Pool: PoolConfig{Min: 1, Max: 4}}
			s := startService(t, map[string]backend.Layer{"busybox@1": imagetest.BusyboxLayer(t)}, rt)
			testIsolation(t, s, root)
		})
	}
}

func testIsolation(t *testing.T, s *Service, root string) {
	// The host's tree is beneath the container's root, shadowed: none of
	// it can be reached by path, from / or through pid 1.
	hostPath := s.cfg.StateDir
	c := one(t, run(t, s, sh(`
echo "uid=$(id -u) host=$(hostname) pwd=$(pwd)"
test -e `+hostPath+` && echo hosttree=visible || echo hosttree=hidden
(cd /../../.. && ls -d `+hostPath[1:]+` 2>/dev/null) && echo dotdot=escapes || echo dotdot=stays
ls /proc/1/root/ 2>/dev/null | head -1 | grep -q . && echo pid1root=visible || echo pid1root=hidden
echo "ifaces=$(ls /sys/class/net 2>/dev/null; cat /proc/self/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | tr '\n' ,)"
echo "procs=$(ls /proc | grep -c '^[0-9]')"
echo "devs=$(ls /dev | tr '\n' ,)"
touch /tmp/mark /box/mark /dev/shm/mark && echo writes=ok
touch /etc/mark 2>&1 | grep -q Read-only && echo etc=rofs || echo etc=writable
touch /dev/mark 2>/dev/null && echo dev=writable || echo dev=ro
echo x > /dev/null && head -c 4 /dev/zero | wc -c | tr -d ' ' | sed 's/^/zero=/'
unshare -U true 2>/dev/null && echo userns=yes || echo userns=no
mount -t tmpfs x /tmp 2>/dev/null && echo mount=yes || echo mount=no
mknod /tmp/null c 1 3 2>/dev/null && echo mknod=yes || echo mknod=no
ls /sys 2>/dev/null | head -1
grep -E '^(CapBnd|CapEff|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\t ' ' '
echo "cgroup=$(cut -d: -f3 /proc/self/cgroup | sort -u | tr '\n' ,)"
echo "apparmor=$(cat /proc/self/attr/apparmor/current 2>/dev/null)"
echo -1000 2>/dev/null > /proc/self/oom_score_adj; echo "oom=$(cat /proc/self/oom_score_adj)"
echo 'exec unconfined' 2>/dev/null > /proc/self/attr/apparmor/exec && echo "apparmor-exec=$(cat /proc/self/attr/apparmor/current 2>/dev/null)"
`)))
	// Where the host runs AppArmor every run is under warren's profile,
	// which it cannot change for its next exec; WARREN_TEST_APPARMOR=1
	// (the cgroup-v2 guest) demands AppArmor.
	switch {
	case guard.AppArmorEnabled():
		if !strings.Contains(c.Stdout, "apparmor="+guard.AppArmorProfile+" (enforce)\n") || strings.Contains(c.Stdout, "apparmor-exec=") {
			t.Errorf("want the run under %s, unable to leave it:\n%s", guard.AppArmorProfile, c.Stdout)
		}
	case os.Getenv("WARREN_TEST_APPARMOR") == "1":
		t.Error("WARREN_TEST_APPARMOR=1, but this kernel does not run AppArmor")
	}
	// Both refuse nobody a write in /etc; only one says the filesystem is
	// read-only.
	etc := map[string]string{"read-only": "etc=rofs", "overlay": "etc=writable"}[root]
	for _, want := range []string{"uid=65534 host=fn pwd=/box", "ifaces=lo,", "devs=fd,full,null,random,shm,stderr,stdin,stdout,urandom,zero,",
		"hosttree=hidden", "dotdot=stays", "pid1root=hidden", "writes=ok", etc, "dev=ro", "zero=4", "userns=no", "mount=no", "mknod=no",
		"CapBnd: 0000000000000000", "CapEff: 0000000000000000", "NoNewPrivs: 1", "Seccomp: 2",
		"cgroup=/,", "oom=1000"} {
		if !strings.Contains(c.Stdout, want+"\n") {
			t.Errorf("want %q in:\n%s", want, c.Stdout)
		}
	}
	if l, err := s.launcher(); err != nil {
		t.Error(err)
	} else if adj, err := qos.ReadOOMScoreAdj(l.cmd.Process.Pid); err != nil || adj != qos.OOMScoreLatency {
		t.Errorf("the launcher's oom_score_adj %d, %v; want %d, before the agent's", adj, err, qos.OOMScoreLatency)
	}
	// Only the shell and its children are visible: not fninit.
	if strings.Contains(c.Stdout, "procs=0\n") || !strings.Contains(c.Stdout, "procs=") {
		t.Errorf("procs: %s", c.Stdout)
	}
	if got := s.Runtimes(context.Background())[0].Root; got != root {
		t.Errorf("runtime listing says root %q, want %q", got, root)
	}
	// A fresh container per call: nothing from the last one.
	c = one(t, run(t, s, sh("ls /tmp/mark /box/mark /dev/shm/mark /etc/mark 2>&1; true")))
	if strings.Count(c.Stdout, "No such file") != 4 {
		t.Fatalf("files leaked between calls: %q", c.Stdout)
	}
}

func TestConcurrentCalls(t *testing.T) {
	s := newService(t, PoolConfig{Min: 2, Max: 16})
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Run(context.Background(), api.FnRunRequest{Runtime: "sh", Source: "echo $1", Args: []string{fmt.Sprint(i)}})
			if err != nil {
				if errdefs.Code(err) == api.CodeFnOverloaded {
					return
				}
				errs <- err
				return
			}
			if c := res.Cases[0]; c.Status != api.FnOK || c.Stdout != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("call %d: %+v", i, c)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestOverloadRefuses(t *testing.T) {
	s := newService(t, PoolConfig{Min: 1, Max: 2, QueueWait: api.Duration(200 * time.Millisecond), QueueMax: 2})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, refused int
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Run(context.Background(), sh("sleep 1"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errdefs.Code(err) == api.CodeFnOverloaded && errors.Is(err, errdefs.ErrExhausted) && errdefs.RetryAfter(err) > 0:
				refused++
			default:
				t.Errorf("call: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok < 2 || refused < 4 || ok+refused != 10 {
		t.Fatalf("ok %d refused %d", ok, refused)
	}
}

func TestBadRequests(t *testing.T) {
	s := newService(t, PoolConfig{Min: 0, Max: 2})
	for _, req := range []api.FnRunRequest{
		{Runtime: "nope", Source: "x"},
		{Runtime: "sh"},
		{Runtime: "sh", Source: "x", Files: []api.FnFile{{Path: "../x", Content: "y"}}},
		{Runtime: "sh", Source: "x", Files: []api.FnFile{{Path: "/etc/x", Content: "y"}}},
		{Runtime: "sh", Source: "x", Limits: api.FnLimits{CPUTime: api.Duration(time.Hour)}},
		{Runtime: "sh", Source: "x", Compare: "fuzzy"},
		{Runtime: "sh", Source: "x", Stdin: "!", StdinEncoding: "base64"},
		{Runtime: "sh", Source: "x", Env: map[string]string{"A=B": "c"}},
	} {
		_, err := s.Run(context.Background(), req)
		if !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%+v: want a 400/404 error, got %v", req, err)
		}
	}
}

// BenchmarkRun measures one call end to end through the service (no HTTP),
// the pool refilling in the background.
func BenchmarkRun(b *testing.B) {
	s := newServiceB(b)
	req := sh("echo 1")
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := s.Run(context.Background(), req)
			if err != nil || res.Status != api.FnOK {
				b.Errorf("%v %+v", err, res)
			}
		}
	})
}

// TestDebianRuntimes runs the default python3, c and cpp runtimes on the
// real Debian images (scripts/build-runtime-images).
func TestDebianRuntimes(t *testing.T) {
	requireFn(t)
	py, gcc := imagetest.DebianLayer(t, "python"), imagetest.DebianLayer(t, "gcc")
	var rts []Runtime
	for _, rt := range DefaultRuntimes {
		if rt.Name != "sh" {
			rt.Env = map[string]string{"python3": "python", "c": "gcc", "cpp": "gcc"}[rt.Name]
			rts = append(rts, rt)
		}
	}
	s := startService(t, map[string]backend.Layer{"python": py, "gcc": gcc}, rts...)
	want := func(s string) *string { return &s }

	res := run(t, s, api.FnRunRequest{Runtime: "python3", Source: "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n",
		Cases: []api.FnCase{{Stdin: "1 2 3", Expected: want("6")}, {Stdin: "10 20", Expected: want("31")}}})
	if res.Status != api.FnWrongAnswer || res.Cases[0].Status != api.FnOK || res.Cases[1].Status != api.FnWrongAnswer {
		t.Fatalf("python3: %+v", res)
	}
	res = run(t, s, api.FnRunRequest{Runtime: "python3", Source: "x = ' ' * (512 << 20)\n",
		Limits: api.FnLimits{Memory: 64 << 20}})
	if res.Status != api.FnMemoryLimit {
		t.Fatalf("python3 balloon: %+v", res)
	}

	res = run(t, s, api.FnRunRequest{Runtime: "cpp", Source: "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a*b<<\"\\n\";}\n",
		Cases: []api.FnCase{{Stdin: "6 7", Expected: want("42")}, {Stdin: "3 3", Expected: want("9")}}})
	if res.Status != api.FnOK || res.Compile == nil || res.Compile.Status != api.FnOK {
		t.Fatalf("cpp: %+v", res)
	}
	res = run(t, s, api.FnRunRequest{Runtime: "c", Source: "int main() { return oops; }\n"})
	if res.Status != api.FnCompileError || !strings.Contains(res.Compile.Stderr, "oops") || res.Cases[0].Status != api.FnSkipped {
		t.Fatalf("c compile error: %+v", res)
	}
	res = run(t, s, api.FnRunRequest{Runtime: "c", Source: "int main() { int *p = 0; return *p; }\n"})
	if res.Status != api.FnSignal || res.Cases[0].Signal != "SIGSEGV" {
		t.Fatalf("c segfault: %+v", res)
	}
}

// TestThousandConcurrentCalls: a thousand calls at once from one client
// each complete or are refused with 429 and a Retry-After; none hangs, none
// fails otherwise, and the pool serves normally afterwards.
func TestThousandConcurrentCalls(t *testing.T) {
	s := newService(t, PoolConfig{Min: 4, Max: 16, QueueWait: api.Duration(2 * time.Second), QueueMax: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, refused int
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Run(ctx, api.FnRunRequest{Runtime: "sh", Source: "echo $1", Args: []string{fmt.Sprint(i)}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && res.Status == api.FnOK && res.Cases[0].Stdout == fmt.Sprintf("%d\n", i):
				ok++
			case errdefs.Code(err) == api.CodeFnOverloaded && errdefs.RetryAfter(err) > 0:
				refused++
			default:
				t.Errorf("call %d: %v %+v", i, err, res)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d completed, %d refused with 429", ok, refused)
	if ok+refused != 1000 || ok < 16 || refused == 0 {
		t.Fatalf("ok %d refused %d", ok, refused)
	}
	if c := one(t, run(t, s, sh("echo after"))); c.Status != api.FnOK {
		t.Fatalf("after the burst: %+v", c)
	}
}

// TestPlatformFault: when the container's init dies under a run (a
// platform fault, not the program's), the case says SandboxError, the rest
// of the call too, and the pool goes on.
func TestPlatformFault(t *testing.T) {
	s := newService(t, PoolConfig{Min: 1, Max: 4})
	done := make(chan api.FnResult)
	go func() {
		req := sh("sleep 10")
		req.Cases = []api.FnCase{{}, {}}
		done <- run(t, s, req)
	}()
	killed := false
	for deadline := time.Now().Add(10 * time.Second); !killed && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		boxes, _ := boxCgroups(t, s, "cgroup.procs")
		for _, f := range boxes {
			b, _ := os.ReadFile(f)
			pids := strings.Fields(string(b))
			if len(pids) < 2 { // an idle container: fninit alone
				continue
			}
			for _, pid := range pids {
				comm, _ := os.ReadFile("/proc/" + pid + "/comm")
				if strings.TrimSpace(string(comm)) == "warren-fninit" {
					var p int
					fmt.Sscan(pid, &p)
					killed = syscall.Kill(p, syscall.SIGKILL) == nil
				}
			}
		}
	}
	if !killed {
		t.Fatal("found no busy container to break")
	}
	res := <-done
	if res.Status != api.FnSandboxError || len(res.Cases) != 2 || res.Cases[0].Status != api.FnSandboxError || res.Cases[1].Status != api.FnSandboxError {
		t.Fatalf("want SandboxError for both cases: %+v", res)
	}
	if c := one(t, run(t, s, sh("echo fine"))); c.Status != api.FnOK || c.Stdout != "fine\n" {
		t.Fatalf("after the fault: %+v", c)
	}
}

// TestLauncherRestart kills the launcher: its containers die with it, and
// the next calls get a new launcher and fresh containers.
func TestLauncherRestart(t *testing.T) {
	s := newService(t, PoolConfig{Min: 2, Max: 4})
	if c := one(t, run(t, s, sh("echo before"))); c.Status != api.FnOK {
		t.Fatalf("before: %+v", c)
	}
	s.launchMu.Lock()
	old := s.launch
	s.launchMu.Unlock()
	// The processes of its containers: the pool may start a new launcher
	// and new containers as soon as this one is dead.
	inBoxes := func() map[string]bool {
		procs, _ := boxCgroups(t, s, "cgroup.procs")
		pids := map[string]bool{}
		for _, f := range procs {
			b, _ := os.ReadFile(f)
			for _, p := range strings.Fields(string(b)) {
				pids[p] = true
			}
		}
		return pids
	}
	before := inBoxes()
	if len(before) == 0 {
		t.Fatal("no container process before the launcher is killed")
	}
	if err := old.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-old.dead
	// Its containers died with it: none of their processes is left.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left := 0
		for p := range inBoxes() {
			if before[p] {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d processes left in the dead launcher's containers", left)
		}
	}
	for i := 0; i < 4; i++ { // more calls than the dead pool held
		if c := one(t, run(t, s, sh("echo after"))); c.Status != api.FnOK || c.Stdout != "after\n" {
			t.Fatalf("call %d after the launcher died: %+v", i, c)
		}
	}
	s.launchMu.Lock()
	restarted := s.launch != old && s.launch.alive()
	s.launchMu.Unlock()
	if !restarted {
		t.Error("no new launcher")
	}
}

// TestLauncherBadMake sends the launcher a malformed MAKE: it answers
// EINVAL and goes on making containers.
func TestLauncherBadMake(t *testing.T) {
	s := newService(t, PoolConfig{Min: -1, Max: 2})
	if c := one(t, run(t, s, sh("echo first"))); c.Status != api.FnOK {
		t.Fatalf("first: %+v", c)
	}
	l, err := s.launcher()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := s.netns.get()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var e proto.Encoder
	bad, _ := e.Frame(proto.TypeMake).Str("/nonexistent").Done() // the rest of the setup missing
	ch := make(chan made, 1)
	l.mu.Lock()
	l.waiting = append(l.waiting, ch)
	_, _, err = l.conn.WriteMsgUnix(bad, unix.UnixRights(int(ns.Fd())), nil)
	l.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if m := <-ch; !errors.Is(m.err, syscall.EINVAL) || m.sock != nil {
		t.Fatalf("malformed make: %+v", m)
	}
	if c := one(t, run(t, s, sh("echo after"))); c.Status != api.FnOK || c.Stdout != "after\n" || !l.alive() {
		t.Fatalf("after: %+v", c)
	}
}

// TestCgroupsRecycled: sequential calls reuse the cgroups of the
// containers before them (each emptied first), and the accounting stays
// per call.
func TestCgroupsRecycled(t *testing.T) {
	s := newService(t, PoolConfig{Min: 1, Max: 2})
	seen := map[string]bool{}
	for i := 0; i < 12; i++ {
		req := sh("head -c 8000000 /dev/zero > /tmp/x && echo ok")
		c := one(t, run(t, s, req))
		if c.Status != api.FnOK || c.PeakMemory < 7<<20 || c.PeakMemory > 64<<20 {
			t.Fatalf("call %d: %+v", i, c)
		}
		dirs, _ := boxCgroups(t, s, "")
		for _, d := range dirs {
			seen[filepath.Base(d)] = true
		}
	}
	if !peakResets(t, s) {
		// v2 before Linux 6.12: a box's peak is its cgroup's lifetime
		// one, so cgroups are not recycled (the accounting above is
		// what holds).
		t.Logf("memory.peak does not reset on this kernel: %d cgroups for 12 calls, not recycled by design", len(seen))
		return
	}
	if len(seen) > 4 {
		t.Errorf("%d cgroups made for 12 sequential calls: not recycled", len(seen))
	}
}

// TestCPUCap: by default a run's processes stay in the daemon's cgroup in
// the cpu hierarchy, without a cap; a runtime with CPUs gets a cgroup of
// its own per container, capped, and its run is slowed to the cap.
func TestCPUCap(t *testing.T) {
	requireFn(t)
	l := imagetest.BusyboxLayer(t)
	free := Runtime{Name: "sh", Env: "busybox@1", Source: "main.sh", Run: []string{"sh", "main.sh"}, Pool: PoolConfig{Min: 1, Max: 2}}
	capped := free
	capped.Name, capped.CPUs = "sh-capped", 0.25
	s := startService(t, map[string]backend.Layer{"busybox@1": l}, free, capped)
	if v2, _ := cgroupMode(); v2 {
		testCPUCapV2(t, s)
		return
	}
	parent, err := cpuDir(s.cfg.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	hierarchy := strings.TrimSuffix(parent, s.cfg.CgroupParent)
	comounted := filepath.Base(hierarchy) == "cpuacct"
	// The box has a cgroup namespace of its own (/proc/self/cgroup says
	// "/" inside): the host reads the run's cgroup while it sleeps, by a
	// sleep's argument no other process has.
	runIn := func(rt string) (string, api.FnCaseResult) {
		t.Helper()
		marker := fmt.Sprintf("0.%d", 3000+time.Now().UnixNano()%1000)
		req := sh("sleep " + marker + "\nn=0; while [ $n -lt 60000 ]; do n=$((n+1)); done")
		req.Runtime = rt
		cg := make(chan string, 1)
		go func() {
			for deadline := time.Now().Add(testutil.Scale(10 * time.Second)); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				if pid := pidOf("sleep " + marker); pid > 0 {
					cg <- cpuCgroupOf(strconv.Itoa(pid))
					return
				}
			}
			cg <- "(the run's sleep never seen)"
		}()
		c := one(t, run(t, s, req))
		if c.Status != api.FnOK {
			t.Fatalf("%s: %+v", rt, c)
		}
		return <-cg, c
	}
	ours := cpuCgroupOf("self")
	got, free1 := runIn("sh")
	if comounted && !strings.HasPrefix(got, s.cfg.CgroupParent+"/fn-") || !comounted && got != ours {
		t.Errorf("uncapped run in cpu cgroup %q, want this process's %q (cpu and cpuacct one hierarchy: %v)", got, ours, comounted)
	}
	got, capped1 := runIn("sh-capped")
	if !strings.HasPrefix(got, s.cfg.CgroupParent+"/fn-") {
		t.Fatalf("capped run in cpu cgroup %q, want one of its own under %s", got, s.cfg.CgroupParent)
	}
	quota, err := os.ReadFile(filepath.Join(hierarchy, got, "cpu.cfs_quota_us"))
	if err != nil || strings.TrimSpace(string(quota)) != "25000" {
		t.Errorf("capped container's quota %q (%v), want 25000", quota, err)
	}
	checkCapped(t, free1, capped1)
}

// pidOf is the host pid of a process whose command line is cmdline, or 0.
func pidOf(cmdline string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ") == cmdline {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	return 0
}

// cpuCgroupOf is process pid's cgroup in the v1 cpu hierarchy, as the
// host sees it ("self" for this process).
func cpuCgroupOf(pid string) string {
	b, _ := os.ReadFile("/proc/" + pid + "/cgroup")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && (f[1] == "cpu" || f[1] == "cpu,cpuacct") {
			return f[2]
		}
	}
	return ""
}

// checkCapped: at a quarter of a CPU the same work takes about 4x its CPU
// time.
func checkCapped(t *testing.T, free1, capped1 api.FnCaseResult) {
	t.Helper()
	if free1.CPUMs < 40 || capped1.CPUMs < 40 {
		t.Fatalf("the loop is too short to tell: %d and %d ms of CPU", free1.CPUMs, capped1.CPUMs)
	}
	t.Logf("capped: %d ms wall for %d ms CPU; uncapped: %d ms wall for %d ms CPU", capped1.WallMs, capped1.CPUMs, free1.WallMs, free1.CPUMs)
	// Load only stretches a run's wall time, so the capped run's stretch
	// is a safe check; the uncapped run's is not (a loaded machine, such
	// as another test package running beside this one, stretches it
	// 5-10x): that it has no cap is checked by its cgroup above.
	if capped1.WallMs < 2*capped1.CPUMs {
		t.Errorf("capped: %d ms wall for %d ms CPU, want at least 2x at a quarter of a CPU", capped1.WallMs, capped1.CPUMs)
	}
}

// boxCgroups lists the boxes' cgroup directories (or file name in each)
// on either cgroup version: the pids hierarchy's on v1, the unified one's
// on v2 (capped boxes in the parent, uncapped ones in its shared child).
func boxCgroups(t *testing.T, s *Service, file string) ([]string, error) {
	t.Helper()
	v2, err := cgroupMode()
	if err != nil {
		t.Fatal(err)
	}
	var parents []string
	if v2 {
		d, err := cgroupV2Dir(s.cfg.CgroupParent)
		if err != nil {
			t.Fatal(err)
		}
		parents = []string{d, filepath.Join(d, sharedDir)}
	} else {
		d, err := cgroupV1Dir("pids", s.cfg.CgroupParent)
		if err != nil {
			t.Fatal(err)
		}
		parents = []string{d}
	}
	var out []string
	for _, p := range parents {
		m, err := filepath.Glob(filepath.Join(p, "fn-*", file))
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}

// testCPUCapV2 is TestCPUCap on cgroup v2: every box has one cgroup, an
// uncapped one in the shared child of the service's parent (no cpu
// controller of its own), a capped one directly in the parent with cpu.max.
func testCPUCapV2(t *testing.T, s *Service) {
	script := `grep '^0::' /proc/self/cgroup | cut -d: -f3
n=0; while [ $n -lt 60000 ]; do n=$((n+1)); done`
	runIn := func(rt string) (string, api.FnCaseResult) {
		t.Helper()
		req := sh(script)
		req.Runtime = rt
		c := one(t, run(t, s, req))
		if c.Status != api.FnOK {
			t.Fatalf("%s: %+v", rt, c)
		}
		return strings.TrimSpace(c.Stdout), c
	}
	parent := "/" + strings.Trim(s.cfg.CgroupParent, "/")
	got, free1 := runIn("sh")
	if !strings.HasPrefix(got, parent+"/"+sharedDir+"/fn-") {
		t.Errorf("uncapped run in cgroup %q, want one under %s/%s", got, parent, sharedDir)
	}
	dir, err := cgroupV2Dir(got)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cpu.max")); err == nil {
		t.Errorf("uncapped box cgroup %s has the cpu controller", got)
	}
	got, capped1 := runIn("sh-capped")
	if !strings.HasPrefix(got, parent+"/fn-") {
		t.Fatalf("capped run in cgroup %q, want one directly under %s", got, parent)
	}
	dir, _ = cgroupV2Dir(got)
	max, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
	if err != nil || strings.TrimSpace(string(max)) != "25000 100000" {
		t.Errorf("capped container's cpu.max %q (%v), want 25000 100000", max, err)
	}
	checkCapped(t, free1, capped1)
}

// peakResets reports whether box cgroups can reset their peak memory:
// always on v1, on v2 where memory.peak is writable (Linux >= 6.12).
func peakResets(t *testing.T, s *Service) bool {
	v2, err := cgroupMode()
	if err != nil {
		t.Fatal(err)
	}
	if !v2 {
		return true
	}
	d, err := cgroupV2Dir(s.cfg.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(d, sharedDir, "memory.peak"))
	return err == nil && fi.Mode()&0o200 != 0
}
