package node

import (
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/testutil"
)

// fakeMem makes a's meter read memory figures the test sets (bytes in
// use of an 8 GiB host with no swap), and samples once.
func fakeMem(a *Agent, used *atomic.Int64) {
	a.meter.mu.Lock()
	a.meter.readMem = func() (memInfo, error) {
		return memInfo{Total: 8 << 30, Available: 8<<30 - used.Load()}, nil
	}
	a.meter.mu.Unlock()
	a.meter.sample(time.Now())
}

// TestAdmissionRealUse: a create is refused (429 node_full, saying why)
// when the memory in use, plus what recent creates may still grow into,
// would pass the host's memory less the reserve, whatever the requests
// add up to; and a latency create when the cores busy outside the
// best-effort class pass Limits.CPUBusy, while a best-effort create is
// still admitted then. Requests alone are bounded by the overcommit
// ratios: 50x the cores by default.
func TestAdmissionRealUse(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), func(c *Config) {
		c.Limits = Limits{Cores: 2, Reserve: 1 << 30, CreateGrowth: 300 << 20}
	})
	if got := a.Status().Capacity.CPU; got != 100 {
		t.Errorf("cpu capacity %v, want 50 x 2 cores", got)
	}
	var used atomic.Int64
	used.Store(6 << 30)
	fakeMem(a, &used)
	req := api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{CPU: 0.1, Memory: 512 << 20}}
	// 6 GiB in use of 7 GiB allowed: three creates of 300 MiB growth fit,
	// the fourth would pass it.
	for i := 0; i < 3; i++ {
		mustCreate(t, a, req)
	}
	_, err := a.Create(ctx, req)
	if !errors.Is(err, errdefs.ErrExhausted) || errdefs.Code(err) != api.CodeNodeFull || !strings.Contains(err.Error(), "memory in use") {
		t.Fatalf("fourth create: %v; want node_full for memory in use", err)
	}
	// Their growth is held for 30 s; once it is not, the memory in use
	// is what counts.
	a.mu.Lock()
	for i := range a.recent.entries {
		a.recent.entries[i].at = time.Now().Add(-time.Minute)
	}
	a.mu.Unlock()
	mustCreate(t, a, req)
	used.Store(7<<30 - 100<<20)
	a.meter.sample(time.Now())
	if _, err := a.Create(ctx, req); errdefs.Code(err) != api.CodeNodeFull {
		t.Fatalf("create with 100 MiB left: %v; want node_full", err)
	}
	used.Store(2 << 30)
	a.meter.sample(time.Now())

	// CPU: 1.9 cores busy outside the best-effort class, of 2.
	a.meter.mu.Lock()
	a.meter.cpu, a.meter.cpuBE, a.meter.cpuKnown = 1.9, 0.05, true
	a.meter.mu.Unlock()
	if _, err := a.Create(ctx, req); errdefs.Code(err) != api.CodeNodeFull || !strings.Contains(err.Error(), "cores busy") {
		t.Fatalf("latency create on a busy node: %v; want node_full for cpu", err)
	}
	be := req
	be.QoS = api.QoSBestEffort
	sb := mustCreate(t, a, be)
	if sb.QoS != api.QoSBestEffort {
		t.Errorf("sandbox qos %q", sb.QoS)
	}
	n := a.Status()
	if n.InUse == nil || n.InUse.CPU != 1.9 || n.InUse.Memory != 2<<30 || n.InUse.MemoryLimit != 7<<30 || n.InUse.Overcommit.CPU != 50 {
		t.Errorf("status in use: %+v", n.InUse)
	}
	if n.QoS == nil || n.QoS.BestEffort != 1 || n.QoS.Latency != 4 || !strings.HasPrefix(n.QoS.OOMOrder, "best-effort 1000, latency 500, agent ") {
		t.Errorf("status qos: %+v", n.QoS)
	}

	// Requests: 0.1 cores x 1000 would pass 100 cores.
	a.meter.mu.Lock()
	a.meter.cpu = 0
	a.meter.mu.Unlock()
	big := api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{CPU: 2, Memory: 16 << 20}}
	a.mu.Lock()
	a.reserved.cpu = 99
	a.mu.Unlock()
	if _, err := a.Create(ctx, big); errdefs.Code(err) != api.CodeNodeFull || !strings.Contains(err.Error(), "reserved (50x overcommit)") {
		t.Fatalf("create past 50x the cores: %v", err)
	}
	a.mu.Lock()
	a.reserved.cpu -= 99
	a.mu.Unlock()
	// Bad classes are refused and leave nothing reserved.
	bad := req
	bad.QoS = "batch"
	before := a.Status().Usage
	if _, err := a.Create(ctx, bad); errdefs.Code(err) != "invalid" && !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("qos batch: %v; want 400", err)
	}
	if after := a.Status().Usage; after != before {
		t.Errorf("a refused create changed the usage: %+v -> %+v", before, after)
	}
}

// TestMemoryPressure: past the memory limit the node pauses best-effort
// sandboxes, one per step, then (the pressure still on) evicts them,
// saying why, and never touches a latency one, however much memory is in
// use.
func TestMemoryPressure(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), func(c *Config) { c.Limits = Limits{Reserve: 1 << 30} })
	var used atomic.Int64
	used.Store(1 << 30)
	fakeMem(a, &used)
	lat := mustCreate(t, a, api.CreateSandboxRequest{})
	be1 := mustCreate(t, a, api.CreateSandboxRequest{QoS: api.QoSBestEffort})
	be2 := mustCreate(t, a, api.CreateSandboxRequest{QoS: api.QoSBestEffort})
	if did := a.relievePressure(ctx); did != "" {
		t.Fatalf("without pressure: %s", did)
	}
	used.Store(7<<30 + 1)
	a.meter.sample(time.Now())
	var steps []string
	for i := 0; i < 4; i++ {
		steps = append(steps, a.relievePressure(ctx))
		if i == 1 {
			for _, id := range []string{be1.ID, be2.ID} {
				sb, err := a.Get(ctx, id)
				if err != nil || sb.State != api.StatePaused || sb.Pause == nil || sb.Pause.By != PausedByMemoryPressure {
					t.Errorf("best-effort sandbox after two steps: %+v, %v; want it paused by %s", sb, err, PausedByMemoryPressure)
				}
			}
		}
	}
	if !strings.HasPrefix(steps[0], "paused ") || !strings.HasPrefix(steps[1], "paused ") || steps[0] == steps[1] ||
		!strings.HasPrefix(steps[2], "evicted ") || !strings.HasPrefix(steps[3], "evicted ") || steps[2] == steps[3] {
		t.Fatalf("under pressure: %q; want both best-effort sandboxes paused, then both evicted, one each step", steps)
	}
	if did := a.relievePressure(ctx); did != "" {
		t.Errorf("with only a latency sandbox left: %s", did)
	}
	for _, id := range []string{be1.ID, be2.ID} {
		_, err := a.Get(ctx, id)
		if err == nil || !strings.Contains(err.Error(), "evicted: node memory pressure") {
			t.Errorf("evicted sandbox %s: %v; want its reason", id, err)
		}
	}
	if sb, err := a.Get(ctx, lat.ID); err != nil || sb.State != api.StateRunning {
		t.Errorf("latency sandbox: %+v, %v; want it running", sb, err)
	}
}

// TestIdleReclaim: a sandbox no call has used for ReclaimIdle has its
// memory reclaimed once, not again while its idle spell lasts, and again
// after a call and another idle spell; a sandbox in use is left alone.
func TestIdleReclaim(t *testing.T) {
	ctx := context.Background()
	a := newAgent(t, t.TempDir(), func(c *Config) { c.ReclaimIdle = 300 * time.Millisecond })
	sb := mustCreate(t, a, api.CreateSandboxRequest{})
	count := func() int64 {
		n := a.Status().InUse.Reclaim
		if n == nil {
			t.Fatal("no reclaim status")
		}
		return n.Sandboxes
	}
	if n := count(); n != 0 {
		t.Fatalf("%d reclaims right after the create", n)
	}
	waitFor(t, "the idle sandbox's reclaim", func() bool { return count() == 1 })
	time.Sleep(500 * time.Millisecond)
	if n := count(); n != 1 {
		t.Errorf("%d reclaims within one idle spell, want 1", n)
	}
	if _, err := a.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reclaim after a call and another idle spell", func() bool { return count() == 2 })
	r := a.Status().InUse.Reclaim
	if r.Mechanism == "" || r.Mechanism == "off" || r.IdleAfter.D() != 300*time.Millisecond || r.DAMON == "" {
		t.Errorf("reclaim status %+v", r)
	}
}

// RaiseOpenFiles lifts the limit to fs.nr_open (root may), and the
// default sandbox cap follows the limit.
func TestRaiseOpenFiles(t *testing.T) {
	testutil.RequireRoot(t)
	var before unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &before); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &before)
	b, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if !hasSysResource(t) {
		want = before.Max // the most it may: soft up to hard
	}
	got, err := RaiseOpenFiles()
	var now unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &now)
	if err != nil || got != want || now.Cur != want {
		t.Errorf("RaiseOpenFiles = %d, %v; limit now %d/%d; want %d", got, err, now.Cur, now.Max, want)
	}
	// A low limit caps the node's sandboxes.
	unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: openFilesSpare + openFilesPerSandbox*100, Max: now.Max})
	if l := (Limits{}).withDefaults(); l.Sandboxes != 100 {
		t.Errorf("sandbox cap at %d open files = %d, want 100", openFilesSpare+openFilesPerSandbox*100, l.Sandboxes)
	}
}

// hasSysResource reports whether this process has CAP_SYS_RESOURCE
// (root in some VMs and containers does not).
func hasSysResource(t *testing.T) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}
