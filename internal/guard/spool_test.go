package guard

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestSpoolJSON checks that WriteExecResult gives exactly json.Marshal's
// bytes for output written in random pieces, in memory and spilled.
func TestSpoolJSON(t *testing.T) {
	text := strings.Repeat("héllo <wörld> & \"q\" \\ \t\n\r\x01\x1f\x7f \u2028 \u2029 日本語 🙂\b\f", 300)
	binary := text[:1000] + "\xff\xfe" + text[1000:]
	for _, tc := range []struct {
		name     string
		out, err string
		mem      int64
	}{
		{"empty", "", "", 1 << 20},
		{"text in memory", text, "ok", 1 << 20},
		{"text spilled", text, text, 100},
		{"binary spilled", binary, "x", 10},
		{"binary in memory", "a", binary, 1 << 20},
		{"cut rune at the end", text + "\xe6\x97", "", 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			so, se := NewSpool(dir, tc.mem), NewSpool(dir, tc.mem)
			defer so.Close()
			defer se.Close()
			r := rand.New(rand.NewPCG(1, 2))
			for _, w := range []struct {
				s   *Spool
				src string
			}{{so, tc.out}, {se, tc.err}} {
				for rest := w.src; rest != ""; {
					n := min(len(rest), 1+r.IntN(7))
					w.s.Write([]byte(rest[:n]))
					rest = rest[n:]
				}
			}
			if got, want := so.OnDisk(), int64(len(tc.out)) > tc.mem; got != want {
				t.Errorf("stdout on disk = %v, want %v", got, want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("spool left %d files in its dir, want none (unlinked)", len(ents))
			}
			res := api.ExecResult{ExitCode: 3, Signal: "SIGKILL", StdoutBytes: 9, DurationMs: 5}
			var got bytes.Buffer
			if err := WriteExecResult(&got, res, so, se); err != nil {
				t.Fatal(err)
			}
			want := res
			want.Stdout, want.StdoutEncoding = api.EncodeBytes([]byte(tc.out))
			want.Stderr, want.StderrEncoding = api.EncodeBytes([]byte(tc.err))
			wb, _ := json.Marshal(want)
			if !bytes.Equal(got.Bytes(), append(wb, '\n')) {
				t.Fatalf("got %.300q\nwant %.300q", got.String(), wb)
			}
		})
	}
}

// FuzzSpoolJSON: whatever a sandbox writes, in whatever pieces, the
// streamed answer is byte for byte what json.Marshal gives.
func FuzzSpoolJSON(f *testing.F) {
	f.Add([]byte("hello\n"), uint8(3), int64(4))
	f.Add([]byte("\xe6\x97\xa5\xe6\x9c\xac \u2028<&>\"\\\x00"), uint8(1), int64(2))
	f.Add([]byte("\xff\xfe\xfd"), uint8(2), int64(0))
	f.Fuzz(func(t *testing.T, data []byte, piece uint8, mem int64) {
		s := NewSpool(t.TempDir(), mem%64)
		defer s.Close()
		step := int(piece%16) + 1
		for rest := data; len(rest) > 0; {
			n := min(len(rest), step)
			s.Write(rest[:n])
			rest = rest[n:]
		}
		empty := NewSpool("", 0)
		var got bytes.Buffer
		if err := WriteExecResult(&got, api.ExecResult{}, s, empty); err != nil {
			t.Fatal(err)
		}
		want := api.ExecResult{}
		want.Stdout, want.StdoutEncoding = api.EncodeBytes(data)
		wb, _ := json.Marshal(want)
		if !bytes.Equal(got.Bytes(), append(wb, '\n')) {
			t.Fatalf("got %q\nwant %q", got.Bytes(), wb)
		}
	})
}
