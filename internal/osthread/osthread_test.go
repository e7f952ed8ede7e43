package osthread

import (
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Run never runs its function on the main thread, nor twice on one
// thread, even when the goroutine it starts lands on the main thread
// (main is made free for it by locking every other goroutine away).
func TestRunAvoidsMainThreadAndReuse(t *testing.T) {
	runtime.GOMAXPROCS(4)
	seen := map[int]bool{}
	var mu sync.Mutex
	for range 50 {
		err := Run(func() error {
			tid := unix.Gettid()
			mu.Lock()
			defer mu.Unlock()
			if tid == unix.Getpid() {
				t.Errorf("ran on the main thread")
			}
			if seen[tid] {
				t.Errorf("thread %d ran twice", tid)
			}
			seen[tid] = true
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
