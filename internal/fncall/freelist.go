package fncall

import "sync"

// freeList keeps up to max things for reuse: the network namespaces and the
// cgroups of containers that are gone.
type freeList[T any] struct {
	mu     sync.Mutex
	free   []T
	max    int
	closed bool
}

// pop takes the most recently pushed thing, if any.
func (l *freeList[T]) pop() (v T, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.free); n > 0 {
		v, l.free = l.free[n-1], l.free[:n-1]
		return v, true
	}
	return v, false
}

// push keeps v, unless the list is full or closed: then the caller disposes
// of it.
func (l *freeList[T]) push(v T) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || len(l.free) >= l.max {
		return false
	}
	l.free = append(l.free, v)
	return true
}

// close empties the list for good and returns what it held.
func (l *freeList[T]) close() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	free := l.free
	l.free, l.closed = nil, true
	return free
}
