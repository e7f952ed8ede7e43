// Package fninit is warren-fninit, the pid 1 of every FnCall container.
//
// The agent starts it in fresh mount, pid, network, IPC and UTS namespaces
// inside the container's cgroups, with one Unix socket on fd 3 (see
// internal/fncall/proto). fninit builds the container's root (an overlay of
// the runtime's read-only layers over a size-capped tmpfs), brings up lo,
// drops every capability from the bounding set, sets no_new_privs and loads
// a seccomp filter, and reports ready. The container then sits in the pool
// costing one small sleeping process. A call writes its files and runs the
// program once per case as an unprivileged uid; after each run every other
// process in the container is killed. fninit never outlives its socket: when
// the agent closes it, fninit exits, and as the pid namespace's init it takes
// every process of the container with it.
//
// fninit is not a daemon inside the sandbox in the sense the platform
// forbids: it serves nothing to the program, holds no log, and cannot be
// seen, signalled or traced by it (another uid, hidepid=invisible).
package fninit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/fncall/proto"
)

// Every run is forked from the main goroutine's thread, which alone joins
// the container's network namespace and carries the emptied capability
// bounding set (both are per thread; changing them on all of Go's threads
// costs milliseconds). Locking in init keeps the main goroutine on the
// main thread from the start.
func init() { runtime.LockOSThread() }

// Main runs fninit and returns its exit code.
func Main() int {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "warren-fninit: must run as pid 1 of a new pid namespace (the node agent starts it)")
		return 2
	}
	sock := os.NewFile(proto.Fd, "fninit-socket")
	syscall.CloseOnExec(proto.Fd)
	in := &init1{enc: json.NewEncoder(sock), msgs: make(chan proto.Message, 4)}
	go in.read(bufio.NewReader(sock))
	if err := in.serve(); err != nil {
		in.reply(proto.Reply{Error: err.Error()})
		return 1
	}
	return 0
}

// init1 is fninit's state.
type init1 struct {
	enc   *json.Encoder
	msgs  chan proto.Message // closed when the socket ends
	setup *proto.Setup
	ran   bool // a Run happened: no more Files
}

// read forwards the agent's messages; a malformed one ends the conversation
// like a closed socket.
func (in *init1) read(r io.Reader) {
	dec := json.NewDecoder(r)
	for {
		var m proto.Message
		if err := dec.Decode(&m); err != nil {
			close(in.msgs)
			return
		}
		in.msgs <- m
	}
}

func (in *init1) reply(r proto.Reply) {
	_ = in.enc.Encode(r) // a dead socket ends the loop on its own
}

func (in *init1) serve() error {
	m, ok := <-in.msgs
	if !ok {
		return nil
	}
	if m.Setup == nil {
		return errors.New("first message must be setup")
	}
	if err := setup(m.Setup); err != nil {
		return err
	}
	in.setup = m.Setup
	in.reply(proto.Reply{Ready: true})
	for m := range in.msgs {
		switch {
		case m.Files != nil:
			err := in.files(m.Files)
			in.reply(errReply(err))
		case m.Run != nil:
			in.ran = true
			res := in.run(m.Run)
			in.reply(proto.Reply{Result: &res})
		case m.Kill != "":
			// A kill that arrived after its run ended: nothing to do.
		default:
			in.reply(proto.Reply{Error: "empty or repeated setup message"})
		}
	}
	return nil
}

func errReply(err error) proto.Reply {
	if err != nil {
		return proto.Reply{Error: err.Error()}
	}
	return proto.Reply{}
}

// setup builds the container; see the package doc.
func setup(s *proto.Setup) error {
	// The network namespace the agent made (lo only); this thread, which
	// forks every run, joins it.
	if err := unix.Setns(proto.NetnsFd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("join network namespace: %w", err)
	}
	unix.Close(proto.NetnsFd)
	unix.Umask(0o022)
	if err := buildRoot(s); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := dropBounding(); err != nil {
		return err
	}
	return installSeccomp()
}

// dropBounding empties the capability bounding set of the calling thread,
// the one every run is forked from, so nothing a run executes can ever gain
// a capability.
func dropBounding() error {
	last := 40 // CAP_CHECKPOINT_RESTORE; read the kernel's if it says
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		fmt.Sscan(strings.TrimSpace(string(b)), &last)
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	return nil
}

// files writes the call's files under the workdir, owned by the runs' uid.
func (in *init1) files(files []proto.File) error {
	if in.ran {
		return errors.New("files after a run")
	}
	s := in.setup
	for _, f := range files {
		rel := filepath.Clean(f.Path)
		if f.Path == "" || filepath.IsAbs(rel) || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
			return fmt.Errorf("bad file path %q", f.Path)
		}
		p := filepath.Join(s.Workdir, rel)
		if err := mkdirOwned(s.Workdir, filepath.Dir(p), s.UID, s.GID); err != nil {
			return err
		}
		mode := f.Mode & 0o777
		if mode == 0 {
			mode = 0o644
		}
		if err := os.WriteFile(p, f.Data, os.FileMode(mode)); err != nil {
			return err
		}
		if err := os.Chmod(p, os.FileMode(mode)); err != nil { // past the umask
			return err
		}
		if err := os.Lchown(p, s.UID, s.GID); err != nil {
			return err
		}
	}
	return nil
}

// mkdirOwned makes dir and its missing parents below base, owned by uid.
func mkdirOwned(base, dir string, uid, gid int) error {
	if dir == base || !strings.HasPrefix(dir, base+"/") {
		return nil
	}
	if err := mkdirOwned(base, filepath.Dir(dir), uid, gid); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil
		}
		return err
	}
	return os.Lchown(dir, uid, gid)
}
