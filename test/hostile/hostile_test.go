// Package hostile is warren's standing attack suite: one subtest of
// TestHostile per attack an agent paid to cheat would try, each run
// through the platform as a user runs it (`warren up`, the real container
// backend) and each asserting both that the attack is contained and that
// the node is still healthy afterwards. docs/SECURITY.md lists the
// attacks and their results.
//
// Attacks that need system calls busybox cannot make run a static Go
// program (testdata/attack) copied into the sandbox.
package hostile

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/testutil"
	"github.com/warrenhq/warren/internal/testutil/fakenet"
	"github.com/warrenhq/warren/internal/testutil/uptest"
)

// platform is the warren up every attack runs against, and a client
// with its admin token.
type platform struct {
	up     *uptest.Up
	c      *client.Client
	attack string // the attack program, built static
	inet   *fakenet.Internet
	dns    *fakenet.DNS // the fake internet's resolver, the node's upstream
}

func TestHostile(t *testing.T) {
	testutil.RequireContainers(t)
	testutil.RequireBinary(t, "go")
	// Networked sandboxes reach a fake internet only; the node's rules
	// outlive warren up (sandboxes keep their policies while no agent
	// runs) and go with the test.
	inet := fakenet.New(t)
	dns := inet.DNS("203.0.113.53:53", map[string]string{"pypi.org": "203.0.113.10"})
	b := make([]byte, 2)
	rand.Read(b)
	name := "h" + hex.EncodeToString(b)
	t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", "warren_"+name).Run() })
	// Its data directory is on btrfs, so sandboxes can have disk limits
	// (subvolumes with qgroups).
	mnt := testutil.BtrfsDir(t, 2<<30)
	up := uptest.New(t, "--no-fn", "--dns-upstream", dns.Addr, "--network-name", name,
		"--network-pool", fmt.Sprintf("10.213.%d.0/24", 120+int(b[0])%100))
	up.DataDir = filepath.Join(mnt, "warren")
	testutil.Searchable(t, mnt)
	up.Start()
	t.Cleanup(up.CleanupSandboxes)
	p := &platform{up: up, c: client.New("http://"+up.Addr, up.Token()), inet: inet, dns: dns}
	p.attack = filepath.Join(t.TempDir(), "attack")
	build := exec.Command("go", "build", "-o", p.attack, "./testdata/attack")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the attack program: %v\n%s", err, out)
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			a.run(t, p)
			p.healthy(t)
		})
	}
}

// attacks run in order, each on sandboxes of its own.
var attacks = []struct {
	name string
	run  func(*testing.T, *platform)
}{
	{"Syscalls", testSyscalls},
	{"Capabilities", testCapabilities},
	{"ForgedCalls", testForgedCalls},
	{"SearchForSecrets", testSearchForSecrets},
	{"OverwriteShell", testOverwriteShell},
	{"ForgeUser", testForgeUser},
	{"VerifyCleanRoom", testVerifyCleanRoom},
	{"GrepProcSys", testGrepProcSys},
	{"OutputFlood", testOutputFlood},
	{"ForkBomb", testForkBomb},
	{"MemoryBalloon", testMemoryBalloon},
	{"FillDisk", testFillDisk},
	{"EscapeDeletion", testEscapeDeletion},
	{"OtherSandboxes", testOtherSandboxes},
	{"ExecRace", testExecRace},
	{"SnapshotPlant", testSnapshotPlant},
	{"PauseEvade", testPauseEvade},
	{"QoSEscape", testQoSEscape},
	{"PortScan", testPortScan},
	{"Egress", testEgress},
}

// sandbox creates a busybox sandbox with the attack program at /attack,
// deleted when t ends.
func (p *platform) sandbox(t *testing.T, mod ...func(*api.CreateSandboxRequest)) string {
	t.Helper()
	req := api.CreateSandboxRequest{Image: "busybox"}
	for _, m := range mod {
		m(&req)
	}
	ctx := context.Background()
	sb, err := p.c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { p.c.DeleteSandbox(context.Background(), sb.ID) })
	f, err := os.Open(p.attack)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := p.c.WriteFile(ctx, sb.ID, "/attack", 0o755, f); err != nil {
		t.Fatalf("copy the attack program in: %v", err)
	}
	return sb.ID
}

// sh runs a shell command in sandbox id and returns its result.
func (p *platform) sh(t *testing.T, id, cmd string) *api.ExecResult {
	t.Helper()
	r, err := p.c.Exec(context.Background(), id, api.ExecRequest{Cmd: cmd, Timeout: api.Duration(testutil.Scale(2 * time.Minute))})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return r
}

// attackResults runs the attack program with the named attacks and
// returns each one's answer.
func (p *platform) attackResults(t *testing.T, id string, names ...string) map[string]string {
	t.Helper()
	r := p.sh(t, id, "/attack "+strings.Join(names, ","))
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok {
			got[k] = v
		}
	}
	if len(got) != len(names) {
		t.Fatalf("attack %v: exit %d, stdout %q, stderr %q", names, r.ExitCode, r.Stdout, r.Stderr)
	}
	return got
}

// healthy checks the node after an attack: it lists itself ready, and a
// fresh sandbox runs a command and is deleted.
func (p *platform) healthy(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Scale(time.Minute))
	defer cancel()
	nodes, err := p.c.ListNodes(ctx)
	if err != nil || len(nodes) != 1 || !nodes[0].Healthy {
		t.Fatalf("after the attack: nodes %+v, %v; want one healthy node", nodes, err)
	}
	sb, err := p.c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		t.Fatalf("after the attack: create: %v", err)
	}
	defer p.c.DeleteSandbox(context.Background(), sb.ID)
	r, err := p.c.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"echo", "alive"}})
	if err != nil || r.Stdout != "alive\n" {
		t.Fatalf("after the attack: exec in a new sandbox: %+v, %v", r, err)
	}
}

// expect checks each named attack's answer.
func expect(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %s, want %s", k, got[k], w)
		}
	}
}

// The system calls an agent would use on the kernel or the filesystem
// under it are refused by the sandbox's seccomp filter: EPERM (or, where
// moby's profile answers so, ENOSYS).
func testSyscalls(t *testing.T, p *platform) {
	id := p.sandbox(t)
	got := p.attackResults(t, id, "ficlone", "ficlone-high", "ficlonerange", "fidedupe", "btrfs-subvol",
		"swapext", "moveext", "unshare-user", "unshare-net", "clone-user", "bpf", "perf",
		"keyctl", "userfaultfd", "kexec", "module", "mount", "packet", "raw", "vsock", "vsock-high", "packet-high",
		"tcgets", "inet", "unix", "ksm-madvise", "ksm-madvise-high", "ksm-prctl", "madvise-dontneed")
	t.Logf("answers: %v", got)
	want := map[string]string{}
	for k := range got {
		want[k] = "EPERM"
	}
	// What ordinary programs do still works: a terminal query (no
	// terminal here: ENOTTY, from the kernel, not the filter) and sockets
	// of the usual families.
	want["tcgets"], want["inet"], want["unix"], want["madvise-dontneed"] = "ENOTTY", "ok", "ok", "ok"
	expect(t, got, want)
}

// Capabilities: none of those that reach past the sandbox.
func testCapabilities(t *testing.T, p *platform) {
	id := p.sandbox(t)
	got := p.attackResults(t, id, "caps")
	t.Logf("caps: %s", got["caps"])
	for _, f := range strings.Fields(got["caps"]) {
		k, v, _ := strings.Cut(f, "=")
		var mask uint64
		fmt.Sscanf(v, "%x", &mask)
		for name, bit := range map[string]uint{"SYS_ADMIN": 21, "SYS_MODULE": 16, "DAC_READ_SEARCH": 2,
			"NET_ADMIN": 12, "NET_RAW": 13, "SYS_PTRACE": 19, "SYS_RAWIO": 17, "BPF": 39, "PERFMON": 38, "SYS_BOOT": 22, "MKNOD": 27} {
			if mask&(1<<bit) != 0 {
				t.Errorf("%s has CAP_%s", k, name)
			}
		}
	}
	// And the capabilities it has hold in its own user namespace only:
	// root inside is an unprivileged host id, the host's root nobody.
	nodes, err := p.c.ListNodes(context.Background())
	if err != nil || len(nodes) != 1 || nodes[0].Security == nil || nodes[0].Security.UserNS != "per-sandbox" {
		t.Fatalf("node security: %+v, %v; want user namespaces per sandbox", nodes, err)
	}
	t.Logf("node security: %+v", *nodes[0].Security)
	r := p.sh(t, id, "cat /proc/self/uid_map; stat -c %u /dev/init; chmod 777 /dev/init 2>&1 || echo refused")
	f := strings.Fields(r.Stdout)
	if len(f) < 5 || f[0] != "0" || f[2] != "65536" || f[3] != "65534" || f[len(f)-1] != "refused" {
		t.Fatalf("user namespace: %q %q", r.Stdout, r.Stderr)
	}
	if host, _ := strconv.Atoi(f[1]); host < 1<<24 {
		t.Errorf("root inside is host uid %d, among the host's own ids", host)
	}
}
