package container

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/guard"
	"github.com/warrenhq/warren/internal/testutil"
)

// TestAppArmor: where the host runs AppArmor, the sandbox's init, every
// process an exec starts and their children run under warren-default,
// and none of them can leave it; where it does not, nothing asks for a
// profile. WARREN_TEST_APPARMOR=1 (the cgroup-v2 guest, whose kernel runs
// AppArmor, sets it) demands the first.
func TestAppArmor(t *testing.T) {
	h := newHarness(t)
	h.start(h.spec("aa-1"))
	b, err := os.ReadFile(filepath.Join(h.c.dir("aa-1"), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var oci specs.Spec
	if err := json.Unmarshal(b, &oci); err != nil {
		t.Fatal(err)
	}
	if !guard.AppArmorEnabled() {
		if os.Getenv("WARREN_TEST_APPARMOR") == "1" {
			t.Fatal("WARREN_TEST_APPARMOR=1, but this kernel does not run AppArmor")
		}
		if h.c.apparmor != "" || oci.Process.ApparmorProfile != "" {
			t.Errorf("no AppArmor here, but the backend applies %q, the spec %q", h.c.apparmor, oci.Process.ApparmorProfile)
		}
		return
	}
	if h.c.apparmor != guard.AppArmorProfile || oci.Process.ApparmorProfile != guard.AppArmorProfile {
		_, err := guard.LoadAppArmor()
		t.Fatalf("AppArmor runs, but the backend applies %q, the spec %q (%v)", h.c.apparmor, oci.Process.ApparmorProfile, err)
	}
	for _, l := range guard.LSMs() { // what node ls says
		if l.Name == "apparmor" && (!l.Active || !l.Applied) {
			t.Errorf("node report: %+v", l)
		}
	}
	const want = guard.AppArmorProfile + " (enforce)"
	// The init, as the host sees it (nothing in the sandbox may read the
	// non-dumpable init's attributes).
	// runc start returns before the init's exec, which applies the
	// profile: wait for it (slow under TCG).
	deadline := time.Now().Add(testutil.Scale(10 * time.Second))
	for {
		b, err = os.ReadFile(fmt.Sprintf("/proc/%d/attr/current", h.c.sandboxes["aa-1"].init.pid))
		if err != nil || strings.TrimSpace(string(b)) == want || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil || strings.TrimSpace(string(b)) != want {
		t.Errorf("the init's label: %q (%v), want %q", b, err, want)
	}
	// An argv exec, a child of it, and the trusted shell (exec'd from a
	// memfd).
	if got := h.sh("aa-1", "cat /proc/self/attr/current; sh -c 'cat /proc/self/attr/current'"); got != want+"\n"+want {
		t.Errorf("exec'd processes' labels: %q, want %q twice", got, want)
	}
	out := h.exec("aa-1", backend.ExecRequest{Shell: "cat /proc/self/attr/current"})
	if got := strings.TrimSpace(out.stdout); got != want {
		t.Errorf("the trusted shell's label: %q (stderr %q), want %q", got, out.stderr, want)
	}
	// What a process tries to leave it by: changing profile now or on its
	// next exec (both succeed for an unconfined process).
	got := h.sh("aa-1", `
for attr in current apparmor/current; do
  echo 'changeprofile unconfined' 2>/dev/null > /proc/self/attr/$attr && echo "left by $attr"
done
for attr in exec apparmor/exec; do
  (echo 'exec unconfined' > /proc/self/attr/$attr && cat /proc/self/attr/current) 2>/dev/null | grep -v '^warren-default (enforce)$' && echo "left by $attr"
done
echo done`)
	if got != "done" {
		t.Errorf("a process left warren-default:\n%s", got)
	}
}
