// Command guestctl is the host side of a warren QEMU guest, for scripts
// (scripts/test-cgroup-v2): it builds a guest's initramfs and boots the
// guest, wiring guest/initramfs and internal/qemu.
//
//	guestctl initramfs -init BIN -modules DIR -load m1,m2,... -o FILE
//	guestctl boot -kernel K -initrd I [-disk IMG[:ro]]... [-share TAG=DIR[:ro]]...
//	              [-append 'WORD ...'] [-cpus N] [-mem MiB] [-timeout D] [-log FILE]
//	guestctl accel
//
// accel prints the accelerator boot would use and why: "tcg<TAB>reason".
// boot prints the accelerator it chose and why, copies the serial console
// to stdout (and -log), and exits with the status the guest reported
// (guest/init prints it last); 124 on timeout, 125 if the guest reported
// none.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/warrenhq/warren/guest/initramfs"
	"github.com/warrenhq/warren/internal/qemu"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: guestctl initramfs|boot|accel [flags]")
		os.Exit(2)
	}
	var err error
	code := 0
	switch os.Args[1] {
	case "initramfs":
		err = mkInitramfs(os.Args[2:])
	case "boot":
		code, err = boot(os.Args[2:])
	case "accel":
		a, why := qemu.DetectAccel()
		fmt.Printf("%s\t%s\n", a, why)
	default:
		err = fmt.Errorf("unknown command %q (want initramfs, boot or accel)", os.Args[1])
		code = 2
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "guestctl:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

type list []string

func (l *list) String() string     { return strings.Join(*l, " ") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func mkInitramfs(args []string) error {
	fs := flag.NewFlagSet("initramfs", flag.ExitOnError)
	init := fs.String("init", "", "static init binary (guest/init)")
	mods := fs.String("modules", "", "kernel module tree (lib/modules/RELEASE)")
	load := fs.String("load", "", "comma-separated modules to load, dependencies added")
	out := fs.String("o", "", "output file")
	fs.Parse(args)
	if *init == "" || *out == "" {
		return fmt.Errorf("initramfs needs -init and -o")
	}
	spec := initramfs.Spec{Init: *init, Modules: *mods}
	if *load != "" {
		spec.Load = strings.Split(*load, ",")
	}
	tmp := *out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := initramfs.Write(f, spec); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, *out)
}

func boot(args []string) (int, error) {
	fs := flag.NewFlagSet("boot", flag.ExitOnError)
	m := qemu.Machine{RNG: true}
	var disks, shares list
	fs.StringVar(&m.Kernel, "kernel", "", "kernel image")
	fs.StringVar(&m.Initrd, "initrd", "", "initramfs")
	fs.StringVar(&m.Type, "machine", "pc", "machine type: pc, q35 or microvm")
	fs.Var(&disks, "disk", "raw disk image, IMG or IMG:ro (repeatable; writes are discarded)")
	fs.Var(&shares, "share", "9p share TAG=DIR or TAG=DIR:ro (repeatable)")
	cmdline := fs.String("append", "", "kernel command line")
	fs.IntVar(&m.CPUs, "cpus", 2, "vCPUs")
	fs.IntVar(&m.MemoryMiB, "mem", 2048, "memory in MiB")
	timeout := fs.Duration("timeout", 30*time.Minute, "stop the guest after this long")
	logPath := fs.String("log", "", "also write the console here")
	fs.Parse(args)
	for _, d := range disks {
		p, ro := strings.CutSuffix(d, ":ro")
		m.Disks = append(m.Disks, qemu.Disk{Path: p, ReadOnly: ro, Snapshot: !ro})
	}
	for _, s := range shares {
		tag, dir, ok := strings.Cut(s, "=")
		if !ok {
			return 2, fmt.Errorf("-share %q: want TAG=DIR[:ro]", s)
		}
		dir, ro := strings.CutSuffix(dir, ":ro")
		m.Shares = append(m.Shares, qemu.Share{Tag: tag, Path: dir, ReadOnly: ro})
	}
	m.Cmdline = strings.Fields(*cmdline)
	accel, why := qemu.DetectAccel()
	m.Accel = accel
	fmt.Fprintf(os.Stderr, "guestctl: accelerator %s: %s\n", accel, why)

	var sink io.Writer = os.Stdout
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			return 1, err
		}
		defer f.Close()
		sink = io.MultiWriter(os.Stdout, f)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	start := time.Now()
	st, err := qemu.Run(ctx, m, qemu.NewConsole(sink))
	fmt.Fprintf(os.Stderr, "guestctl: guest ran %s\n", time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return 124, fmt.Errorf("timed out after %s: %w", *timeout, err)
		}
		return 125, err
	}
	return st, nil
}
