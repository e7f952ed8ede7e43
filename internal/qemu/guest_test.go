package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/testutil"
)

// GuestEnv names a directory holding a bootable warren guest: vmlinuz,
// initrd (guest/init and its modules) and root.erofs. scripts/test-cgroup-v2
// makes one (--print-guest prints where) and sets it for this test.
const GuestEnv = "WARREN_QEMU_GUEST"

// TestGuestBoot boots the guest twice: once paused, let run over QMP, to
// run /bin/true from its root; once to run a script from a 9p share that
// writes a file back. Each must report its own exit status.
func TestGuestBoot(t *testing.T) {
	dir := os.Getenv(GuestEnv)
	if dir == "" {
		testutil.Unavailable(t, "set %s to a guest directory (scripts/test-cgroup-v2 --print-guest prints one)", GuestEnv)
		return
	}
	testutil.RequireQEMU(t)
	for _, f := range []string{"vmlinuz", "initrd", "root.erofs"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%s=%s: %v", GuestEnv, dir, err)
		}
	}
	accel, why := DetectAccel()
	t.Logf("accelerator %s: %s", accel, why)
	boot := func(t *testing.T, work string, qmp bool, cmdline ...string) (int, string) {
		m := Machine{
			Accel: accel, CPUs: 1, MemoryMiB: 512, RNG: true,
			Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd"),
			Disks:   []Disk{{Path: filepath.Join(dir, "root.erofs"), ReadOnly: true}},
			Cmdline: append([]string{"console=ttyS0", "quiet", "panic=-1", "warren.overlay=1"}, cmdline...),
		}
		if work != "" {
			m.Shares = []Share{{Tag: "work", Path: work}}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if qmp {
			// Start paused; QMP says so and lets it run.
			m.QMP, m.Extra = filepath.Join(t.TempDir(), "qmp.sock"), []string{"-S"}
		}
		var out strings.Builder
		start := time.Now()
		p, err := Start(ctx, m, NewConsole(&out))
		if err != nil {
			t.Fatal(err)
		}
		if qmp {
			q, err := DialQMP(ctx, m.QMP)
			if err != nil {
				t.Fatal(err)
			}
			if st, err := q.Status(ctx); err != nil || st != "prelaunch" {
				t.Errorf("status before cont: %q, %v; want prelaunch", st, err)
			}
			if err := q.Execute(ctx, "cont", nil, nil); err != nil {
				t.Fatal(err)
			}
			if st, err := q.Status(ctx); err != nil || st != "running" {
				t.Errorf("status after cont: %q, %v; want running", st, err)
			}
			q.Close()
		}
		err = p.Wait()
		st, ok := p.Console.ExitStatus()
		if err != nil || !ok {
			t.Fatalf("boot: %v (status reported: %v)\nconsole:\n%s", err, ok, out.String())
		}
		t.Logf("guest ran %s", time.Since(start).Round(100*time.Millisecond))
		return st, out.String()
	}
	t.Run("true", func(t *testing.T) {
		st, out := boot(t, "", true, "warren.exec=/bin/true")
		if st != 0 || !strings.Contains(out, "running /bin/true") {
			t.Fatalf("exit status %d, want 0; console:\n%s", st, out)
		}
	})
	t.Run("share", func(t *testing.T) {
		work := t.TempDir()
		script := "#!/bin/sh\necho \"$(hostname) $(stat -f -c %T /)\" > /work/said\nexit 3\n"
		if err := os.WriteFile(filepath.Join(work, "run.sh"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		st, out := boot(t, work, false, "warren.share=work:/work", "warren.exec=/work/run.sh", "warren.status=/work/status")
		if st != 3 {
			t.Fatalf("exit status %d, want 3; console:\n%s", st, out)
		}
		for f, want := range map[string]string{"said": "warren-guest overlayfs\n", "status": "3\n"} {
			if b, err := os.ReadFile(filepath.Join(work, f)); err != nil || string(b) != want {
				t.Errorf("%s: %q, %v; want %q", f, b, err, want)
			}
		}
	})
}
