package hostile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/qos"
	"github.com/warrenhq/warren/internal/testutil"
)

// Nothing of the platform listens where a sandbox can reach it: the
// apiserver's port on the sandbox's loopback is the sandbox's own (closed),
// no unix socket of the platform is in its filesystem, and the abstract
// socket namespace it sees is its own network namespace's.
func testForgedCalls(t *testing.T, p *platform) {
	id := p.sandbox(t)
	_, port, _ := strings.Cut(p.up.Addr, ":")
	r := p.sh(t, id, "/attack connect 127.0.0.1:"+port+" localhost:"+port+"; "+
		"find / -xdev -type s 2>/dev/null | head; echo sockets-in-fs-done; "+
		"tail -n +2 /proc/net/unix | wc -l")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) < 3 || lines[0] != "connect: 0 connected" {
		t.Errorf("the apiserver's port from inside: %q", r.Stdout)
	}
	if lines[1] != "sockets-in-fs-done" {
		t.Errorf("unix sockets in the sandbox's filesystem: %q", r.Stdout)
	}
	if n, _ := strconv.Atoi(lines[len(lines)-1]); n != 0 {
		t.Errorf("%d unix sockets visible in /proc/net/unix: %q", n, r.Stdout)
	}
}

// A canary planted on the host (in warren's data directory, beside its
// logs and state), the admin token and the node's own token are nowhere a
// sandbox can read: not its files, not any process's environment or
// command line it can see.
func testSearchForSecrets(t *testing.T, p *platform) {
	canary := "warren-canary-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.WriteFile(filepath.Join(p.up.DataDir, "answers.txt"), []byte(canary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := []string{canary, p.up.Token()}
	id := p.sandbox(t)
	// The patterns sit in a directory the search skips, so the search
	// never finds its own pattern file or command line.
	var pat strings.Builder
	for _, s := range secrets {
		pat.WriteString(s + "\n")
	}
	if err := p.c.WriteFile(context.Background(), id, "/.pat/p", 0o600, strings.NewReader(pat.String())); err != nil {
		t.Fatal(err)
	}
	r := p.sh(t, id, "grep -rlF -f /.pat/p --exclude-dir=.pat --exclude-dir=proc --exclude-dir=sys / 2>/dev/null; "+
		"cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline /proc/self/mountinfo 2>/dev/null | grep -cF -f /.pat/p; "+
		"grep -rlF -f /.pat/p /sys/fs/cgroup 2>/dev/null; true")
	if out := strings.TrimSpace(r.Stdout); out != "0" {
		t.Errorf("secrets found in the sandbox: %q (stderr %q)", out, r.Stderr)
	}
}

// An agent that replaces /bin/sh and busybox (every command of the
// image) breaks only its own sandbox: the layer under it is read-only,
// so another sandbox of the same image, and a new one, run the real
// ones. The platform's `exec --sh` never ran the sandbox's shell: it
// still works in the victim.
func testOverwriteShell(t *testing.T, p *platform) {
	victim := p.sandbox(t)
	other := p.sandbox(t)
	p.sh(t, victim, "for f in /bin/sh /bin/busybox; do rm -f $f; printf '#!/attack\\n' > $f; chmod 755 $f; done; true")
	if r := p.sh(t, victim, "echo $((6*7)) $0 ${BASH_VERSION%%.*}"); r.Stdout != "42 sh 5\n" {
		t.Errorf("exec --sh in the victim: %q, %q", r.Stdout, r.Stderr)
	}
	for _, id := range []string{other, p.sandbox(t)} {
		r := p.sh(t, id, "echo $((6*7)); readlink -f /bin/sh; wc -c < /bin/busybox")
		f := strings.Fields(r.Stdout)
		if len(f) != 3 || f[0] != "42" || f[1] != "/bin/busybox" || f[2] == "10" {
			t.Errorf("sandbox %s after another overwrote its shell: %q, %q", id, r.Stdout, r.Stderr)
		}
	}
}

// An agent that rewrites its /etc/passwd (nobody as uid 0, a user of its
// own as root) does not choose whom the platform's `exec -u` runs as:
// names resolve from the environment's layers.
func testForgeUser(t *testing.T, p *platform) {
	id := p.sandbox(t)
	p.sh(t, id, "echo 'nobody:x:0:0::/:/bin/sh' > /etc/passwd; echo 'grader:x:0:0::/:/bin/sh' >> /etc/passwd")
	r, err := p.c.Exec(context.Background(), id, api.ExecRequest{Argv: []string{"id", "-u"}, User: "nobody"})
	if err != nil || r.Stdout != "65534\n" {
		t.Errorf("exec -u nobody after the rewrite: %+v, %v; want uid 65534", r, err)
	}
	if r, err := p.c.Exec(context.Background(), id, api.ExecRequest{Argv: []string{"id", "-u"}, User: "grader"}); err == nil {
		t.Errorf("exec -u grader (only in the sandbox's own /etc/passwd): %+v, want invalid_argument", r)
	}
}

// The verdict does not run on the agent's binaries: an agent that
// replaced its shell and planted a link to the grader's expected output
// beside its answer gets checked by `warren sandbox verify`'s clean room,
// where the shell is the image's and the link never arrives.
func testVerifyCleanRoom(t *testing.T, p *platform) {
	id := p.sandbox(t)
	p.sh(t, id, "mkdir -p /work && echo 41 > /work/answer && ln -s /etc/expected /work/expected && "+
		"for f in /bin/sh /bin/busybox; do rm -f $f; printf '#!/attack\\n' > $f; chmod 755 $f; done; true")
	if r, err := p.c.Exec(context.Background(), id, api.ExecRequest{Argv: []string{"sh", "-c", "echo $((6*7))"}}); err == nil && r.Stdout == "42\n" {
		t.Fatalf("the agent's shell still answers: the overwrite did not happen")
	}
	// The platform's shell is its own: it still answers (its builtins;
	// the commands it runs are the agent's, hence the clean room).
	if r, err := p.c.Exec(context.Background(), id, api.ExecRequest{Cmd: "echo $((6*7))"}); err != nil || r.Stdout != "42\n" {
		t.Errorf("exec --sh after the agent replaced its shell: %+v, %v", r, err)
	}
	res, err := p.c.Verify(context.Background(), id, client.VerifyRequest{Image: "busybox", Copy: []string{"/work"},
		Exec: api.ExecRequest{Cmd: "echo 42 > /etc/expected; echo $((6*7)); cat /work/answer; ls /work"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Stdout != "42\n41\nanswer\n" {
		t.Errorf("the check in the clean room: exit %d, %q, %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if len(res.Skipped) != 1 || !strings.HasPrefix(res.Skipped[0], "work/expected: ") {
		t.Errorf("skipped %q, want the link to /etc/expected", res.Skipped)
	}
	if _, err := p.c.GetSandbox(context.Background(), res.Verifier); err == nil {
		t.Errorf("the verifier %s outlived the check", res.Verifier)
	}
}

// A recursive grep of /proc and /sys from several sandboxes at once (a
// crash DSec saw) for 20 s (it does not end by itself: /proc/self/root
// leads back to / and into /proc again): the node answers afterwards
// (checked by the suite after every attack).
func testGrepProcSys(t *testing.T, p *platform) {
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		id := p.sandbox(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := p.c.Exec(context.Background(), id, api.ExecRequest{
				Cmd:     "timeout 20 grep -r -s -c warren /proc /sys > /dev/null; echo done",
				Timeout: api.Duration(testutil.Scale(2 * time.Minute)),
			})
			if err != nil || !strings.Contains(r.Stdout, "done") {
				t.Errorf("grep in %s: %+v, %v", id, r, err)
			}
		}()
	}
	wg.Wait()
}

// `yes` for seconds through exec: the captured output stops at the cap,
// the command is told so, and warren's memory stays flat.
func testOutputFlood(t *testing.T, p *platform) {
	id := p.sandbox(t)
	before := rss(t, p.up.Cmd.Process.Pid)
	r, err := p.c.Exec(context.Background(), id, api.ExecRequest{Cmd: "timeout 10 yes; echo end >&2", MaxOutput: 1 << 20,
		Timeout: api.Duration(testutil.Scale(time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	after := rss(t, p.up.Cmd.Process.Pid)
	t.Logf("yes wrote %d MB; captured %d bytes; warren up RSS %d -> %d MiB", r.StdoutBytes>>20, len(r.Stdout), before>>20, after>>20)
	if !r.StdoutTruncated || len(r.Stdout) > 1<<20 || r.StdoutBytes < 100<<20 {
		t.Errorf("output flood: truncated %v, captured %d, written %d", r.StdoutTruncated, len(r.Stdout), r.StdoutBytes)
	}
	if after > before+64<<20 {
		t.Errorf("warren up grew from %d to %d MiB under the flood", before>>20, after>>20)
	}
}

// rss is process pid's resident memory in bytes.
func rss(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// A fork bomb under a pids limit stays inside: the neighbour answers,
// and the bomb's sandbox is deleted promptly.
func testForkBomb(t *testing.T, p *platform) {
	id := p.sandbox(t, func(r *api.CreateSandboxRequest) { r.Resources.PIDs = 64 })
	neighbour := p.sandbox(t)
	p.c.Exec(context.Background(), id, api.ExecRequest{Cmd: "b() { b | b & }; b", Timeout: api.Duration(5 * time.Second)})
	if r := p.sh(t, neighbour, "echo fine"); r.Stdout != "fine\n" {
		t.Errorf("neighbour during the bomb: %+v", r)
	}
	start := time.Now()
	if err := p.c.DeleteSandbox(context.Background(), id); err != nil {
		t.Fatalf("delete the bomb's sandbox: %v", err)
	}
	t.Logf("deleted in %v", time.Since(start))
}

// A memory balloon past the sandbox's limit is killed inside it: the
// sandbox and the node go on.
func testMemoryBalloon(t *testing.T, p *platform) {
	id := p.sandbox(t, func(r *api.CreateSandboxRequest) { r.Resources.Memory = 64 << 20 })
	r := p.sh(t, id, "head -c 536870912 /dev/zero | sort > /dev/null; echo exit=$?")
	if strings.TrimSpace(r.Stdout) == "exit=0" {
		t.Errorf("a 512 MiB balloon under 64 MiB finished: %+v", r)
	}
	if r := p.sh(t, id, "echo still"); r.Stdout != "still\n" {
		t.Errorf("the sandbox after its balloon: %+v", r)
	}
}

// Writing past a disk limit fails inside the sandbox (EDQUOT or ENOSPC)
// at the limit, not at the node's: the sandbox goes on, and a neighbour
// still writes.
func testFillDisk(t *testing.T, p *platform) {
	id := p.sandbox(t, func(r *api.CreateSandboxRequest) { r.Resources.Disk = 64 << 20 })
	neighbour := p.sandbox(t)
	r := p.sh(t, id, "dd if=/dev/zero of=/fill bs=1M count=256 2>&1; echo exit=$?; ls -l /fill | awk '{ print \"size=\" $5 }'")
	t.Logf("%s", r.Stdout)
	if !strings.Contains(r.Stdout, "exit=1") || !(strings.Contains(r.Stdout, "quota exceeded") || strings.Contains(r.Stdout, "No space left")) {
		t.Errorf("256 MiB under a 64 MiB disk limit: %q", r.Stdout)
	}
	var size int64
	for _, f := range strings.Fields(r.Stdout) {
		if v, ok := strings.CutPrefix(f, "size="); ok {
			size, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if size > 80<<20 {
		t.Errorf("wrote %d bytes under a 64 MiB limit", size)
	}
	if r := p.sh(t, id, "rm /fill && echo again > /again && cat /again"); r.Stdout != "again\n" {
		t.Errorf("the sandbox after filling its disk: %+v", r)
	}
	if r := p.sh(t, neighbour, "dd if=/dev/zero of=/n bs=1M count=100 2>/dev/null; wc -c < /n"); strings.TrimSpace(r.Stdout) != "104857600" {
		t.Errorf("a neighbour's 100 MiB write: %q", r.Stdout)
	}
}

// setsid and a double fork do not outlive the sandbox: after delete, no
// process of it is left on the host.
func testEscapeDeletion(t *testing.T, p *platform) {
	id := p.sandbox(t)
	marker := strconv.Itoa(1000000 + int(time.Now().UnixNano()%999999))
	p.sh(t, id, "setsid sleep "+marker+" </dev/null >/dev/null 2>&1 & "+
		"(sh -c 'sleep "+marker+" </dev/null >/dev/null 2>&1 &' &) ; "+
		"nohup sleep "+marker+" </dev/null >/dev/null 2>&1 & sleep 1; echo started")
	// Background processes that hold nothing of the exec's live on (that
	// is how an agent starts a server); at least one of these must have.
	n := hostProcs(t, "sleep "+marker)
	t.Logf("%d of 3 escapees running before delete", n)
	if n == 0 {
		t.Fatalf("no escapee running before delete; in the sandbox: %s", p.sh(t, id, "ps -o pid,ppid,args").Stdout)
	}
	if err := p.c.DeleteSandbox(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if n := hostProcs(t, "sleep "+marker); n != 0 {
		t.Errorf("%d processes of the sandbox survived its deletion", n)
	}
}

// hostProcs counts the host's processes whose command line is cmdline.
func hostProcs(t *testing.T, cmdline string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Join(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), " ") == cmdline {
			n++
		}
	}
	return n
}

// hostPid is the host pid of the process whose command line is cmdline.
func hostPid(t *testing.T, cmdline string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Join(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), " ") == cmdline {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	t.Fatalf("no process %q on the host", cmdline)
	return 0
}

// Another sandbox's processes and files are out of reach: its processes
// are not in this one's pid namespace (signal and ptrace by their host
// pids fail), its files are nowhere in this one's tree, and this
// sandbox's own init cannot be traced either.
func testOtherSandboxes(t *testing.T, p *platform) {
	victim := p.sandbox(t)
	attacker := p.sandbox(t)
	marker := strconv.Itoa(2000000 + int(time.Now().UnixNano()%999999))
	p.sh(t, victim, "echo secret-"+marker+" > /root/secret-"+marker+"; (sleep "+marker+" </dev/null >/dev/null 2>&1 &); echo ok")
	pid := strconv.Itoa(hostPid(t, "sleep "+marker))
	r := p.sh(t, attacker, "/attack kill "+pid+"; /attack ptrace "+pid+"; /attack ptrace 1; "+
		"/attack procmem,procroot; "+
		"find / -name 'secret-"+marker+"' 2>/dev/null | grep -v '^/proc' | head -3; echo done")
	// Its init is not dumpable: its /proc files are closed to root inside.
	want := "kill: ESRCH\nptrace: ESRCH\nptrace: EPERM\nprocmem: EACCES\nprocroot: EACCES\ndone\n"
	if r.Stdout != want {
		t.Errorf("from the attacker: %q, want %q", r.Stdout, want)
	}
	if r := p.sh(t, victim, "cat /root/secret-"+marker); r.Stdout != "secret-"+marker+"\n" {
		t.Errorf("the victim's file after the attack: %q", r.Stdout)
	}
}

// An agent racing the platform's exec (CVE-2019-5736 against runc: open
// the entering process's /proc/<pid>/exe for writing, or ptrace it while
// it still holds the host's privileges) while a verifier runs commands in
// its sandbox: the launcher is non-dumpable from its first instruction
// and the trusted shell is a sealed memfd, so nothing of the platform is
// ever opened for writing or traced.
func testExecRace(t *testing.T, p *platform) {
	id := p.sandbox(t)
	race := make(chan *api.ExecResult, 1)
	go func() {
		r, err := p.c.Exec(context.Background(), id, api.ExecRequest{Argv: []string{"/attack", "exerace", "5"},
			Timeout: api.Duration(testutil.Scale(time.Minute))})
		if err != nil {
			t.Errorf("exerace: %v", err)
		}
		race <- r
	}()
	time.Sleep(200 * time.Millisecond)
	n := 0
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); n++ {
		req := api.ExecRequest{Argv: []string{"true"}}
		if n%2 == 1 {
			req = api.ExecRequest{Cmd: "true"}
		}
		if r, err := p.c.Exec(context.Background(), id, req); err != nil || r.ExitCode != 0 {
			t.Fatalf("exec during the race: %+v, %v", r, err)
		}
	}
	r := <-race
	if r == nil {
		return
	}
	var seen, scans, platform, breaches int
	if _, err := fmt.Sscanf(strings.TrimSpace(r.Stdout), "exerace: seen %d, scans %d, platform %d, breaches %d", &seen, &scans, &platform, &breaches); err != nil {
		t.Fatalf("exerace said %q (%q): %v", r.Stdout, r.Stderr, err)
	}
	t.Logf("%d execs; the racer saw %d processes in %d scans, %d of them the platform's", n, seen, scans, platform)
	if breaches != 0 || seen == 0 {
		t.Errorf("exerace: %s", r.Stdout)
	}
}

// An agent whose sandbox is snapshotted (it becomes another agent's
// environment) plants what would lead the copy or its consumer out:
// symlinks to the host's root and up past its own, and a sparse file
// that would make the snapshot cost hours. The sparse file is refused
// (snapshot_too_sparse) with the sandbox running on; once it is gone the
// snapshot is taken, and in a sandbox made from it the links are links,
// resolved in that sandbox's own root.
func testSnapshotPlant(t *testing.T, p *platform) {
	id := p.sandbox(t)
	p.sh(t, id, "mkdir -p /work && ln -s /proc/1/root /work/host && ln -s ../../../../../../etc /work/up && "+
		"dd if=/dev/zero of=/work/huge bs=1 count=0 seek=2G 2>/dev/null && echo planted")
	ctx := context.Background()
	_, err := p.c.Snapshot(ctx, id, api.SnapshotRequest{})
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeSnapshotTooSparse {
		t.Fatalf("snapshot with 2 GiB of holes: %v, want %s", err, api.CodeSnapshotTooSparse)
	}
	if r := p.sh(t, id, "rm /work/huge && echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("the sandbox after a refused snapshot: %+v", r)
	}
	snap, err := p.c.Snapshot(ctx, id, api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	other := p.sandbox(t, func(r *api.CreateSandboxRequest) { r.Image = snap.Ref })
	r := p.sh(t, other, "readlink /work/host; readlink /work/up; cat /work/up/passwd | head -1")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) < 3 || lines[0] != "/proc/1/root" || lines[1] != "../../../../../../etc" ||
		lines[2] != "root:x:0:0:root:/root:/bin/sh" {
		t.Errorf("the links in a sandbox from the snapshot: %q, %q", r.Stdout, r.Stderr)
	}
}

// testPauseEvade: an agent that does not want to be paused forks without
// end, keeps a counter running, and tries to thaw its own cgroup from
// inside. The pause holds all of it still (the counter does not move while
// it is paused), the node stays healthy, and the sandbox runs on when the
// next call resumes it.
func testPauseEvade(t *testing.T, p *platform) {
	id := p.sandbox(t)
	p.sh(t, id, `(i=0; while :; do i=$((i+1)); echo $i > /count.new; mv /count.new /count; (true &) ; sleep 0.02; done) > /dev/null 2>&1 &
(while :; do for f in /sys/fs/cgroup/cgroup.freeze /sys/fs/cgroup/freezer/freezer.state /sys/fs/cgroup/freezer.state; do
  echo 0 > $f; echo THAWED > $f; done 2>/dev/null; sleep 0.05; done) > /dev/null 2>&1 &
until [ -s /count ]; do sleep 0.01; done; echo started`)
	ctx := context.Background()
	count := func() int {
		t.Helper()
		var b bytes.Buffer
		if err := p.c.ReadFile(ctx, id, "/count", &b); err != nil { // a call: it resumes a paused sandbox
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(b.String()))
		if err != nil {
			t.Fatalf("/count: %q", b.String())
		}
		return n
	}
	n0 := count()
	sb, err := p.c.PauseSandbox(ctx, id)
	if err != nil || sb.State != api.StatePaused {
		t.Fatalf("pause: %+v, %v", sb, err)
	}
	time.Sleep(time.Second)
	if got, err := p.c.GetSandbox(ctx, id); err != nil || got.State != api.StatePaused {
		t.Fatalf("a second after the pause: %+v, %v; want paused still", got, err)
	}
	// Running, the counter moves ~50 a second; paused, it stands still,
	// and moves by a few between the read before the pause and the pause,
	// and between the resume (the read) and the read.
	if n1 := count(); n1-n0 > 20 {
		t.Errorf("the counter moved from %d to %d across a second's pause: something kept running", n0, n1)
	}
	n1 := count()
	time.Sleep(500 * time.Millisecond)
	if n2 := count(); n2 <= n1 {
		t.Errorf("the counter after the resume: %d then %d; want it running again", n1, n2)
	}
	if got, err := p.c.GetSandbox(ctx, id); err != nil || got.State != api.StateRunning || got.Pause == nil || got.Pause.ResumedBy == "" {
		t.Fatalf("after the resume: %+v, %v", got, err)
	}
	p.healthy(t)
}

// testQoSEscape: a best-effort agent that wants the CPU back tries to
// leave SCHED_IDLE (back to SCHED_OTHER, up to SCHED_FIFO, a nice value
// below 0) and to take its cgroup out of the idle class. All of it fails,
// and every process it has (its init, a daemon an earlier exec left
// running, the exec doing the trying) stays under SCHED_IDLE. A latency
// sandbox runs as normal work and cannot get ahead of others either.
// Neither can make itself the last a host-wide OOM kills (oom_score_adj
// -1000, its own or its init's): every process keeps its class's.
func testQoSEscape(t *testing.T, p *platform) {
	const schedIdle, schedNormal = "5", "0"
	be := p.sandbox(t, func(r *api.CreateSandboxRequest) { r.QoS = api.QoSBestEffort })
	if r := p.sh(t, be, "sleep 1000 > /dev/null 2>&1 &"); r.ExitCode != 0 {
		t.Fatalf("start a daemon: %+v", r)
	}
	lat := p.sandbox(t)
	escapes := []string{"sched-normal", "sched-fifo", "sched-nice", "setpriority", "cpu-idle", "oom-protect", "oom-protect-init"}
	for _, c := range []struct {
		id, policy string
		oom        int
	}{{be, schedIdle, qos.OOMScoreBestEffort}, {lat, schedNormal, qos.OOMScoreLatency}} {
		got := p.attackResults(t, c.id, append(append([]string{"policy"}, escapes...), "policies", "oom-adjs")...)
		if got["policy"] != c.policy {
			t.Errorf("sandbox %s: policy %s, want %s", c.id, got["policy"], c.policy)
		}
		for _, e := range escapes {
			if e == "sched-normal" && c.id == lat {
				continue // where it is already
			}
			if v := got[e]; v == "ok" || v == "" {
				t.Errorf("sandbox %s: %s: %q, want it refused", c.id, e, v)
			}
		}
		// After the tries: every process there, the exec's own included.
		procs := strings.Fields(got["policies"])
		if c.id == be && len(procs) < 3 { // init, the daemon, the exec
			t.Errorf("best-effort sandbox: processes %q, want at least 3", procs)
		}
		for _, pp := range procs {
			if _, pol, _ := strings.Cut(pp, "="); pol != c.policy {
				t.Errorf("sandbox %s: process %s after the tries, want policy %s", c.id, pp, c.policy)
			}
		}
		adjs := strings.Fields(got["oom-adjs"])
		if len(adjs) < 2 {
			t.Errorf("sandbox %s: oom_score_adj of %q, want its init's and the exec's at least", c.id, adjs)
		}
		for _, pa := range adjs {
			if _, adj, _ := strings.Cut(pa, "="); adj != strconv.Itoa(c.oom) {
				t.Errorf("sandbox %s: process %s after the tries, want oom_score_adj %d", c.id, pa, c.oom)
			}
		}
	}
	nodes, err := p.c.ListNodes(context.Background())
	if err != nil || len(nodes) != 1 || nodes[0].QoS == nil || nodes[0].QoS.BestEffort != 1 || nodes[0].QoS.Latency < 1 {
		t.Errorf("node status: %+v, %v; want 1 best-effort sandbox and a latency one counted", nodes, err)
	}
}
