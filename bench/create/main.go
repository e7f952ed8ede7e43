// Command create measures sandbox creation through warren's full path (REST
// API -> node agent -> container backend) against raw `runc run -d`
// containers over the same EROFS layer, in the same run, and prints both
// with their ratio.
//
//	sudo go run ./bench/create -n 40 -rounds 3
//	sudo go run ./bench/create -n 40 -rounds 3 -tls
//
// -tls adds the peer warren+tls: a second `warren up` in this process that
// serves its API over TLS (a CA and a certificate made as `warren cert`
// does), measured in the same rounds as plain warren, with the ratio of the
// two. Both then run without FnCall and without publishing runtime images,
// so that neither's background work weighs on the other.
//
// For each round and each mode (sequential, and -c concurrent clients) it
// creates n sandboxes, timing each create, then removes them untimed. The
// raw peer mounts an overlay over the shared EROFS layer mount and runs
// `runc run -d` with runc's default spec: what a bare runtime does, with
// none of the platform's bookkeeping.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/bench/internal/benchup"
	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/image"
)

func main() {
	n := flag.Int("n", 40, "sandboxes per mode and round")
	conc := flag.Int("c", 4, "concurrent clients in the concurrent mode")
	rounds := flag.Int("rounds", 3, "rounds (report median and spread)")
	keep := flag.Bool("keep", false, "keep the temporary data dir")
	withTLS := flag.Bool("tls", false, "also measure warren with its API over TLS (peer warren+tls)")
	flag.StringVar(&binA, "bin", "", "run the warren peer as `BIN up` in a process of its own instead of in this one")
	flag.StringVar(&binB, "b-bin", "", "also measure `BIN up` (another build, e.g. the previous commit's) as peer warren-b, in a process of its own; with -bin, an A/B of two builds")
	flag.Parse()
	if err := run(*n, *conc, *rounds, *keep, *withTLS); err != nil {
		fmt.Fprintln(os.Stderr, "bench/create:", err)
		os.Exit(1)
	}
}

// binA and binB are -bin and -b-bin.
var binA, binB string

// nodeOf creates and deletes one sandbox to learn c's node id.
func nodeOf(ctx context.Context, c *client.Client) (string, error) {
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		return "", err
	}
	id, _, _ := strings.Cut(sb.ID, "-")
	return id, c.DeleteSandbox(ctx, sb.ID)
}

func warrenCreate(c *client.Client) func(context.Context) (func(), error) {
	return func(ctx context.Context) (func(), error) {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox",
			Resources: api.Resources{CPU: 0.1, Memory: 64 << 20}})
		if err != nil {
			return nil, err
		}
		return func() { c.DeleteSandbox(context.Background(), sb.ID) }, nil
	}
}

func run(n, conc, rounds int, keep, withTLS bool) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (runc, mounts)")
	}
	dir, err := benchup.TempDir("warren-bench-create-")
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(dir)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var c *client.Client
	if binA != "" {
		c, err = benchup.Proc(ctx, binA, filepath.Join(dir, "warren"))
	} else {
		c, err = benchup.InProcess(ctx, filepath.Join(dir, "warren"), false, withTLS || binB != "")
	}
	if err != nil {
		return err
	}
	img, err := c.GetImage(ctx, "busybox")
	if err != nil {
		return err
	}
	blobs, err := blob.NewDir(filepath.Join(dir, "warren", "blobs"))
	if err != nil {
		return err
	}
	layer, err := image.NewCache(filepath.Join(dir, "raw-cache"), blobs).Fetch(ctx, img.Layers[0])
	if err != nil {
		return err
	}
	// The hardened peer runs warren's own OCI spec (seccomp, masked paths,
	// catatonit as init): the gap to it is the platform's bookkeeping alone.
	probe, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		return err
	}
	hardened, err := os.ReadFile(filepath.Join(dir, "warren", "node", "container", "sandboxes", probe.ID, "config.json"))
	if err != nil {
		return fmt.Errorf("read warren's OCI spec: %w", err)
	}
	if err := c.DeleteSandbox(ctx, probe.ID); err != nil {
		return err
	}
	// Its resolv.conf (the node's DNS proxy) lives in the probe's directory,
	// gone with it; a bare runtime would not bind one.
	var spec specs.Spec
	if err := json.Unmarshal(hardened, &spec); err != nil {
		return fmt.Errorf("warren's OCI spec: %w", err)
	}
	spec.Mounts = slices.DeleteFunc(spec.Mounts, func(m specs.Mount) bool { return m.Destination == "/etc/resolv.conf" })
	// Its binds of the platform's files come from inside its own root
	// (warren's platform layer, under the peer's overlay too); its user
	// namespace needs idmapped layers, which a bare runtime does not make.
	probeRoot := filepath.Join(dir, "warren", "node", "container", "sandboxes", probe.ID, "rootfs")
	for i, m := range spec.Mounts {
		if rel, ok := strings.CutPrefix(m.Source, probeRoot+"/"); ok {
			spec.Mounts[i].Source = rootfsMarker + rel
		}
	}
	spec.Linux.Namespaces = slices.DeleteFunc(spec.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.UserNamespace })
	spec.Linux.UIDMappings, spec.Linux.GIDMappings = nil, nil
	if hardened, err = json.Marshal(&spec); err != nil {
		return err
	}
	platform := filepath.Join(dir, "warren", "node", "container", "platform")
	raw, err := newRawRunc(filepath.Join(dir, "raw"), layer.Path)
	if err != nil {
		return err
	}
	defer raw.close()

	nodeID, _, _ := strings.Cut(probe.ID, "-")
	peers := []struct {
		name   string
		cgroup string // parent of the peer's container cgroups
		create func(context.Context) (func(), error)
	}{
		{"warren", "/warren/" + nodeID, warrenCreate(c)},
		{"runc", "/wbench-raw", func(ctx context.Context) (func(), error) { return raw.create(ctx, raw.defaultSpec, "") }},
		{"runc+hardened", "/wbench-raw", func(ctx context.Context) (func(), error) { return raw.create(ctx, hardened, platform) }},
	}
	if withTLS {
		ct, err := benchup.InProcess(ctx, filepath.Join(dir, "warren-tls"), true, true)
		if err != nil {
			return fmt.Errorf("warren over TLS: %w", err)
		}
		tlsNode, err := nodeOf(ctx, ct)
		if err != nil {
			return fmt.Errorf("warren over TLS: %w", err)
		}
		peers = append(peers, struct {
			name   string
			cgroup string
			create func(context.Context) (func(), error)
		}{"warren+tls", "/warren/" + tlsNode, warrenCreate(ct)})
	}

	if binB != "" {
		cb, err := benchup.Proc(ctx, binB, filepath.Join(dir, "warren-b"))
		if err != nil {
			return fmt.Errorf("warren-b: %w", err)
		}
		bNode, err := nodeOf(ctx, cb)
		if err != nil {
			return fmt.Errorf("warren-b: %w", err)
		}
		peers = append(peers, struct {
			name   string
			cgroup string
			create func(context.Context) (func(), error)
		}{"warren-b", "/warren/" + bNode, warrenCreate(cb)})
	}

	fmt.Printf("bench/create: n=%d per mode, %d concurrent clients, %d rounds, %s\n", n, conc, rounds, time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("peers: warren = REST API -> agent -> container backend; runc = overlay + `runc run -d` with runc's default spec;\n" +
		"       runc+hardened = the same with warren's OCI spec (seccomp, masked paths, catatonit init)\n")
	if withTLS {
		fmt.Printf("       warren+tls = a second warren up serving its API over TLS 1.3 (ECDSA P-256); both warrens without FnCall or runtime images\n")
	}
	modes := []struct {
		name string
		c    int
	}{{"seq", 1}, {fmt.Sprintf("c%d", conc), conc}}
	results := map[string][]stats{}
	for r := 0; r < rounds; r++ {
		for _, m := range modes {
			// Rotate who goes first so drift favours nobody.
			for i := range peers {
				p := peers[(i+r)%len(peers)]
				s, err := measure(ctx, n, m.c, p.create, p.cgroup)
				if err != nil {
					return fmt.Errorf("%s %s: %w", p.name, m.name, err)
				}
				results[p.name+" "+m.name] = append(results[p.name+" "+m.name], s)
			}
		}
	}
	rate := func(s stats) float64 { return s.rate }
	p99 := func(s stats) float64 { return ms(s.p99) }
	for _, m := range modes {
		fmt.Printf("\n%-4s %-14s %18s %18s %18s %22s\n", m.name, "", "creates/s", "p50", "p99", "idle memory/sandbox")
		for _, p := range peers {
			ss := results[p.name+" "+m.name]
			fmt.Printf("     %-14s %18s %18s %18s %22s\n", p.name, spread(ss, rate, "%.1f"),
				spread(ss, func(s stats) float64 { return ms(s.p50) }, "%.0fms"), spread(ss, p99, "%.0fms"),
				spread(ss, func(s stats) float64 { return s.memPer / (1 << 20) }, "%.2fMiB"))
		}
		w := results["warren "+m.name]
		for _, peer := range []string{"runc", "runc+hardened"} {
			rr := results[peer+" "+m.name]
			fmt.Printf("     warren/%-14s throughput %.2fx (target >= 0.8)   p99 %.2fx (target <= 2)\n", peer,
				median(w, rate)/median(rr, rate), median(w, p99)/median(rr, p99))
		}
		if wb := results["warren-b "+m.name]; len(wb) > 0 {
			p50 := func(s stats) float64 { return ms(s.p50) }
			fmt.Printf("     warren-b/warren       throughput %.2fx   p50 %.2fx   p99 %.2fx (%s against %s)\n",
				median(wb, rate)/median(w, rate), median(wb, p50)/median(w, p50), median(wb, p99)/median(w, p99), binB, orDefault(binA, "this build in-process"))
		}
		if wt := results["warren+tls "+m.name]; len(wt) > 0 {
			fmt.Printf("     warren+tls/warren     throughput %.2fx   p50 %.2fx   p99 %.2fx (TLS on/off)\n",
				median(wt, rate)/median(w, rate), median(wt, func(s stats) float64 { return ms(s.p50) })/median(w, func(s stats) float64 { return ms(s.p50) }),
				median(wt, p99)/median(w, p99))
		}
	}
	return nil
}

type stats struct {
	rate     float64
	p50, p99 time.Duration
	memPer   float64 // bytes charged to each idle sandbox's cgroup
}

// cgroupMemory sums the memory charged to every child cgroup of parent
// (cgroup v1 memory.usage_in_bytes, or v2 memory.current).
func cgroupMemory(parent string) int64 {
	var total int64
	for _, pattern := range []string{
		filepath.Join("/sys/fs/cgroup/memory", parent, "*", "memory.usage_in_bytes"),
		filepath.Join("/sys/fs/cgroup", parent, "*", "memory.current"),
	} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			var v int64
			fmt.Sscan(string(b), &v)
			total += v
		}
		if len(files) > 0 {
			break
		}
	}
	return total
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(ss []stats, f func(stats) float64) float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	sort.Float64s(v)
	return v[len(v)/2]
}

// spread prints "median (min-max)".
func spread(ss []stats, f func(stats) float64, format string) string {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	sort.Float64s(v)
	return fmt.Sprintf(format+" ("+format+"-"+format+")", v[len(v)/2], v[0], v[len(v)-1])
}

// measure runs n creates over c workers, timing each, then undoes them.
func measure(ctx context.Context, n, c int, create func(context.Context) (func(), error), cgroupParent string) (stats, error) {
	var (
		mu      sync.Mutex
		lat     []time.Duration
		undo    []func()
		firstEr error
	)
	next := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		next <- struct{}{}
	}
	close(next)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				t := time.Now()
				u, err := create(ctx)
				d := time.Since(t)
				mu.Lock()
				if err != nil && firstEr == nil {
					firstEr = err
				}
				if err == nil {
					lat = append(lat, d)
					undo = append(undo, u)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	time.Sleep(500 * time.Millisecond) // let the inits settle before weighing them
	mem := cgroupMemory(cgroupParent)
	for _, u := range undo {
		u()
	}
	if firstEr != nil {
		return stats{}, firstEr
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return stats{
		memPer: float64(mem) / float64(n),
		rate:   float64(n) / elapsed.Seconds(),
		p50:    lat[len(lat)/2],
		p99:    lat[min(len(lat)-1, len(lat)*99/100)],
	}, nil
}

// rawRunc creates plain runc containers: overlay over one shared EROFS
// mount, runc's default spec, `runc run -d`.
type rawRunc struct {
	dir, lower  string
	defaultSpec []byte // runc's default spec, as `runc spec` writes it
	mu          sync.Mutex
	seq         int
}

func newRawRunc(dir, layerFile string) (*rawRunc, error) {
	r := &rawRunc{dir: dir, lower: filepath.Join(dir, "lower")}
	if err := os.MkdirAll(r.lower, 0o755); err != nil {
		return nil, err
	}
	if out, err := exec.Command("runc", "spec", "--bundle", dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("runc spec: %v: %s", err, out)
	}
	spec, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	r.defaultSpec = spec
	if err := unix.Mount(layerFile, r.lower, "erofs", unix.MS_RDONLY, ""); err != nil {
		return nil, fmt.Errorf("mount erofs: %w", err)
	}
	return r, nil
}

func (r *rawRunc) close() {
	unix.Unmount(r.lower, unix.MNT_DETACH)
}

// create runs a container of spec over the layer, with extraLower (if
// any) under it.
func (r *rawRunc) create(ctx context.Context, spec []byte, extraLower string) (func(), error) {
	r.mu.Lock()
	r.seq++
	id := fmt.Sprintf("wbench-raw-%d-%d", os.Getpid(), r.seq)
	r.mu.Unlock()
	b := filepath.Join(r.dir, id)
	rootfs := filepath.Join(b, "rootfs")
	for _, d := range []string{"upper", "work", "rootfs"} {
		if err := os.MkdirAll(filepath.Join(b, d), 0o755); err != nil {
			return nil, err
		}
	}
	lower := r.lower
	if extraLower != "" {
		lower += ":" + extraLower
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, filepath.Join(b, "upper"), filepath.Join(b, "work"))
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		return nil, fmt.Errorf("mount overlay: %w", err)
	}
	if err := writeSpec(b, id, bytes.ReplaceAll(spec, []byte(rootfsMarker), []byte(rootfs+"/"))); err != nil {
		return nil, err
	}
	// The detached container inherits runc's stdio, so a pipe here would
	// never reach EOF: runc's errors go to a file instead.
	errFile := filepath.Join(b, "runc.err")
	ef, err := os.Create(errFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "runc", "--root", filepath.Join(r.dir, "runc"), "run", "-d", "--bundle", b, id)
	cmd.Stdout, cmd.Stderr = ef, ef
	err = cmd.Run()
	ef.Close()
	if err != nil {
		out, _ := os.ReadFile(errFile)
		return nil, fmt.Errorf("runc run: %v: %s", err, out)
	}
	return func() {
		exec.Command("runc", "--root", filepath.Join(r.dir, "runc"), "delete", "--force", id).Run()
		unix.Unmount(rootfs, unix.MNT_DETACH)
		os.RemoveAll(b)
	}, nil
}

// rootfsMarker stands for a container's own root in a spec's bind sources.
const rootfsMarker = "@ROOTFS@/"

// writeSpec writes template as the bundle's config.json with this
// container's hostname, cgroup and root. runc's default spec (which runs an
// interactive sh) is also made to run `sleep` detached, with the limits the
// warren side asks for; warren's own spec is used as it is.
func writeSpec(bundle, id string, template []byte) error {
	var spec map[string]any
	if err := json.Unmarshal(template, &spec); err != nil {
		return err
	}
	spec["hostname"] = id
	spec["root"] = map[string]any{"path": "rootfs", "readonly": false}
	linux := spec["linux"].(map[string]any)
	linux["cgroupsPath"] = "/wbench-raw/" + id
	if proc := spec["process"].(map[string]any); proc["terminal"] == true {
		proc["terminal"] = false
		proc["args"] = []string{"/bin/sleep", "3600"}
		linux["resources"] = map[string]any{
			"memory": map[string]any{"limit": 64 << 20},
			"cpu":    map[string]any{"quota": 10000, "period": 100000},
			"pids":   map[string]any{"limit": 1024},
		}
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), out, 0o644)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
