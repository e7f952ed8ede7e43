package microvm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/testutil"
)

// TestKernels: both guest kernels a host may have boot a sandbox that
// runs: warren's own (scripts/build-guest-kernel: everything built in, no
// module in the initramfs), which the rest of the suite runs on where it
// is built, and Debian's (its drivers loaded from the initramfs as
// modules, DAX's included).
func TestKernels(t *testing.T) {
	for _, k := range []struct{ name, tree string }{{"warren", WarrenKernel}, {"debian", DebianKernel}} {
		t.Run(k.name, func(t *testing.T) {
			if _, err := os.Stat(k.tree); err != nil {
				testutil.Unavailable(t, "no %s guest kernel (%v): scripts/setup builds warren's and fetches Debian's", k.name, err)
			}
			t.Setenv(testutil.GuestKernelEnv, k.tree)
			h := newHarness(t)
			h.cfg.DAX = true
			h.m = h.reopen()
			if !h.m.dax {
				t.Errorf("%s: no DAX (virtio_pmem, nd_pmem) in the kernel", k.name)
			}
			vmlinuz, _, err := findKernel(k.tree, "")
			if err != nil {
				t.Fatal(err)
			}
			release := strings.TrimPrefix(filepath.Base(vmlinuz), "vmlinuz-")
			id := h.started(t, "kernel-"+k.name)
			out, _, code := h.sh(t, id, "uname -r; test -e /proc/modules && echo modular || echo built-in; ls /bin | wc -l")
			want := map[string]string{"warren": "built-in", "debian": "modular"}[k.name]
			if f := strings.Fields(out); code != 0 || len(f) != 3 || f[0] != release || f[1] != want || f[2] == "0" {
				t.Errorf("%s kernel: %q (exit %d), want release %s, %s, the layer's /bin", k.name, out, code, release, want)
			}
		})
	}
}
