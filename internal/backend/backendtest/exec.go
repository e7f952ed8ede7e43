package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// testExec runs its cases in parallel in one sandbox: they use distinct
// files, and running them together is a concurrency test of its own.
func (s *suite) testExec(t *testing.T) {
	needs(t, s.caps.Exec, "Exec")
	id := s.running(t, func(sp *backend.Spec) {
		sp.Env = append(sp.Env, "SPEC_A=spec", "SPEC_C=spec")
	})

	t.Run("OutputAndExitCode", func(t *testing.T) {
		t.Parallel()
		out := s.sh(t, id, "echo out; echo err >&2; exit 3")
		if out.stdout != "out\n" || out.stderr != "err\n" || out.ExitCode != 3 {
			t.Errorf("got stdout %q, stderr %q, exit %d; want %q, %q, 3", out.stdout, out.stderr, out.ExitCode, "out\n", "err\n")
		}
		if out.Signal != "" || out.TimedOut {
			t.Errorf("got Signal %q, TimedOut %v; want none", out.Signal, out.TimedOut)
		}
	})

	t.Run("Signal", func(t *testing.T) {
		t.Parallel()
		out := s.sh(t, id, "kill -9 $$")
		if out.ExitCode != 137 || out.Signal != "SIGKILL" {
			t.Errorf("got exit %d, Signal %q; want 137, SIGKILL", out.ExitCode, out.Signal)
		}
	})

	t.Run("Stdin", func(t *testing.T) {
		t.Parallel()
		in := "hello\nworld\n"
		out, err := exec(ctx(t), s.b, id, backend.ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader(in)})
		if err != nil || out.stdout != in {
			t.Errorf("cat: got %q, %v; want %q", out.stdout, err, in)
		}
		big := bytes.Repeat([]byte("x"), 1<<20)
		out, err = exec(ctx(t), s.b, id, backend.ExecRequest{Argv: []string{"wc", "-c"}, Stdin: bytes.NewReader(big)})
		if err != nil || trim(out.stdout) != "1048576" {
			t.Errorf("wc -c of 1 MiB of stdin: got %q, %v; want 1048576", out.stdout, err)
		}
		// No stdin is an empty one, not a pipe left open.
		out, err = exec(ctx(t), s.b, id, backend.ExecRequest{Argv: []string{"cat"}, Timeout: 20 * time.Second})
		if err != nil || out.stdout != "" || out.TimedOut {
			t.Errorf("cat without stdin: got %q, TimedOut %v, %v; want empty output at once", out.stdout, out.TimedOut, err)
		}
	})

	t.Run("Env", func(t *testing.T) {
		t.Parallel()
		out := s.shOK(t, id, `echo "$SPEC_A $REQ_B $SPEC_C"`, func(r *backend.ExecRequest) {
			r.Env = []string{"REQ_B=req", "SPEC_C=req"}
		})
		if out != "spec req req\n" {
			t.Errorf("got %q, want %q (spec env, then the request's on top)", out, "spec req req\n")
		}
	})

	t.Run("Cwd", func(t *testing.T) {
		t.Parallel()
		s.shOK(t, id, "mkdir -p cwdtest/sub && echo here > cwdtest/sub/marker")
		out := s.shOK(t, id, "cat marker", func(r *backend.ExecRequest) { r.Cwd = "/cwdtest/sub" })
		if out != "here\n" {
			t.Errorf("cat marker in /cwdtest/sub: got %q, want %q", out, "here\n")
		}
		_, err := exec(ctx(t), s.b, id, backend.ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"})
		wantErr(t, "Exec with a missing cwd", err, errdefs.ErrInvalid)
	})

	t.Run("BadCommand", func(t *testing.T) {
		t.Parallel()
		out, err := exec(ctx(t), s.b, id, backend.ExecRequest{Argv: []string{"warren-no-such-command"}})
		if err != nil || out.ExitCode != 127 {
			t.Errorf("unknown command: got exit %d, %v; want 127, nil", out.ExitCode, err)
		}
		_, err = exec(ctx(t), s.b, id, backend.ExecRequest{})
		wantErr(t, "Exec with an empty argv", err, errdefs.ErrInvalid)
	})

	t.Run("LargeOutput", func(t *testing.T) {
		t.Parallel()
		// stderr first: a backend that drains stdout before stderr
		// deadlocks here.
		const n = 5 << 20
		out := s.sh(t, id, fmt.Sprintf("yes 0123456789abcdef | head -c %d >&2; yes 0123456789abcdef | head -c %d", n, n))
		want := strings.Repeat("0123456789abcdef\n", n/17+1)[:n]
		if out.stdout != want || out.stderr != want {
			t.Errorf("got %d bytes of stdout, %d of stderr (intact: %v, %v); want %d intact each",
				len(out.stdout), len(out.stderr), out.stdout == want, out.stderr == want, n)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		const n = 8
		var wg sync.WaitGroup
		errs := make([]string, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				want := strconv.Itoa(i)
				out, err := exec(ctx(t), s.b, id, backend.ExecRequest{
					Argv: []string{"sh", "-c", "sleep 0.2; echo $N"}, Env: []string{"N=" + want}})
				if err != nil || trim(out.stdout) != want {
					errs[i] = fmt.Sprintf("exec %d: got %q, %v; want %q", i, out.stdout, err, want)
				}
			}()
		}
		wg.Wait()
		for _, e := range errs {
			if e != "" {
				t.Error(e)
			}
		}
	})

	t.Run("Background", func(t *testing.T) {
		t.Parallel()
		// A detached background process outlives its exec ...
		s.shOK(t, id, "sleep 30 </dev/null >/dev/null 2>&1 & echo $! > bgpid")
		if out := s.sh(t, id, `kill -0 "$(cat bgpid)"`); out.ExitCode != 0 {
			t.Errorf("background process gone after its exec ended: kill -0 exit %d, %q", out.ExitCode, out.stderr)
		}
		// ... and one that keeps the output pipe open does not hold the
		// exec for long.
		start := time.Now()
		s.sh(t, id, "sleep 30 & echo started")
		if d := time.Since(start); d > killWithin {
			t.Errorf("exec with a background child holding stdout took %v, want < %v", d, killWithin)
		}
	})

	t.Run("Workdir", func(t *testing.T) {
		t.Parallel()
		wid := s.running(t, func(sp *backend.Spec) { sp.Workdir = "/wd" })
		s.shOK(t, wid, "mkdir wd && echo wd > wd/m")
		out, err := exec(ctx(t), s.b, wid, backend.ExecRequest{Argv: []string{"cat", "m"}})
		if err != nil || out.stdout != "wd\n" {
			t.Errorf("cat m with spec.Workdir /wd: got %q, %v; want %q", out.stdout, err, "wd\n")
		}
	})
}

// testExecKill checks timeouts, cancellation, Stop and Destroy kill an
// exec's whole process tree. Each case has its own sandbox, so the process
// counts are its own.
func (s *suite) testExecKill(t *testing.T) {
	needs(t, s.caps.Exec, "Exec")
	const tree = "sleep 60 & sleep 60"

	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		id := s.running(t)
		start := time.Now()
		out := s.sh(t, id, tree, func(r *backend.ExecRequest) { r.Timeout = time.Second })
		if d := time.Since(start); d > killWithin {
			t.Errorf("exec with a 1s timeout took %v, want < %v", d, killWithin)
		}
		if !out.TimedOut || out.ExitCode == 0 {
			t.Errorf("got TimedOut %v, exit %d; want true, non-zero", out.TimedOut, out.ExitCode)
		}
		s.noProcessesLeft(t, id)
		if got := s.shOK(t, id, "echo ok"); got != "ok\n" {
			t.Errorf("exec after a timeout: got %q, want %q", got, "ok\n")
		}
	})

	t.Run("Cancel", func(t *testing.T) {
		t.Parallel()
		id := s.running(t)
		c, cancel := context.WithCancel(ctx(t))
		time.AfterFunc(time.Second, cancel)
		start := time.Now()
		_, err := exec(c, s.b, id, backend.ExecRequest{Argv: []string{"sh", "-c", tree}})
		if d := time.Since(start); d > killWithin {
			t.Errorf("exec cancelled after 1s took %v, want < %v", d, killWithin)
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled exec: got error %v, want context.Canceled", err)
		}
		s.noProcessesLeft(t, id)
		if got := s.shOK(t, id, "echo ok"); got != "ok\n" {
			t.Errorf("exec after a cancelled one: got %q, want %q", got, "ok\n")
		}
	})

	for _, how := range []string{"Stop", "Destroy"} {
		t.Run(how+"KillsExec", func(t *testing.T) {
			t.Parallel()
			c := ctx(t)
			id := s.running(t)
			done := make(chan struct{})
			go func() {
				defer close(done)
				exec(c, s.b, id, backend.ExecRequest{Argv: []string{"sh", "-c", tree}})
			}()
			if s.h.Processes != nil {
				eventually(killWithin, func() bool { return s.h.Processes(t, s.b, id) >= 2 })
			} else {
				time.Sleep(time.Second)
			}
			var err error
			if how == "Stop" {
				err = s.b.Stop(c, id, time.Second)
			} else {
				err = s.b.Destroy(c, id)
			}
			if err != nil {
				t.Fatalf("%s: %v", how, err)
			}
			select {
			case <-done:
			case <-time.After(killWithin):
				t.Fatalf("exec still running %v after %s", killWithin, how)
			}
			if how == "Stop" {
				s.noProcessesLeft(t, id)
			}
		})
	}
}
