package microvm

import (
	"context"
	"testing"

	"github.com/warrenhq/warren/guest/proto"
)

// TestDAX: layers on virtio-pmem, mounted with DAX in the guest, read
// as they are on virtio-blk.
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
}
