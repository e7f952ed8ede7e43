package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// published is the image as warren holds it: three layers and envs
// environments that stack them (sharing one workspace layer: an
// environment is one record whatever its layers, so that does not change
// what re-pointing costs).
type published struct {
	layers  map[string]api.Layer // by ref
	build   map[string]time.Duration
	digests []string // base, workspace, toolkit
	env     string   // the environment the starts use
	envs    []string
}

func envName(i int) string { return fmt.Sprintf("task-%03d", i) }

func publish(ctx context.Context, c *client.Client, img *content, n int) (*published, error) {
	p := &published{layers: map[string]api.Layer{}, build: map[string]time.Duration{}}
	for _, s := range img.stack() {
		t := time.Now()
		l, err := c.BuildLayerFromPath(ctx, client.LayerSpec{Name: s.name, Version: s.version, Kind: s.kind}, s.dir)
		if err != nil {
			return nil, fmt.Errorf("build layer %s: %w", s.ref(), err)
		}
		p.build[s.ref()] = time.Since(t)
		p.layers[s.ref()] = *l
		p.digests = append(p.digests, l.Digest)
	}
	for i := 0; i < n; i++ {
		e, err := c.CreateEnvironment(ctx, api.CreateEnvironmentRequest{
			Name: envName(i), Version: "1",
			Base: img.base.ref(), Workspace: img.workspace.ref(), Toolkits: []string{img.harness7.ref()},
		})
		if err != nil {
			return nil, fmt.Errorf("create environment: %w", err)
		}
		p.envs = append(p.envs, e.Ref)
	}
	p.env = p.envs[0]
	return p, nil
}

func (c *content) print(p *published) {
	fmt.Printf("\nimage: %s in %d files (apparent size of regular files; entries of every type)\n", mb(c.bytes()), c.files())
	fmt.Printf("  %-22s %8s %8s %10s %8s  %s\n", "layer", "files", "bytes", "EROFS", "build", "content")
	for _, s := range append(c.stack(), c.harness8) {
		l, ok := p.layers[s.ref()]
		erofs, build := "-", "-"
		if ok {
			erofs, build = mb(l.Size), dur(p.build[s.ref()])
		}
		fmt.Printf("  %-22s %8d %8s %10s %8s  %s\n", s.kind+" "+s.ref(), s.files, mb(s.bytes), erofs, build, s.notes[0])
		for _, n := range s.notes[1:] {
			fmt.Printf("  %59s  %s\n", "", n)
		}
	}
	fmt.Printf("  tar.gz of base+workspace+harness@7 (tar --numeric-owner -czf, gzip -6): %s, made in %s\n", mb(c.tarSize), dur(c.tarTime))
	fmt.Printf("  layers built through the API (tar upload -> extract -> mkfs.erofs -> chunks); %d environments %s..%s = base+workspace+harness@7\n",
		len(p.envs), p.envs[0], p.envs[len(p.envs)-1])
}

// upgrade compares upgrading the toolkit of every environment: layered
// (publish harness@8 once, then a new version of each environment that
// re-points to it) against rebuilding each environment's full image.
func (b *bench) upgrade(ctx context.Context) error {
	n := len(b.env.envs)
	fmt.Printf("\n(c) toolkit upgrade harness@7 -> harness@8 across %d environments, through the API\n", n)

	// Layered.
	unix.Sync()
	blob0, err := diskUsage(b.blobs)
	if err != nil {
		return err
	}
	w0, t0 := ioWritten(), time.Now()
	h8 := b.img.harness8
	l8, err := b.c.BuildLayerFromPath(ctx, client.LayerSpec{Name: h8.name, Version: h8.version, Kind: h8.kind}, h8.dir)
	if err != nil {
		return fmt.Errorf("build %s: %w", h8.ref(), err)
	}
	buildD, buildW := time.Since(t0), ioWritten()-w0
	b.env.layers[h8.ref()] = *l8
	unix.Sync()
	blob1, err := diskUsage(b.blobs)
	if err != nil {
		return err
	}
	w1, t1 := ioWritten(), time.Now()
	var first, last *api.Environment
	for _, ref := range b.env.envs {
		e, err := b.c.CreateEnvironment(ctx, api.CreateEnvironmentRequest{From: ref, Toolkits: []string{h8.ref()}})
		if err != nil {
			return fmt.Errorf("re-point %s: %w", ref, err)
		}
		if first == nil {
			first = e
		}
		last = e
	}
	repointD, repointW := time.Since(t1), ioWritten()-w1
	unix.Sync()
	blob2, err := diskUsage(b.blobs)
	if err != nil {
		return err
	}
	// Every new version shares the base and workspace, and has harness@8.
	for _, e := range []*api.Environment{first, last} {
		if len(e.Layers) != 3 || e.Layers[0].Digest != b.env.digests[0] || e.Layers[1].Digest != b.env.digests[1] || e.Layers[2].Digest != l8.Digest {
			return fmt.Errorf("%s after the upgrade has layers %+v", e.Ref, e.Layers)
		}
	}
	layeredD, layeredW, layeredS := buildD+repointD, buildW+repointW, blob2-blob0

	// Rebuilding each full image: the cheapest honest rebuild through the
	// same API, from an overlay view of the three trees (no copy), as one
	// base layer, and an environment of it. Each gets its own 8 KiB
	// /workspace/.task so that no two rebuilt images are the same; they
	// still share all else, so later rebuilds dedupe nearly every chunk
	// against the first (environments with really different workspaces
	// would store about their workspace's size each).
	var rebuilt []sample
	var stored []int64
	for k := 0; k < b.cfg.rebuild; k++ {
		uniq := filepath.Join(b.dir, "src", fmt.Sprintf("task-%d", k))
		if err := writeRandom(filepath.Join(uniq, "workspace/.task"), 8<<10, uint64(100+k)); err != nil {
			return err
		}
		merged := filepath.Join(b.dir, fmt.Sprintf("rebuild-%d", k))
		if err := mountStack(merged, []string{b.img.base.dir, b.img.workspace.dir, h8.dir, uniq}); err != nil {
			return err
		}
		unix.Sync()
		s0, err := diskUsage(b.blobs)
		if err != nil {
			return err
		}
		name := envName(k) + "-full"
		w, t := ioWritten(), time.Now()
		_, err = b.c.BuildLayerFromPath(ctx, client.LayerSpec{Name: name, Version: "2", Kind: api.LayerBase}, merged)
		if err == nil {
			_, err = b.c.CreateEnvironment(ctx, api.CreateEnvironmentRequest{Name: name, Version: "2", Base: name + "@2"})
		}
		s := sample{d: time.Since(t), written: ioWritten() - w}
		unix.Unmount(merged, unix.MNT_DETACH)
		os.Remove(merged)
		if err != nil {
			return fmt.Errorf("rebuild %s: %w", name, err)
		}
		unix.Sync()
		s1, err := diskUsage(b.blobs)
		if err != nil {
			return err
		}
		rebuilt = append(rebuilt, s)
		stored = append(stored, s1-s0)
		fmt.Printf("  rebuilt %s@2: %s, %s written, %s new in the blob store\n", name, dur(s.d), mb(s.written), mb(s1-s0))
	}
	// The first rebuild stores the chunks no layer has; each further one
	// only what differs from the first. Extrapolated: first + (n-1) x the
	// median further one.
	for i := range rebuilt {
		rebuilt[i].du = stored[i]
	}
	r1, further := rebuilt[0], rebuilt[min(1, len(rebuilt)-1):]
	fd := func(s sample) float64 { return float64(s.d) }
	fw := func(s sample) float64 { return float64(s.written) }
	fs := func(s sample) float64 { return float64(s.du) }
	ext := func(f func(sample) float64) float64 { return f(r1) + float64(n-1)*median(further, f) }
	fullD, fullW, fullS := ext(fd), ext(fw), ext(fs)

	row := func(name, d, w, st string) { fmt.Printf("  %-46s %10s %14s %16s\n", name, d, w, st) }
	fmt.Println()
	row("", "time", "bytes written", "blob store grew")
	row("layered: build+publish harness@8 once", dur(buildD), mb(buildW), mb(blob1-blob0))
	row(fmt.Sprintf("         re-point %d environments", n), dur(repointD), mb(repointW), mb(blob2-blob1))
	row("         per environment", fmtDur(float64(repointD)/float64(n)), "", "")
	row("         total", dur(layeredD), mb(layeredW), mb(layeredS))
	row("rebuild: first full image", dur(r1.d), mb(r1.written), mb(r1.du))
	if len(rebuilt) > 1 {
		row(fmt.Sprintf("         each further one (median of %d)", len(further)),
			fmtDur(median(further, fd)), fmtBytes(median(further, fw)), fmtBytes(median(further, fs)))
	}
	row(fmt.Sprintf("         x%d (EXTRAPOLATED from %d)", n, len(rebuilt)), fmtDur(fullD), fmtBytes(fullW), fmtBytes(fullS))
	fmt.Printf("  layered vs rebuild: %.0fx less time, %.0fx less written, %.1fx less stored\n",
		fullD/float64(layeredD), fullW/float64(layeredW), fullS/float64(max(layeredS, 1)))
	return nil
}
