package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// TestQMPDisplay checks what the display calls send, against a fake
// QEMU whose screen is 4x2 pixels.
func TestQMPDisplay(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	var mu sync.Mutex
	var sent []string // "command arguments"
	refuse := false
	fakeQMP(t, sock, func(cmd string, args json.RawMessage) []string {
		if cmd == "qmp_capabilities" {
			return []string{`{"return": {}}`}
		}
		mu.Lock()
		sent = append(sent, cmd+" "+string(args))
		no := refuse
		mu.Unlock()
		switch {
		case no:
			return []string{`{"error": {"class": "GenericError", "desc": "There is no QemuConsole I can screendump from."}}`}
		case cmd == "screendump":
			var a struct{ Filename string }
			json.Unmarshal(args, &a)
			ppm := "P6\n4 2\n255\n" + strings.Repeat("\x00\x00\x00", 5) + "\xff\xff\xff" + strings.Repeat("\x00\x00\x00", 2)
			if err := os.WriteFile(a.Filename, []byte(ppm), 0o644); err != nil {
				return []string{`{"error": {"class": "GenericError", "desc": "` + err.Error() + `"}}`}
			}
			return []string{`{"return": {}}`}
		case cmd == "send-key" || cmd == "input-send-event":
			return []string{`{"return": {}}`}
		}
		return []string{`{"error": {"class": "CommandNotFound", "desc": "no"}}`}
	})
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		s := sent
		sent = nil
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := DialQMP(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	check := func(what string, want ...string) {
		t.Helper()
		got := take()
		if len(got) != len(want) {
			t.Fatalf("%s sent %d commands, want %d:\n got %q\nwant %q", what, len(got), len(want), got, want)
		}
		for i := range want {
			// A screendump's file name is the client's to choose.
			if ok := got[i] == want[i] || strings.HasPrefix(want[i], "screendump") && strings.HasPrefix(got[i], want[i]); !ok {
				t.Errorf("%s: command %d:\n got %s\nwant %s", what, i, got[i], want[i])
			}
		}
	}
	abs := func(x, y int) string {
		return fmt.Sprintf(`{"data":{"axis":"x","value":%d},"type":"abs"},{"data":{"axis":"y","value":%d},"type":"abs"}`, x, y)
	}

	// The first pointer call learns the screen's size from a screendump.
	if err := q.PointerMove(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	check("PointerMove", "screendump", `input-send-event {"events":[`+abs(3*0x7fff/8, 3*0x7fff/4)+`]}`)
	img, err := q.Screendump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 4 || b.Dy() != 2 {
		t.Fatalf("screen %v, want 4x2", b)
	}
	if r, g, b, _ := img.At(1, 1).RGBA(); r != 0xffff || g != 0xffff || b != 0xffff {
		t.Errorf("pixel (1,1) is %v, want white", img.At(1, 1))
	}
	if r, _, _, _ := img.At(0, 1).RGBA(); r != 0 {
		t.Errorf("pixel (0,1) is %v, want black", img.At(0, 1))
	}
	check("Screendump", `screendump {"filename":"`)
	if err := q.Click(ctx, 3, 0, "right"); err != nil {
		t.Fatal(err)
	}
	check("Click", `input-send-event {"events":[`+abs(7*0x7fff/8, 0x7fff/4)+`,{"data":{"button":"right","down":true},"type":"btn"}]}`,
		`input-send-event {"events":[{"data":{"button":"right","down":false},"type":"btn"}]}`)
	if err := q.Click(ctx, 0, 0, ""); err != nil {
		t.Fatal(err)
	}
	check("Click (left by default)", `input-send-event {"events":[`+abs(0x7fff/8, 0x7fff/4)+`,{"data":{"button":"left","down":true},"type":"btn"}]}`,
		`input-send-event {"events":[{"data":{"button":"left","down":false},"type":"btn"}]}`)

	start := time.Now()
	if err := q.SendKeys(ctx, "ctrl-alt-f2", "Return"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 6*keyDelay {
		t.Errorf("two combinations took %v, want them paced at least %v apart", d, 6*keyDelay)
	}
	check("SendKeys", `send-key {"keys":[{"data":"ctrl","type":"qcode"},{"data":"alt","type":"qcode"},{"data":"f2","type":"qcode"}]}`,
		`send-key {"keys":[{"data":"ret","type":"qcode"}]}`)
	if err := q.TypeText(ctx, "Hi\n"); err != nil {
		t.Fatal(err)
	}
	check("TypeText", `send-key {"keys":[{"data":"shift","type":"qcode"},{"data":"h","type":"qcode"}]}`,
		`send-key {"keys":[{"data":"i","type":"qcode"}]}`, `send-key {"keys":[{"data":"ret","type":"qcode"}]}`)

	// Bad input sends nothing.
	for what, err := range map[string]error{
		"unknown key":      q.SendKeys(ctx, "a", "hyper-x"),
		"non-ASCII text":   q.TypeText(ctx, "ok ✓"),
		"unknown button":   q.Click(ctx, 0, 0, "fourth"),
		"off the screen":   q.PointerMove(ctx, 4, 0),
		"negative point":   q.Click(ctx, 0, -1, "left"),
		"below the screen": q.PointerMove(ctx, 0, 2),
	} {
		if !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: got %v, want ErrBadInput", what, err)
		}
	}
	check("bad input")

	// A machine with no display.
	mu.Lock()
	refuse = true
	mu.Unlock()
	_, err = q.Screendump(ctx)
	var qe *QMPError
	if !errors.As(err, &qe) || !strings.Contains(qe.Desc, "screendump") {
		t.Errorf("screendump with no display: %v, want a QMPError", err)
	}
}
