package microvm

import (
	"context"
	"fmt"
	"testing"

	"github.com/warrenhq/warren/guest/proto"
)

// TestDAX: layers on virtio-pmem, mounted with DAX in the guest, read
// as they are on virtio-blk, and read in place: reading a file of the
// layer does not grow the guest's page cache.
func TestDAX(t *testing.T) {
	h := newHarness(t)
	h.cfg.DAX = true
	h.m = h.reopen()
	if !h.m.dax {
		t.Fatal("the guest kernel has no virtio_pmem or nd_pmem module")
	}
	id := h.started(t, "dax1")
	s, _ := h.m.get(id)
	var st proto.Status
	if err := s.guest.call(context.Background(), "GET", "/v1/status", nil, nil, &st); err != nil || !st.DAX {
		t.Errorf("guest status %+v, %v: want the layers mounted with DAX", st, err)
	}
	if out, _, code := h.sh(t, id, "ls /bin | wc -l; echo hi > /x && cat /x"); code != 0 || out == "" {
		t.Errorf("in a DAX guest: %q, exit %d", out, code)
	}
	out, _, code := h.sh(t, id, `cached() { awk '/^Cached:/ {print $2 * 1024}' /proc/meminfo; }
a=$(cached); cat /bin/busybox > /dev/null; b=$(cached); echo $(wc -c < /bin/busybox) $a $b`)
	var size, before, after int64
	if _, err := fmt.Sscan(out, &size, &before, &after); err != nil || code != 0 {
		t.Fatalf("page cache around a read: %q (exit %d): %v", out, code, err)
	}
	t.Logf("reading /bin/busybox (%d bytes) grew the guest's page cache by %d bytes", size, after-before)
	// Read through the page cache, the parts of busybox its shell had
	// not run yet come in (250 KiB measured with FLAT_INLINE layers); in
	// place, nothing does.
	if after-before > 64<<10 {
		t.Errorf("reading /bin/busybox (%d bytes) grew the guest's page cache by %d bytes: not read in place", size, after-before)
	}
}
