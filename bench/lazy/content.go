package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// env is one environment of the run: the shared base plus a workspace
// layer of its own, full of files of random bytes.
type env struct {
	ref   string
	seed  uint64
	bytes int64 // the whole image, base included
	files []file
}

type file struct {
	path string // in the sandbox
	size int64
}

// workspaceRoot is where a workspace's files appear in its sandboxes.
const workspaceRoot = "/srv/work"

// publish builds the base layer from baseDir and n environments of about
// mb MB of workspace each, through the API, as users would (`warren layer
// build`, `warren env create`).
func publish(ctx context.Context, c *client.Client, dir, baseDir string, n int, mb int64) ([]*env, error) {
	if _, err := c.BuildLayerFromPath(ctx, client.LayerSpec{Name: "bench-base", Version: "1", Kind: api.LayerBase}, baseDir); err != nil {
		return nil, fmt.Errorf("base layer from %s: %w", baseDir, err)
	}
	baseBytes, err := treeBytes(baseDir)
	if err != nil {
		return nil, err
	}
	var envs []*env
	for i := range n {
		name := fmt.Sprintf("bench-env-%02d", i)
		src := filepath.Join(dir, name)
		files, err := synthesize(filepath.Join(src, workspaceRoot), mb<<20, uint64(i))
		if err != nil {
			return nil, err
		}
		if _, err := c.BuildLayerFromPath(ctx, client.LayerSpec{Name: name, Version: "1", Kind: api.LayerWorkspace}, src); err != nil {
			return nil, fmt.Errorf("workspace layer %s: %w", name, err)
		}
		os.RemoveAll(src)
		if _, err := c.CreateEnvironment(ctx, api.CreateEnvironmentRequest{Name: name, Version: "1", Base: "bench-base@1", Workspace: name + "@1", Workdir: workspaceRoot}); err != nil {
			return nil, err
		}
		e := &env{ref: name + "@1", seed: uint64(i), files: files, bytes: baseBytes}
		for _, f := range files {
			e.bytes += f.size
		}
		envs = append(envs, e)
		fmt.Printf("\r  published %d of %d environments", i+1, n)
	}
	fmt.Println()
	return envs, nil
}

// synthesize fills dir with files of random bytes (incompressible, as
// built code and data mostly are after compression), log-uniformly 4 KiB
// to 4 MiB, until they add up to want bytes.
func synthesize(dir string, want int64, seed uint64) ([]file, error) {
	r := rand.New(rand.NewPCG(seed, 7))
	var files []file
	var total int64
	buf := make([]byte, 4<<20)
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	src := rand.NewChaCha8(key)
	for i := 0; total < want; i++ {
		size := int64(math.Exp(math.Log(4<<10) + r.Float64()*(math.Log(4<<20)-math.Log(4<<10))))
		size = min(size, want-total)
		sub := fmt.Sprintf("d%02d", i%16)
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, err
		}
		name := fmt.Sprintf("f%05d.bin", i)
		src.Read(buf[:size])
		if err := os.WriteFile(filepath.Join(dir, sub, name), buf[:size], 0o644); err != nil {
			return nil, err
		}
		files = append(files, file{path: filepath.Join(workspaceRoot, sub, name), size: size})
		total += size
	}
	return files, nil
}

// taskFiles picks what a task in e reads: pct percent of the image's
// bytes, the fraction shared of it from the environment's hot set (every
// task of e reads it: the repository's sources, the test suite) and the
// rest the task's own, by seed.
func (e *env) taskFiles(pct, shared float64, seed uint64) (paths []string, bytes int64) {
	want := int64(float64(e.bytes) * pct / 100)
	taken := map[int]bool{}
	pick := func(r *rand.Rand, budget int64) {
		var got int64
		for _, i := range r.Perm(len(e.files)) {
			if got >= budget {
				break
			}
			f := e.files[i]
			if taken[i] || f.size > budget-got+budget/4 {
				continue // keep near the budget
			}
			taken[i] = true
			paths = append(paths, f.path)
			got += f.size
		}
		bytes += got
	}
	hot := int64(float64(want) * shared)
	pick(rand.New(rand.NewPCG(e.seed, 1)), hot) // the same for every task of e
	pick(rand.New(rand.NewPCG(seed, 2)), want-hot)
	return paths, bytes
}

func treeBytes(dir string) (int64, error) {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// size is the size of the file at path in e.
func (e *env) size(path string) int64 {
	for _, f := range e.files {
		if f.path == path {
			return f.size
		}
	}
	return 0
}
