package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeQMP serves the QMP socket at path: a greeting, then the answer
// reply(command) gives to each command, in order.
func fakeQMP(t *testing.T, path string, reply func(cmd string, args json.RawMessage) []string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		conn.Write([]byte(`{"QMP": {"version": {"qemu": {"major": 7, "minor": 2}}, "capabilities": []}}` + "\n"))
		r := bufio.NewReader(conn)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			var req struct {
				Execute   string          `json:"execute"`
				Arguments json.RawMessage `json:"arguments"`
			}
			if json.Unmarshal(line, &req) != nil {
				conn.Write([]byte(`{"error": {"class": "GenericError", "desc": "JSON parse error"}}` + "\n"))
				continue
			}
			for _, m := range reply(req.Execute, req.Arguments) {
				conn.Write([]byte(m + "\n"))
			}
		}
	}()
}

func TestQMP(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	var gotArgs string
	fakeQMP(t, sock, func(cmd string, args json.RawMessage) []string {
		switch cmd {
		case "qmp_capabilities":
			return []string{`{"return": {}}`}
		case "query-status":
			return []string{`{"event": "STOP", "timestamp": {"seconds": 1}}`, `{"return": {"status": "paused", "running": false}}`}
		case "human-monitor-command":
			gotArgs = string(args)
			return []string{`{"return": "ok\r\n"}`}
		default:
			return []string{`{"error": {"class": "CommandNotFound", "desc": "The command ` + cmd + ` has not been found"}}`}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := DialQMP(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if st, err := q.Status(ctx); err != nil || st != "paused" {
		t.Fatalf("status %q, %v; want paused", st, err)
	}
	if ev := q.Events(); len(ev) != 1 || ev[0].Event != "STOP" {
		t.Errorf("events %+v, want one STOP", ev)
	}
	var out string
	if err := q.Execute(ctx, "human-monitor-command", map[string]string{"command-line": "info version"}, &out); err != nil || out != "ok\r\n" {
		t.Fatalf("hmp: %q, %v", out, err)
	}
	if gotArgs != `{"command-line":"info version"}` {
		t.Errorf("server got arguments %s", gotArgs)
	}
	err = q.Execute(ctx, "no-such", nil, nil)
	var qe *QMPError
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" || !strings.Contains(err.Error(), "no-such") {
		t.Fatalf("unknown command: %v, want a QMPError CommandNotFound", err)
	}
}

func TestQMPDialTimesOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := DialQMP(ctx, filepath.Join(t.TempDir(), "absent.sock"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want a deadline error", err)
	}
}

func TestQMPNotQMP(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "x.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("SSH-2.0-OpenSSH\n"))
			time.Sleep(time.Second)
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := DialQMP(ctx, sock); err == nil || !strings.Contains(err.Error(), "greeting") {
		t.Fatalf("got %v, want a greeting error", err)
	}
}
