package apiserver_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/node"
)

// diskBackend is a backend that claims a disk quota mechanism.
type diskBackend struct {
	backend.Backend
	mech string
}

func (d diskBackend) DiskQuota() backend.DiskQuota {
	return backend.DiskQuota{Mechanism: d.mech, Reason: "test node without quotas"}
}

func withDiskQuota(mech string) func(*node.Config) {
	return func(c *node.Config) {
		for i, b := range c.Backends {
			c.Backends[i] = diskBackend{Backend: b, mech: mech}
		}
	}
}

// The project quota's disk is charged by creates, like vCPU and memory.
func TestDiskQuotaCharged(t *testing.T) {
	h := newIAMHarness(t, withDiskQuota(api.DiskQuotaBtrfs))
	h.project("d", iam.Quota{Resources: iam.Resources{Disk: 100 << 20}})
	tok := h.token("d", iam.RoleRunner)

	first := h.create(tok, `{"image":"busybox","resources":{"disk":"60Mi"}}`)
	if first.Resources.Disk != 60<<20 {
		t.Fatalf("sandbox resources %+v, want disk 60Mi", first.Resources)
	}
	a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"disk":"60Mi"}}`)
	if a.status != http.StatusTooManyRequests || a.code(t) != api.CodeQuotaExceeded {
		t.Fatalf("60Mi more in a 100Mi disk quota with 60Mi used: %d %s, want 429 quota_exceeded", a.status, a.body)
	}
	if a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"disk":"200Mi"}}`); a.status != http.StatusBadRequest || a.code(t) != api.CodeRequestExceedsQuota {
		t.Errorf("200Mi in a 100Mi disk quota: %d %s, want 400 request_exceeds_quota", a.status, a.body)
	}
	// Without disk the create takes none of it.
	h.create(tok, `{"image":"busybox"}`)
	h.create(tok, `{"image":"busybox","resources":{"disk":"40Mi"}}`)

	waitDisk := func(want api.Quantity) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			var p api.Project
			h.do(adminSecret, "GET", "/v1/projects/d", "").decode(t, &p)
			if p.Usage.Disk == want && p.Reserved.Disk == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("project d: usage %+v reserved %+v, want disk %v", p.Usage, p.Reserved, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitDisk(100 << 20)
	if a := h.do(tok, "DELETE", "/v1/sandboxes/"+first.ID, ""); a.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", a.status, a.body)
	}
	waitDisk(40 << 20)
	h.create(tok, `{"image":"busybox","resources":{"disk":"60Mi"}}`)
}

// A node without disk quotas refuses a disk limit (503
// disk_quota_unsupported), and the refusal holds no quota.
func TestDiskRefusedWithoutQuota(t *testing.T) {
	h := newIAMHarness(t, withDiskQuota(api.DiskQuotaNone))
	h.project("d", iam.Quota{Resources: iam.Resources{Disk: 100 << 20}})
	tok := h.token("d", iam.RoleRunner)
	for range 3 {
		a := h.do(tok, "POST", "/v1/sandboxes", `{"image":"busybox","resources":{"disk":"60Mi"}}`)
		if a.status != http.StatusServiceUnavailable || a.code(t) != api.CodeDiskQuotaUnsupported {
			t.Fatalf("disk on a node without quotas: %d %s, want 503 %s", a.status, a.body, api.CodeDiskQuotaUnsupported)
		}
	}
	var p api.Project
	h.do(adminSecret, "GET", "/v1/projects/d", "").decode(t, &p)
	if p.Usage.Disk != 0 || p.Reserved.Disk != 0 {
		t.Errorf("refused creates hold disk quota: usage %+v reserved %+v", p.Usage, p.Reserved)
	}
	var n api.NodeList
	h.do(adminSecret, "GET", "/v1/nodes", "").decode(t, &n)
	if len(n.Nodes) != 1 || n.Nodes[0].DiskQuota != api.DiskQuotaNone || len(n.Nodes[0].Problems) == 0 {
		t.Errorf("nodes: %+v, want disk_quota none with a problem", n.Nodes)
	}
	h.create(tok, `{"image":"busybox"}`)
}

// Placement sends a create with a disk limit only to nodes that enforce
// one, and answers 503 disk_quota_unsupported when none can.
func TestRouterPlacesByDiskQuota(t *testing.T) {
	mech := map[string]string{"q1": api.DiskQuotaBtrfs, "n2": api.DiskQuotaNone}
	f := newFleetWith(t, fleetOptions{node: func(id string, c *node.Config) {
		withDiskQuota(mech[id])(c)
		c.Limits.CPU, c.Limits.Memory, c.Limits.Sandboxes = 1000, 1<<40, 100
	}}, "q1", "n2")
	waitUntil(t, "disk_quota in the fleet view", 5*time.Second, func() bool {
		for _, v := range f.watcher.Snapshot() {
			if v.DiskQuota != mech[v.ID] {
				return false
			}
		}
		return true
	})
	perNode := map[string]int{}
	for range 10 {
		sb := f.create(`{"image":"busybox","resources":{"disk":"1Gi"}}`)
		if sb.Resources.Disk != 1<<30 {
			t.Errorf("sandbox %s: resources %+v", sb.ID, sb.Resources)
		}
		perNode[sb.Node]++
	}
	if perNode["q1"] != 10 {
		t.Fatalf("creates with disk landed %v, want all on q1 (btrfs)", perNode)
	}
	for range 10 {
		perNode[f.create(`{"image":"busybox"}`).Node]++
	}
	if perNode["n2"] == 0 {
		t.Errorf("creates without disk never used n2: %v", perNode)
	}
	// Inode limits: btrfs cannot, so no node can.
	resp, b := f.json("POST", "/v1/sandboxes", `{"image":"busybox","resources":{"disk":"1Gi","disk_inodes":1000}}`)
	var e api.ErrorBody
	json.Unmarshal(b, &e)
	if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != api.CodeDiskQuotaUnsupported || !strings.Contains(e.Error.Message, "without disk and inode quotas") {
		t.Fatalf("inode limit with no xfs/ext4 node: %d %s, want 503 %s naming the nodes", resp.StatusCode, b, api.CodeDiskQuotaUnsupported)
	}
}
