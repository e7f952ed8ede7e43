package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// job is one trivial program, as every peer runs it: from a read-only
// root (a /box layer over a Debian rootfs image), in /box.
type job struct {
	name   string
	about  string
	image  string   // the image, as given, and what it says it is
	rootfs string   // this run's snapshot of it
	root   string   // read-only overlay: /box layer over rootfs
	argv   []string // inside root, absolute
	want   string   // its stdout

	// For the warren peer, which gets the program rather than the root.
	source     string // main.py, or hello.c
	binary     []byte // the prepared c binary
	warrenOnly bool   // no local peer runs it
}

// env is every peer's environment for the program.
var env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"}

const helloC = "#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n"

// prepareJobs builds the jobs cfg.jobs names under dir and returns the
// mounts it made (for the caller to undo, also on error).
func prepareJobs(ctx context.Context, cfg config, dir string) ([]*job, []string, error) {
	var mounts []string
	var jobs []*job
	for _, name := range cfg.jobs {
		var j *job
		switch name {
		case "python":
			if _, err := os.Stat(filepath.Join(cfg.pyRootfs, "usr/bin/python3")); err != nil {
				return nil, mounts, fmt.Errorf("no python3 in -python-rootfs %s (build it: scripts/build-runtime-images python): %w", cfg.pyRootfs, err)
			}
			rootfs, err := snapshot(ctx, cfg.pyRootfs, filepath.Join(dir, "image-python"))
			if err != nil {
				return nil, mounts, err
			}
			// argv is set with the peers (setPythonArgs).
			j = &job{name: "python", rootfs: rootfs, source: "print(1)\n", want: "1\n",
				image: fmt.Sprintf("from %s (%s)", cfg.pyRootfs, imageInfo(rootfs))}
			if err := writeBox(filepath.Join(dir, "box-python"), map[string][]byte{"main.py": []byte(j.source)}, 0o644); err != nil {
				return nil, mounts, err
			}
		case "c":
			bin, about, err := compileHello(ctx, cfg, dir)
			if err != nil {
				return nil, mounts, err
			}
			j = &job{name: "c", rootfs: about.rootfs, source: helloC, binary: bin, want: "hello\n",
				argv: []string{"/box/hello"}}
			j.about = fmt.Sprintf("/box/hello (puts(\"hello\"), gcc -O2, dynamically linked, %d bytes; compiled with %s), run from %s (%s)",
				len(bin), about.compiler, about.image, imageInfo(about.rootfs))
			if err := writeBox(filepath.Join(dir, "box-c"), map[string][]byte{"hello": bin, "hello.c": []byte(helloC)}, 0o755); err != nil {
				return nil, mounts, err
			}
		case "c-compile":
			// Warren only: the local peers would need a writable root and
			// a compile step of their own to be comparable.
			jobs = append(jobs, &job{name: name, source: helloC, want: "hello\n", warrenOnly: true,
				about: "hello.c as Source of runtime c: compile and run in one call (warren only; no ratio)"})
			continue
		default:
			return nil, mounts, fmt.Errorf("unknown job %q (python, c, c-compile)", name)
		}
		j.root = filepath.Join(dir, "root-"+j.name)
		if err := os.Mkdir(j.root, 0o755); err != nil {
			return nil, mounts, err
		}
		// Only lower dirs: the overlay is read-only, and nothing a peer
		// does reaches the shared image.
		opts := fmt.Sprintf("lowerdir=%s:%s", filepath.Join(dir, "box-"+j.name), j.rootfs)
		if err := syscall.Mount("overlay", j.root, "overlay", syscall.MS_RDONLY, opts); err != nil {
			return nil, mounts, fmt.Errorf("mount overlay on %s: %w", j.root, err)
		}
		mounts = append(mounts, j.root)
		jobs = append(jobs, j)
	}
	return jobs, mounts, nil
}

// writeBox makes layer/box with files, plus the mountpoints podman binds
// its own files onto (it would create them in the root, which is
// read-only).
func writeBox(layer string, files map[string][]byte, mode os.FileMode) error {
	for _, d := range []string{"box", "run", "etc"} {
		if err := os.MkdirAll(filepath.Join(layer, d), 0o755); err != nil {
			return err
		}
	}
	for name, b := range files {
		m := mode
		if strings.HasSuffix(name, ".c") || strings.HasSuffix(name, ".py") {
			m = 0o644
		}
		if err := os.WriteFile(filepath.Join(layer, "box", name), b, m); err != nil {
			return err
		}
	}
	for _, f := range []string{"run/.containerenv", "etc/hosts"} {
		if err := os.WriteFile(filepath.Join(layer, f), nil, 0o644); err != nil {
			return err
		}
	}
	return os.Symlink("../proc/self/mounts", filepath.Join(layer, "etc/mtab"))
}

type compiled struct{ image, rootfs, compiler string }

// snapshot copies an image to dst as hard links (a full copy if that
// fails): a rebuild that swaps the image and deletes the old one mid-run
// then cannot pull files from under the peers. Nothing writes through the
// links: the peers' overlays are read-only, the compile's copies up.
func snapshot(ctx context.Context, src, dst string) (string, error) {
	if _, err := os.Stat(dst); err == nil {
		return dst, nil // the same image for two jobs
	}
	if out, err := exec.CommandContext(ctx, "cp", "-al", src, dst).CombinedOutput(); err != nil {
		os.RemoveAll(dst)
		if out2, err := exec.CommandContext(ctx, "cp", "-a", src, dst).CombinedOutput(); err != nil {
			return "", fmt.Errorf("copy %s: %v: %s (cp -al: %s)", src, err, tail(out2), tail(out))
		}
	}
	return dst, nil
}

// compileHello compiles hello.c with the c rootfs's own gcc (chrooted into
// a writable overlay over it, thrown away after), or, when there is no
// such rootfs, with the host's gcc; the binary then runs from the python
// rootfs (the same Debian release and libc as the host, checked by
// running it there before timing).
func compileHello(ctx context.Context, cfg config, dir string) ([]byte, compiled, error) {
	if _, err := os.Stat(filepath.Join(cfg.cRootfs, "usr/bin/gcc")); err != nil {
		pyRootfs, err := snapshot(ctx, cfg.pyRootfs, filepath.Join(dir, "image-python"))
		if err != nil {
			return nil, compiled{}, err
		}
		out := filepath.Join(dir, "hello")
		src := filepath.Join(dir, "hello.c")
		if err := os.WriteFile(src, []byte(helloC), 0o644); err != nil {
			return nil, compiled{}, err
		}
		if b, err := exec.CommandContext(ctx, "gcc", "-O2", "-o", out, src).CombinedOutput(); err != nil {
			return nil, compiled{}, fmt.Errorf("host gcc: %v: %s", err, b)
		}
		bin, err := os.ReadFile(out)
		v, _ := exec.Command("gcc", "-dumpfullversion").Output()
		return bin, compiled{image: cfg.pyRootfs, rootfs: pyRootfs,
			compiler: fmt.Sprintf("the HOST's gcc %s (no gcc in -c-rootfs %s)", strings.TrimSpace(string(v)), cfg.cRootfs)}, err
	}
	rootfs, err := snapshot(ctx, cfg.cRootfs, filepath.Join(dir, "image-c"))
	if err != nil {
		return nil, compiled{}, err
	}
	cc := filepath.Join(dir, "cc")
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.MkdirAll(filepath.Join(cc, d), 0o755); err != nil {
			return nil, compiled{}, err
		}
	}
	root := filepath.Join(cc, "root")
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", rootfs, filepath.Join(cc, "upper"), filepath.Join(cc, "work"))
	if err := syscall.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return nil, compiled{}, fmt.Errorf("mount overlay for the compile: %w", err)
	}
	defer syscall.Unmount(root, syscall.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(root, "tmp/hello.c"), []byte(helloC), 0o644); err != nil {
		return nil, compiled{}, err
	}
	cmd := exec.CommandContext(ctx, "/usr/bin/gcc", "-O2", "-o", "/tmp/hello", "/tmp/hello.c")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir, cmd.Env = "/tmp", env
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, compiled{}, fmt.Errorf("gcc in %s: %v: %s", rootfs, err, b)
	}
	bin, err := os.ReadFile(filepath.Join(root, "tmp/hello"))
	v := exec.Command("/usr/bin/gcc", "-dumpfullversion")
	v.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	vb, _ := v.Output()
	return bin, compiled{image: cfg.cRootfs, rootfs: rootfs, compiler: "the image's gcc " + strings.TrimSpace(string(vb))}, err
}

// imageInfo summarises a rootfs's /etc/warren-image, or its os-release.
func imageInfo(rootfs string) string {
	b, err := os.ReadFile(filepath.Join(rootfs, "etc/warren-image"))
	if err != nil {
		b, _ = os.ReadFile(filepath.Join(rootfs, "etc/os-release"))
	}
	kv := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			kv[k] = strings.Trim(v, `"`)
		}
	}
	if kv["name"] != "" {
		s := fmt.Sprintf("%s, Debian %s %s, built %s", kv["name"], kv["version"], kv["suite"], kv["built"])
		for _, k := range []string{"python", "gcc"} {
			if kv[k] != "" {
				s += ", " + k + " " + kv[k]
			}
		}
		return s
	}
	if kv["PRETTY_NAME"] != "" {
		return kv["PRETTY_NAME"]
	}
	return "unknown image"
}

// tail is the last line or so of a command's stderr, for an error.
func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = "..." + s[len(s)-300:]
	}
	return s
}
