package fake

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// markerEnv is the environment entry that tags every process an exec of
// the sandbox rooted at root starts. Children inherit it, also those that
// leave the exec's process group.
func markerEnv(root string) string { return "WARREN_FAKE_ROOT=" + root }

// Processes counts the live processes started by execs in sandbox id
// (zombies not included). Tests use it to check that nothing outlived a
// timeout or a Stop.
func (b *Backend) Processes(id string) int { return len(tagged(b.Root(id))) }

// tagged lists the pids whose environment carries root's marker.
func tagged(root string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && hasMarker(pid, root) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func hasMarker(pid int, root string) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false // gone, or not ours to read
	}
	want := []byte(markerEnv(root))
	for _, kv := range bytes.Split(env, []byte{0}) {
		if bytes.Equal(kv, want) {
			return true
		}
	}
	return false
}

// signal sends sig to every tagged process and returns how many it hit. A
// pidfd pins each process while we re-check its marker, so a pid reused
// meanwhile by someone else's process is never signalled.
func signal(root string, sig unix.Signal) int {
	n := 0
	for _, pid := range tagged(root) {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		if hasMarker(pid, root) && unix.PidfdSendSignal(fd, sig, nil, 0) == nil {
			n++
		}
		unix.Close(fd)
	}
	return n
}

// killAll stops every process of the sandbox rooted at root: SIGTERM and
// up to grace to exit, then SIGKILL until none is left (bounded, in case
// one is stuck in the kernel).
func killAll(ctx context.Context, root string, grace time.Duration) {
	if grace > 0 && signal(root, unix.SIGTERM) > 0 {
		deadline := time.Now().Add(grace)
		for len(tagged(root)) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i := 0; i < 100 && signal(root, unix.SIGKILL) > 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
}
