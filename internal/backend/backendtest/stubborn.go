package backendtest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// stubborn are exec commands that resist being ended in each way a
// process can: blocked in the kernel opening a FIFO nobody writes,
// stopped by SIGSTOP, and ignoring every catchable signal (SIGCHLD aside,
// which would change how sh waits). Each gets a forked child too, so a
// tree is killed, not one process.
var stubborn = []struct{ name, script string }{
	{"FIFO", "mkfifo {id}.fifo 2>/dev/null; sleep 1000 & cat {id}.fifo"},
	{"Stopped", "sleep 1000 & kill -STOP $$; echo resumed"},
	{"IgnoresSignals", "trap '' 1 2 3 4 5 6 7 8 10 11 12 13 14 15 16 18 20 21 22 23 24 25 26 27 28 29 30 31; " +
		"sleep 1000 & while :; do sleep 1; done"},
}

// longTimeout is over a minute: limits and contexts of a minute in the
// exec path once turned such timeouts into internal errors that left the
// exec's cgroup frozen and its sandbox undeletable.
const longTimeout = 61 * time.Second

// testExecStubborn checks that exec timeouts and cancellation, short and
// over a minute, end every stubborn command as timed out (or with the
// context's error) with its whole tree killed, that the sandbox still
// runs commands after, and that Destroy then succeeds and leaves nothing
// behind. The long cases run in parallel, so the group costs about one
// long timeout.
func (s *suite) testExecStubborn(t *testing.T) {
	needs(t, s.caps.Exec, "Exec")
	type kase struct {
		name, script, how string
		d                 time.Duration
	}
	var short, long []kase
	for _, cmd := range stubborn {
		for _, how := range []string{"Timeout", "Cancel"} {
			if how == "Timeout" || cmd.name == "FIFO" { // ExecKill covers short cancellation
				short = append(short, kase{cmd.name + "/" + how + "1s", cmd.script, how, time.Second})
			}
			long = append(long, kase{cmd.name + "/" + how + "1m1s", cmd.script, how, longTimeout})
		}
	}
	run := func(t *testing.T, k kase) {
		s.stubbornCase(t, strings.ReplaceAll(k.script, "{id}", newID(t)), k.how, k.d)
	}
	for _, k := range short {
		t.Run(k.name, func(t *testing.T) { t.Parallel(); run(t, k) })
	}
	// All long cases at once, whatever -parallel says (it defaults to
	// the CPU count): they mostly wait.
	t.Run("Long", func(t *testing.T) {
		t.Parallel()
		var wg sync.WaitGroup
		for _, k := range long {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.Run(k.name, func(t *testing.T) { run(t, k) })
			}()
		}
		wg.Wait()
	})
}

func (s *suite) stubbornCase(t *testing.T, script, how string, d time.Duration) {
	c, cancel := context.WithTimeout(t.Context(), d+callTimeout)
	defer cancel()
	spec := s.spec(t)
	if err := s.b.Create(c, spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			s.b.Destroy(context.Background(), spec.ID)
		}
	})
	if err := s.b.Start(c, spec.ID); err != nil {
		t.Fatalf("Start: %v", err)
	}
	req := backend.ExecRequest{Argv: []string{"sh", "-c", script}, Cwd: "/", Timeout: d}
	ec := c
	start := time.Now()
	if how == "Cancel" {
		req.Timeout = d + time.Hour
		var stop context.CancelFunc
		ec, stop = context.WithCancel(c)
		defer stop()
		time.AfterFunc(d, stop)
	}
	out, err := exec(ec, s.b, spec.ID, req)
	took := time.Since(start)
	if took > d+killWithin {
		t.Errorf("exec with a %v %s took %v, want < %v", d, how, took, d+killWithin)
	}
	if took < d {
		t.Errorf("exec ended after %v, before its %v %s: %+v %v (stderr %q)", took, d, how, out.ExecResult, err, out.stderr)
	}
	switch how {
	case "Timeout":
		if err != nil || !out.TimedOut || out.ExitCode == 0 {
			t.Errorf("got %+v, %v; want TimedOut, non-zero exit, no error", out.ExecResult, err)
		}
	case "Cancel":
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled exec: got %+v, error %v; want context.Canceled", out.ExecResult, err)
		}
	}
	s.noProcessesLeft(t, spec.ID)
	if got := s.shOK(t, spec.ID, "echo ok"); got != "ok\n" {
		t.Errorf("exec after: got %q, want %q", got, "ok\n")
	}
	// And once more, destroyed with the command still running.
	go exec(c, s.b, spec.ID, backend.ExecRequest{Argv: []string{"sh", "-c", script}, Cwd: "/", Timeout: time.Hour})
	if s.h.Processes != nil {
		eventually(killWithin, func() bool { return s.h.Processes(t, s.b, spec.ID) >= 2 })
	} else {
		time.Sleep(time.Second)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), killWithin)
	defer dcancel()
	if err := s.b.Destroy(dctx, spec.ID); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	destroyed = true
	_, err = s.b.Inspect(c, spec.ID)
	wantErr(t, "Inspect after Destroy", err, errdefs.ErrNotFound)
	if s.h.Leftovers != nil {
		if left := s.h.Leftovers(t, s.b, spec.ID); len(left) > 0 {
			t.Errorf("Destroy left behind: %v", left)
		}
	}
}
