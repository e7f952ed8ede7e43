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
	"runtime"

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
