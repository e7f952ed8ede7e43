package main

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/lazy"
	"github.com/warrenhq/warren/internal/rootfs"
)

// job is one measured start, run in a child process so that the kernel's
// I/O accounting of that process is the start's alone.
type job struct {
	Op string `json:"op"` // "warren" or "gotar"

	// warren: the node's view.
	Blobs   string   `json:"blobs,omitempty"`   // the blob store (a directory store)
	Cache   string   `json:"cache,omitempty"`   // the node's layer cache
	Mounts  string   `json:"mounts,omitempty"`  // the node's shared layer mounts
	Digests []string `json:"digests,omitempty"` // the environment's layers, bottom first
	Sandbox string   `json:"sandbox,omitempty"` // the new sandbox's dir
	// Lazy, if set, is the lazy layer server's dir: the node loads layers
	// on demand (its filesystem mounted before the timed start, as an
	// agent's start-up does).
	Lazy string `json:"lazy,omitempty"`

	// gotar
	Tarball string `json:"tarball,omitempty"`
	Dest    string `json:"dest,omitempty"`
}

type result struct {
	NS  int64  `json:"ns"`
	Err string `json:"err,omitempty"`
}

func runWorker(arg string) int {
	var j job
	var res result
	err := json.Unmarshal([]byte(arg), &j)
	if err == nil {
		var d time.Duration
		switch j.Op {
		case "warren":
			d, err = j.warren(context.Background())
		case "gotar":
			d, err = j.gotar()
		default:
			err = fmt.Errorf("unknown op %q", j.Op)
		}
		res.NS = int64(d)
	}
	if err != nil {
		res.Err = err.Error()
	}
	json.NewEncoder(os.Stdout).Encode(res)
	if err != nil {
		return 1
	}
	return 0
}

// warren makes a sandbox's root the way the node agent and the container
// backend do (node.Agent.create, container.Create): fetch each layer into
// the node cache (a stat when cached), take the shared EROFS mount of each
// (adopting one that exists), make the sandbox's upper, work and root
// dirs, and mount the overlay, volatile. Opening the blob store and the
// cache is the agent's start-up, not the sandbox's, so it is not timed.
func (j job) warren(ctx context.Context) (time.Duration, error) {
	bs, err := blob.NewDir(j.Blobs)
	if err != nil {
		return 0, err
	}
	cache := image.NewCache(j.Cache, bs)
	mounts := image.NewMounts(j.Mounts)
	if j.Lazy != "" {
		chunks, err := lazy.OpenCache(filepath.Join(j.Lazy, "chunks"), bs, 16<<30)
		if err != nil {
			return 0, err
		}
		fsys, err := lazy.Mount(lazy.MountDir(j.Lazy), chunks)
		if err != nil {
			return 0, err
		}
		cache.SetLazy(lazy.Local(fsys))
		// The filesystem ends with this process: what is mounted on it
		// goes first (untimed), so that nothing dead is left for the
		// bench's du and cleanup to trip on.
		defer func() {
			unix.Unmount(filepath.Join(j.Sandbox, "rootfs"), unix.MNT_DETACH)
			if ms, err := image.MountsUnder(j.Mounts); err == nil {
				for _, m := range ms {
					unix.Unmount(m, unix.MNT_DETACH)
				}
			}
			fsys.Close()
		}()
	}

	start := time.Now()
	layers := make([]backend.Layer, 0, len(j.Digests))
	for _, d := range j.Digests {
		l, err := cache.Fetch(ctx, d)
		if err != nil {
			return 0, err
		}
		layers = append(layers, l)
	}
	lower := make([]string, len(layers))
	for i, l := range layers {
		mp, err := mounts.Acquire(ctx, l)
		if err != nil {
			return 0, err
		}
		lower[len(lower)-1-i] = mp
	}
	if err := os.Mkdir(j.Sandbox, 0o700); err != nil {
		return 0, err
	}
	upper, work, root := filepath.Join(j.Sandbox, "upper"), filepath.Join(j.Sandbox, "work"), filepath.Join(j.Sandbox, "rootfs")
	for _, d := range []string{upper, work, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return 0, err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,volatile", strings.Join(lower, ":"), upper, work)
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return 0, fmt.Errorf("mount overlay: %w", err)
	}
	return time.Since(start), nil
}

// gotar extracts the tar.gz with Go: compress/gzip and warren's own safe
// extractor (rootfs.WriteTar, as image imports use), into a new dir.
func (j job) gotar() (time.Duration, error) {
	start := time.Now()
	f, err := os.Open(j.Tarball)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	gz, err := gzip.NewReader(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return 0, err
	}
	if err := os.Mkdir(j.Dest, 0o755); err != nil {
		return 0, err
	}
	if err := rootfs.WriteTar(j.Dest, "/", gz); err != nil {
		return 0, err
	}
	if _, err := io.Copy(io.Discard, gz); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	return time.Since(start), nil
}
