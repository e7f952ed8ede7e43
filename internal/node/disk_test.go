package node

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/backend/fake"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image/imagetest"
)

// diskFake is the fake backend with a disk quota mechanism, recording the
// specs it is asked to create.
type diskFake struct {
	*fake.Backend
	dq backend.DiskQuota

	mu    sync.Mutex
	specs map[string]backend.Spec
}

var _ backend.DiskLimiter = (*diskFake)(nil)

func (d *diskFake) DiskQuota() backend.DiskQuota { return d.dq }

func (d *diskFake) Create(ctx context.Context, spec backend.Spec) error {
	d.mu.Lock()
	d.specs[spec.ID] = spec
	d.mu.Unlock()
	return d.Backend.Create(ctx, spec)
}

func (d *diskFake) spec(id string) backend.Spec {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.specs[id]
}

func newDiskAgent(t *testing.T, dir string, dq backend.DiskQuota, defaultDisk int64) (*Agent, *diskFake, error) {
	t.Helper()
	f, err := fake.New(filepath.Join(dir, "fake"), fake.Options{Name: api.BackendContainer})
	if err != nil {
		t.Fatal(err)
	}
	b := &diskFake{Backend: f, dq: dq, specs: map[string]backend.Spec{}}
	a, newErr := New(context.Background(), Config{ID: "n1", StateDir: filepath.Join(dir, "state"),
		Backends: []backend.Backend{b}, Images: imagetest.Busybox, Layers: imagetest.NoLayers{},
		Defaults: Defaults{Disk: defaultDisk}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if newErr != nil {
		return nil, b, newErr
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, b, nil
}

var (
	btrfs = backend.DiskQuota{Mechanism: api.DiskQuotaBtrfs}
	xfs   = backend.DiskQuota{Mechanism: api.DiskQuotaXFS, Inodes: true}
	none  = backend.DiskQuota{Mechanism: api.DiskQuotaNone, Reason: "/data is on tmpfs, which offers no quota"}
)

func TestDiskLimits(t *testing.T) {
	const mi = 1 << 20
	tests := []struct {
		name        string
		dq          backend.DiskQuota
		defaultDisk int64
		res         api.Resources
		want        api.Resources // Disk and DiskInodes after defaults
		code        string        // or the refusal's code
	}{
		{"no limit asked, none given", btrfs, 0, api.Resources{}, api.Resources{}, ""},
		{"btrfs: bytes", btrfs, 0, api.Resources{Disk: 50 * mi}, api.Resources{Disk: 50 * mi}, ""},
		{"btrfs: node default", btrfs, 10 << 30, api.Resources{}, api.Resources{Disk: 10 << 30}, ""},
		{"btrfs: request beats the default", btrfs, 10 << 30, api.Resources{Disk: 50 * mi}, api.Resources{Disk: 50 * mi}, ""},
		{"btrfs: inodes refused", btrfs, 0, api.Resources{Disk: 50 * mi, DiskInodes: 1000}, api.Resources{}, api.CodeDiskQuotaUnsupported},
		{"xfs: default inodes from the size", xfs, 0, api.Resources{Disk: 50 * mi}, api.Resources{Disk: 50 * mi, DiskInodes: 3200}, ""},
		{"xfs: inodes given", xfs, 0, api.Resources{Disk: 50 * mi, DiskInodes: 10}, api.Resources{Disk: 50 * mi, DiskInodes: 10}, ""},
		{"xfs: default disk, inodes given", xfs, 64 * mi, api.Resources{DiskInodes: 10}, api.Resources{Disk: 64 * mi, DiskInodes: 10}, ""},
		{"none: refused", none, 0, api.Resources{Disk: 50 * mi}, api.Resources{}, api.CodeDiskQuotaUnsupported},
		{"none: no limit asked", none, 0, api.Resources{}, api.Resources{}, ""},
		{"too small", btrfs, 0, api.Resources{Disk: 1000}, api.Resources{}, api.CodeInvalid},
		{"inodes without disk", xfs, 0, api.Resources{DiskInodes: 10}, api.Resources{}, api.CodeInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b, err := newDiskAgent(t, t.TempDir(), tt.dq, tt.defaultDisk)
			if err != nil {
				t.Fatal(err)
			}
			if got := a.Status().DiskQuota; got != tt.dq.Mechanism {
				t.Errorf("Status().DiskQuota = %q, want %q", got, tt.dq.Mechanism)
			}
			sb, err := a.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox", Resources: tt.res})
			if tt.code != "" {
				if err == nil || errdefs.Code(err) != tt.code && !(tt.code == api.CodeInvalid && errors.Is(err, errdefs.ErrInvalid)) {
					t.Fatalf("got %+v, %v (code %q); want code %s", sb.Resources, err, errdefs.Code(err), tt.code)
				}
				if tt.code == api.CodeDiskQuotaUnsupported && !errors.Is(err, errdefs.ErrUnavailable) {
					t.Fatalf("got %v, want ErrUnavailable (503)", err)
				}
				t.Logf("refused: %v", err)
				if u := a.Status().Usage; u.Sandboxes != 0 || u.CPU != 0 {
					t.Errorf("a refused create holds %+v", u)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sb.Resources.Disk != tt.want.Disk || sb.Resources.DiskInodes != tt.want.DiskInodes {
				t.Errorf("sandbox resources %+v, want disk %v inodes %d", sb.Resources, tt.want.Disk, tt.want.DiskInodes)
			}
			if s := b.spec(sb.ID).Resources; s.Disk != int64(tt.want.Disk) || s.DiskInodes != tt.want.DiskInodes {
				t.Errorf("backend spec resources %+v, want disk %d inodes %d", s, tt.want.Disk, tt.want.DiskInodes)
			}
		})
	}
}

func TestDiskQuotaStatus(t *testing.T) {
	a, _, err := newDiskAgent(t, t.TempDir(), none, 0)
	if err != nil {
		t.Fatal(err)
	}
	st := a.Status()
	if st.DiskQuota != api.DiskQuotaNone || len(st.Problems) != 1 || !strings.Contains(st.Problems[0], none.Reason) {
		t.Errorf("status of a node without quotas: disk_quota %q, problems %q; want none and a problem saying why", st.DiskQuota, st.Problems)
	}
	if !st.Healthy {
		t.Errorf("a node without disk quotas is still healthy for sandboxes that ask for none")
	}
	// A default disk limit the node cannot enforce is a configuration error.
	if _, _, err := newDiskAgent(t, t.TempDir(), none, 1<<30); !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != api.CodeDiskQuotaUnsupported {
		t.Errorf("default disk on a node without quotas: got %v, want %s", err, api.CodeDiskQuotaUnsupported)
	}
	// A backend that limits no disk at all: none, and no problem of its own.
	plain := newAgent(t, t.TempDir(), nil)
	if st := plain.Status(); st.DiskQuota != api.DiskQuotaNone || len(st.Problems) != 0 {
		t.Errorf("status over the plain fake: disk_quota %q, problems %q", st.DiskQuota, st.Problems)
	}
	_, err = plain.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{Disk: 1 << 30}})
	if errdefs.Code(err) != api.CodeDiskQuotaUnsupported {
		t.Errorf("disk on the plain fake: got %v, want %s", err, api.CodeDiskQuotaUnsupported)
	}
}

// A disk limit survives an agent restart in the record, and records
// written before disk limits existed (same version, no disk fields) still
// read.
func TestDiskRecover(t *testing.T) {
	dir := t.TempDir()
	a, _, err := newDiskAgent(t, dir, btrfs, 0)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := a.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox", Resources: api.Resources{Disk: 50 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	r, err := readRecord(a.recordPath(sb.ID))
	if err != nil || r.Spec.Resources.Disk != 50<<20 {
		t.Fatalf("record: %+v, %v; want the disk limit in its spec", r.Spec.Resources, err)
	}
	// The same record as an agent before disk limits wrote it.
	var raw map[string]any
	b, _ := os.ReadFile(a.recordPath(sb.ID))
	json.Unmarshal(b, &raw)
	delete(raw["spec"].(map[string]any)["Resources"].(map[string]any), "Disk")
	delete(raw["spec"].(map[string]any)["Resources"].(map[string]any), "DiskInodes")
	delete(raw["sandbox"].(map[string]any)["resources"].(map[string]any), "disk")
	raw["sandbox"].(map[string]any)["id"] = "n1-aaaaaaaaaaaaaaaa"
	old, _ := json.Marshal(raw)
	if err := os.WriteFile(a.recordPath("n1-aaaaaaaaaaaaaaaa"), old, 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := readRecord(a.recordPath("n1-aaaaaaaaaaaaaaaa")); err != nil || r.Spec.Resources.Disk != 0 {
		t.Fatalf("a record without disk fields: %+v, %v", r.Spec.Resources, err)
	}

	a2, _, err := newDiskAgent(t, dir, btrfs, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a2.Get(context.Background(), sb.ID)
	if err != nil || got.Resources.Disk != 50<<20 {
		t.Fatalf("recovered sandbox: %+v, %v; want its disk limit", got.Resources, err)
	}
}
