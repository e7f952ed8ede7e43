// Package osthread runs code on an OS thread of its own, for the calls
// that change the calling thread for good: entering a namespace
// (setns(2)), unsharing its filesystem attributes, its fsuid.
//
// A goroutine that ends while locked to its thread takes the thread with
// it, except the main thread, which Go keeps (wedged, running nothing
// else). The main thread is the thread group leader, whose namespaces
// /proc/self shows: a mount namespace entered there would change what
// /proc/self/mountinfo says to every goroutine of the process. So Run
// never runs its function there.
package osthread

import (
	"os/exec"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Run runs f on a thread no other goroutine runs on before or after it,
// and not the main thread, and returns f's error. f may change the thread
// in any way: the thread ends with it.
func Run(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread: held here, so the goroutine Run starts
			// now gets another one, and given back unchanged.
			err := Run(f)
			runtime.UnlockOSThread()
			done <- err
			return
		}
		done <- f() // no Unlock: the thread ends with this goroutine
	}()
	return <-done
}

// Start starts cmd from one of a few OS threads that live as long as the
// process. A child's parent-death signal (PR_SET_PDEATHSIG, which
// warren-enter sets on itself) fires when the thread that forked it ends,
// not the process; and Go ends a thread whenever a goroutine ends locked
// to it (Run's do), so a child forked from whatever thread a goroutine
// happened to run on could be killed by an unrelated Run later. Wait may
// be called from anywhere.
func Start(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawns = make(chan spawnReq)
		for range spawners {
			go func() {
				runtime.LockOSThread() // for good: this thread never ends
				for r := range spawns {
					r.done <- r.cmd.Start()
				}
			}()
		}
	})
	done := make(chan error, 1)
	spawns <- spawnReq{cmd, done}
	return <-done
}

// spawners is how many threads Start forks from: forks take ~0.1-1 ms,
// and a few at once keep concurrent execs from queueing.
const spawners = 4

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawns    chan spawnReq
)

// Locked runs f on a thread locked to it, never the main thread. The
// thread goes back to the scheduler if f returns true (f left it as it
// found it), and ends with f otherwise.
func Locked(f func() (restored bool)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			Locked(f) // the main thread, held here: another one does it
			runtime.UnlockOSThread()
			return
		}
		if f() {
			runtime.UnlockOSThread()
		}
	}()
	<-done
}
