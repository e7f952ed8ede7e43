package container

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestZZBench(t *testing.T) {
	if os.Getenv("ZZBENCH") == "" {
		t.Skip()
	}
	h := newHarness(t)
	ctx := context.Background()
	lower, err := h.c.cfg.Mounts.Acquire(ctx, h.layer)
	if err != nil {
		t.Fatal(err)
	}
	defer h.c.cfg.Mounts.Release(h.layer.Digest)
	rawDir := t.TempDir()
	exec.Command("runc", "spec", "--bundle", rawDir).Run()
	specB, _ := os.ReadFile(filepath.Join(rawDir, "config.json"))
	var seq int
	var mu sync.Mutex
	raw := func() (func(), error) {
		mu.Lock()
		seq++
		id := fmt.Sprintf("raw-%d", seq)
		mu.Unlock()
		b := filepath.Join(rawDir, id)
		rootfs := filepath.Join(b, "rootfs")
		for _, d := range []string{"upper", "work", "rootfs"} {
			os.MkdirAll(filepath.Join(b, d), 0o755)
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, filepath.Join(b, "upper"), filepath.Join(b, "work"))
		if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
			return nil, err
		}
		var spec map[string]any
		json.Unmarshal(specB, &spec)
		proc := spec["process"].(map[string]any)
		proc["terminal"] = false
		proc["args"] = []string{"/bin/sleep", "3600"}
		spec["hostname"] = id
		linux := spec["linux"].(map[string]any)
		linux["cgroupsPath"] = "/zzraw/" + id
		linux["resources"] = map[string]any{
			"memory": map[string]any{"limit": 64 << 20},
			"cpu":    map[string]any{"quota": 10000, "period": 100000},
			"pids":   map[string]any{"limit": 1024},
		}
		spec["root"] = map[string]any{"path": "rootfs", "readonly": false}
		out, _ := json.Marshal(spec)
		os.WriteFile(filepath.Join(b, "config.json"), out, 0o644)
		if err := exec.Command("runc", "--root", filepath.Join(rawDir, "runc"), "run", "-d", "--bundle", b, id).Run(); err != nil {
			return nil, fmt.Errorf("%v", err)
		}
		return func() {
			exec.Command("runc", "--root", filepath.Join(rawDir, "runc"), "delete", "--force", id).Run()
			unix.Unmount(rootfs, unix.MNT_DETACH)
			os.RemoveAll(b)
		}, nil
	}
	ours := func() (func(), error) {
		mu.Lock()
		seq++
		id := fmt.Sprintf("ours-%d", seq)
		mu.Unlock()
		spec := h.spec(id)
		spec.Resources.CPU = 0.1
		spec.Resources.Memory = 64 << 20
		if err := h.c.Create(ctx, spec); err != nil {
			return nil, err
		}
		if err := h.c.Start(ctx, id); err != nil {
			return nil, err
		}
		return func() { h.c.Destroy(ctx, id) }, nil
	}
	measure := func(f func() (func(), error), n, c int) float64 {
		var wg sync.WaitGroup
		next := make(chan int, n)
		for i := 0; i < n; i++ {
			next <- i
		}
		close(next)
		var undo []func()
		start := time.Now()
		for w := 0; w < c; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					u, err := f()
					if err != nil {
						t.Error(err)
						continue
					}
					mu.Lock()
					undo = append(undo, u)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		for _, u := range undo {
			u()
		}
		return float64(n) / el.Seconds()
	}
	cpu := func() time.Duration {
		var a, b unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &a)
		unix.Getrusage(unix.RUSAGE_CHILDREN, &b)
		return time.Duration(a.Utime.Nano() + a.Stime.Nano() + b.Utime.Nano() + b.Stime.Nano())
	}
	_ = cpu
	var sum float64
	for r := 0; r < 4; r++ {
		a := measure(raw, 40, 4)
		b := measure(ours, 40, 4)
		sum += b / a
		t.Logf("c4 raw %.1f/s ours %.1f/s ratio %.2f", a, b, b/a)
	}
	t.Logf("mean ratio %.2f", sum/4)
	for _, hier := range cgroupMounts(t) {
		os.Remove(filepath.Join(hier, "zzraw"))
	}
}
