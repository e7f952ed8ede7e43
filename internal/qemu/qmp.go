package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"net"
	"sync"
	"time"
)

// QMP is a client of a running QEMU's machine protocol (Machine.QMP),
// one command at a time. Asynchronous events that arrive meanwhile are
// kept (the last 64) for Events.
type QMP struct {
	conn   net.Conn
	r      *bufio.Reader
	mu     sync.Mutex
	events []QMPEvent

	screenMu sync.Mutex
	screen   image.Point // the display's size at the last Screendump
}

// QMPEvent is an asynchronous message such as SHUTDOWN or STOP.
type QMPEvent struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data,omitempty"`
}

// QMPError is an error QEMU answered a command with.
type QMPError struct {
	Command, Class, Desc string
}

func (e *QMPError) Error() string { return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc) }

// DialQMP connects to the QMP socket at path, retrying until QEMU has
// made it or ctx ends, and negotiates capabilities.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var d net.Dialer
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			q, err := newQMP(ctx, conn)
			if err != nil {
				conn.Close()
			}
			return q, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp %s: %w (last: %v)", path, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

func newQMP(ctx context.Context, conn net.Conn) (*QMP, error) {
	q := &QMP{conn: conn, r: bufio.NewReader(conn)}
	stop := q.deadline(ctx)
	defer stop()
	var greeting struct {
		QMP *json.RawMessage `json:"QMP"`
	}
	line, err := q.r.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	if json.Unmarshal(line, &greeting) != nil || greeting.QMP == nil {
		return nil, fmt.Errorf("qmp greeting: unexpected %q", line)
	}
	if err := q.execute("qmp_capabilities", nil, nil); err != nil {
		return nil, err
	}
	return q, nil
}

// deadline makes ctx's end interrupt reads and writes.
func (q *QMP) deadline(ctx context.Context) func() {
	if d, ok := ctx.Deadline(); ok {
		q.conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { q.conn.SetDeadline(time.Unix(1, 0)) })
	return func() {
		stop()
		q.conn.SetDeadline(time.Time{})
	}
}

// Execute runs command with args (nil for none) and decodes its return
// value into result (nil to ignore it). A refusal is a *QMPError.
func (q *QMP) Execute(ctx context.Context, command string, args, result any) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	stop := q.deadline(ctx)
	defer stop()
	return q.execute(command, args, result)
}

func (q *QMP) execute(command string, args, result any) error {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return fmt.Errorf("qmp %s: %w", command, err)
		}
		var msg struct {
			Return *json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			QMPEvent
		}
		if err := json.Unmarshal(line, &msg); err != nil {
			return fmt.Errorf("qmp %s: bad message %q: %w", command, line, err)
		}
		switch {
		case msg.Error != nil:
			return &QMPError{Command: command, Class: msg.Error.Class, Desc: msg.Error.Desc}
		case msg.Return != nil:
			if result == nil {
				return nil
			}
			if err := json.Unmarshal(*msg.Return, result); err != nil {
				return fmt.Errorf("qmp %s: %w", command, err)
			}
			return nil
		case msg.Event != "":
			q.events = append(q.events, msg.QMPEvent)
			if len(q.events) > 64 {
				q.events = q.events[1:]
			}
		default:
			return fmt.Errorf("qmp %s: unexpected message %q", command, line)
		}
	}
}

// Events returns and forgets the events received so far.
func (q *QMP) Events() []QMPEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	ev := q.events
	q.events = nil
	return ev
}

// Status is the run state QEMU reports ("running", "paused", ...).
func (q *QMP) Status(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := q.Execute(ctx, "query-status", nil, &st)
	return st.Status, err
}

// Quit ends QEMU at once (the guest does not shut down). QEMU may close
// the connection before it answers; that is success.
func (q *QMP) Quit(ctx context.Context) error {
	err := q.Execute(ctx, "quit", nil, nil)
	var qe *QMPError
	if err != nil && !errors.As(err, &qe) {
		return nil
	}
	return err
}

// Close closes the connection.
func (q *QMP) Close() error { return q.conn.Close() }
