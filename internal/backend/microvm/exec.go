package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"syscall"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/guest/proto"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
)

// running returns s if its machine runs; ErrConflict otherwise.
func (m *MicroVM) running(id, verb string) (*sandbox, error) {
	s, err := m.get(id)
	if err == nil && m.kind == KindVM && verb == "snapshot" {
		return nil, errdefs.New(errdefs.ErrInvalid, api.CodeNotSupported, "%s of %s: a vm's disk is not layers (snapshots are microVMs' and containers')", verb, id)
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil || !p.running() {
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_not_running", "%s in %s: sandbox is not running", verb, id)
	}
	return s, nil
}

// withAgent returns s if its machine runs and has a guest agent: every
// microVM has; a vm has when its disk image carries one (vmAgent).
func (m *MicroVM) withAgent(ctx context.Context, id, verb string) (*sandbox, error) {
	s, err := m.running(id, verb)
	if err != nil || m.kind != KindVM {
		return s, err
	}
	return s, m.vmAgent(ctx, s, verb)
}

// Exec implements backend.Execer: the guest agent runs the command in the
// sandbox's namespaces; its output streams back as frames.
func (m *MicroVM) Exec(ctx context.Context, id string, req backend.ExecRequest) (backend.ExecResult, error) {
	var res backend.ExecResult
	if req.Shell == "" && (len(req.Argv) == 0 || req.Argv[0] == "") {
		return res, errdefs.Invalid("exec in %s: empty argv", id)
	}
	s, err := m.withAgent(ctx, id, "exec")
	if err != nil {
		return res, err
	}
	head, err := json.Marshal(proto.ExecRequest{Argv: req.Argv, Shell: req.Shell, Env: req.Env, Cwd: req.Cwd,
		User: req.User, Timeout: req.Timeout, Stdin: req.Stdin != nil})
	if err != nil {
		return res, err
	}
	pr, pw := io.Pipe()
	go func() {
		if _, err := pw.Write(append(head, '\n')); err != nil {
			return
		}
		if req.Stdin != nil {
			io.Copy(pw, req.Stdin)
		}
		pw.Close()
	}()
	defer pr.Close()
	resp, err := s.guest.do(ctx, "POST", "/v1/exec", nil, pr)
	if err != nil {
		return res, fmt.Errorf("exec in %s: %w", id, err)
	}
	defer resp.Body.Close()
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		kind, p, err := proto.ReadFrame(r)
		if err != nil {
			if ctx.Err() != nil {
				return res, fmt.Errorf("exec in %s: %w", id, ctx.Err())
			}
			return res, fmt.Errorf("exec in %s: the guest agent's answer broke off: %w", id, err)
		}
		switch kind {
		case proto.FrameStdout:
			if req.Stdout != nil {
				req.Stdout.Write(p)
			}
		case proto.FrameStderr:
			if req.Stderr != nil {
				req.Stderr.Write(p)
			}
		case proto.FrameResult:
			var out proto.ExecResult
			if err := json.Unmarshal(p, &out); err != nil {
				return res, fmt.Errorf("exec in %s: %w", id, err)
			}
			if out.Error != nil {
				err := protoError(out.Error)
				if ctx.Err() != nil {
					err = fmt.Errorf("%w (%v)", ctx.Err(), err)
				}
				return out.ExecResult, fmt.Errorf("exec in %s: %w", id, err)
			}
			return out.ExecResult, nil
		}
	}
}

// Stats implements backend.Statser, as the guest's cgroup counts.
func (m *MicroVM) Stats(ctx context.Context, id string) (backend.Stats, error) {
	var st backend.Stats
	s, err := m.withAgent(ctx, id, "stats")
	if err != nil {
		return st, err
	}
	err = s.guest.call(ctx, "GET", "/v1/stats", nil, nil, &st)
	return st, err
}

// DialPort implements backend.PortDialer: a stream through the guest
// agent to 127.0.0.1:port inside the guest.
func (m *MicroVM) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Invalid("port %d", port)
	}
	s, err := m.withAgent(ctx, id, "dial")
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	// The stream outlives ctx, which bounds only the dial.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	resp, err := s.guest.do(sctx, "POST", "/v1/port", url.Values{"port": {strconv.Itoa(port)}}, pr)
	stop()
	if err != nil {
		cancel()
		pw.Close()
		return nil, fmt.Errorf("dial %s:%d: %w", id, port, err)
	}
	return newStreamConn(resp.Body, pw, cancel), nil
}

// isRefused says whether the guest found nothing accepting on the port.
func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// newStreamConn is a net.Conn (with deadlines: net.Pipe's) over a port
// stream: what is written goes to w, what the guest sends comes from r;
// closing it ends the stream.
func newStreamConn(r io.ReadCloser, w io.WriteCloser, cancel func()) net.Conn {
	mine, theirs := net.Pipe()
	go func() {
		io.Copy(theirs, r)
		theirs.Close()
	}()
	go func() {
		io.Copy(w, theirs)
		w.Close()
		r.Close()
		cancel()
	}()
	return mine
}
