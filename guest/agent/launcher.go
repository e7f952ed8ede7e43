package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The launcher's descriptors (startLaunch).
const (
	fdConfig = 3
	fdStatus = 4
	fdMntNS  = 5
	fdShell  = 6
	fdUTSNS  = 7
	fdIPCNS  = 8
)

// launcher runs in the sandbox's pid namespace and cgroup, started by the
// agent: it joins the sandbox's mount namespace, goes to the working
// directory, drops privileges and execs the command. What fails before
// the exec it reports on fdStatus ("STAGE ERRNO") and exits 126.
func launcher() {
	// Everything happens on the main thread, which execs at the end.
	runtime.LockOSThread()
	st := os.NewFile(fdStatus, "status")
	fail := func(stage string, err error) {
		if e, ok := err.(syscall.Errno); ok {
			fmt.Fprintf(st, "%s %d", stage, int(e))
		} else {
			fmt.Fprintf(st, "%s %v", stage, err)
		}
		os.Exit(126)
	}
	var l launch
	if err := json.NewDecoder(os.NewFile(fdConfig, "config")).Decode(&l); err != nil {
		fail("config", err)
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		fail("unshare", err)
	}
	for _, ns := range []struct{ fd, typ int }{{fdUTSNS, unix.CLONE_NEWUTS}, {fdIPCNS, unix.CLONE_NEWIPC}, {fdMntNS, unix.CLONE_NEWNS}} {
		if err := unix.Setns(ns.fd, ns.typ); err != nil {
			fail("setns", err)
		}
	}
	if err := unix.Chdir("/"); err != nil {
		fail("chroot", err)
	}
	if err := unix.Chdir(l.Cwd); err != nil {
		fail("cwd", err)
	}
	path := ""
	if !l.Shell {
		var ok bool
		if path, ok = lookPath(l.Argv[0], l.Env); !ok {
			fail("notfound", syscall.ENOENT)
		}
	}
	if err := dropPrivileges(l); err != nil {
		fail("privileges", err)
	}
	for _, fd := range []int{fdConfig, fdStatus, fdMntNS, fdShell, fdUTSNS, fdIPCNS} {
		unix.CloseOnExec(fd)
	}
	var err error
	if l.Shell {
		err = execveat(fdShell, l.Argv, l.Env)
	} else {
		err = syscall.Exec(path, l.Argv, l.Env)
	}
	fail("exec", err)
}

// lookPath finds name on the env's PATH, as a shell does.
func lookPath(name string, env []string) (string, bool) {
	if strings.Contains(name, "/") {
		return name, exists(name)
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// dropPrivileges gives the command the container backend's privileges:
// guard's capability set (no CAP_SYS_ADMIN, SYS_PTRACE, SYS_MODULE, ...),
// the user and group asked for, and no_new_privs.
func dropPrivileges(l launch) error {
	if l.Machine {
		return changeUser(l)
	}
	for c := 0; c <= 63; c++ {
		if l.Bound&(1<<c) == 0 {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
				return fmt.Errorf("drop capability %d: %w", c, err)
			}
		}
	}
	if err := changeUser(l); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	data[0].Effective, data[1].Effective = uint32(l.Eff), uint32(l.Eff>>32)
	data[0].Permitted, data[1].Permitted = uint32(l.Perm), uint32(l.Perm>>32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
}

// execveat execs the file open on fd (the platform's shell, opened in the
// guest's own root before the launcher left it).
func execveat(fd int, argv, env []string) error {
	argvp, err := cStrings(argv)
	if err != nil {
		return err
	}
	envp, err := cStrings(env)
	if err != nil {
		return err
	}
	empty := [1]byte{}
	_, _, e := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(&empty[0])),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), unix.AT_EMPTY_PATH, 0)
	return e
}

func cStrings(ss []string) ([]*byte, error) {
	p := make([]*byte, len(ss)+1)
	for i, s := range ss {
		b, err := unix.BytePtrFromString(s)
		if err != nil {
			return nil, err
		}
		p[i] = b
	}
	return p, nil
}

// changeUser becomes l's user and group (a user other than root loses
// its capabilities with it).
func changeUser(l launch) error {
	if err := syscall.Setgroups([]int{int(l.GID)}); err != nil {
		return err
	}
	if err := syscall.Setresgid(int(l.GID), int(l.GID), int(l.GID)); err != nil {
		return err
	}
	return syscall.Setresuid(int(l.UID), int(l.UID), int(l.UID))
}
