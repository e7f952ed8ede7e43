package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/client"
	"github.com/warrenhq/warren/internal/image"
)

// scratchFS makes a fresh ext4 filesystem (mkfs.ext4's defaults: a
// journal, 4 KiB blocks) of size bytes in a sparse file under dir, on a
// direct-I/O loop device, and mounts it on dir/fs: a node's data disk of
// its own, so that neither earlier runs nor other work on the host's
// filesystem shape the figures. The loop device detaches itself when the
// filesystem is unmounted.
func scratchFS(ctx context.Context, dir string, size int64) (string, error) {
	img := filepath.Join(dir, "disk.img")
	f, err := os.Create(img)
	if err != nil {
		return "", err
	}
	if err := errors.Join(f.Truncate(size), f.Close()); err != nil {
		return "", err
	}
	backing, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("no loop devices (use -fs host): %w", err)
	}
	defer ctl.Close()
	var loop *os.File
	for attempt := 0; loop == nil; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("loop-control: %w", err)
		}
		l, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Size: 4096}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(int(l.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) && attempt < 10 {
			l.Close() // taken between GET_FREE and here
			continue
		}
		if err != nil {
			l.Close()
			return "", fmt.Errorf("configure %s: %w", l.Name(), err)
		}
		loop = l
	}
	// Closed after the mount: from then on the mount holds the device.
	defer loop.Close()
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop.Name()).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("mkfs.ext4 %s: %v: %s", loop.Name(), err, out)
	}
	mnt := filepath.Join(dir, "fs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return "", err
	}
	if err := unix.Mount(loop.Name(), mnt, "ext4", 0, ""); err != nil {
		return "", fmt.Errorf("mount %s: %w", loop.Name(), err)
	}
	return mnt, nil
}

// diskUsage is du's figure for dir: allocated blocks of everything under
// it, each inode once, not crossing into other mounts.
func diskUsage(dir string) (int64, error) {
	var root unix.Stat_t
	if err := unix.Lstat(dir, &root); err != nil {
		return 0, err
	}
	seen := map[uint64]bool{}
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !seen[st.Ino] {
			seen[st.Ino] = true
			total += st.Blocks * 512
		}
		return nil
	})
	return total, err
}

// unmountUnder detaches every mount at or below dir, stacked ones too.
func unmountUnder(dir string) error {
	var left []string
	for pass := 0; pass < 10; pass++ {
		mps, err := image.MountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		left = mps
		for _, mp := range mps {
			unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
	return fmt.Errorf("still mounted under %s: %s", dir, strings.Join(left, ", "))
}

// deleteSandboxes deletes every sandbox the bench's warren has.
func deleteSandboxes(c *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sbs, err := c.ListSandboxes(ctx, client.ListOptions{})
	if err != nil {
		return
	}
	for _, sb := range sbs {
		c.DeleteSandbox(ctx, sb.ID)
	}
}

// cleanup removes what the run made under dir: containers the bench's
// warren may have left in its runc root, every mount, then the files. It
// removes no file while a mount remains, so nothing is deleted through
// one.
func cleanup(dir, dataDir string) error {
	runcRoot := filepath.Join(dataDir, "node", "runc")
	if _, err := os.Stat(runcRoot); err == nil {
		out, _ := exec.Command("runc", "--root", runcRoot, "list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			exec.Command("runc", "--root", runcRoot, "delete", "--force", id).Run()
		}
	}
	// The node's cgroup parents, which outlive their sandboxes; rmdir
	// removes only empty ones.
	if id, err := os.ReadFile(filepath.Join(dataDir, "node-id")); err == nil && strings.TrimSpace(string(id)) != "" {
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/warren/" + strings.TrimSpace(string(id)))
		dirs = append(dirs, "/sys/fs/cgroup/warren/"+strings.TrimSpace(string(id)))
		for _, d := range dirs {
			os.Remove(d)
		}
	}
	if err := unmountUnder(dir); err != nil {
		return fmt.Errorf("%w; left %s in place", err, dir)
	}
	return os.RemoveAll(dir)
}
