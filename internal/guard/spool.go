package guard

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"unicode/utf8"

	"github.com/warrenhq/warren/api"
)

// SpoolMemory is how much of one output stream a Spool keeps in memory
// before it moves to disk: the default max_output, so that a default exec
// never touches the disk.
const SpoolMemory = DefaultOutputLimit

// Spool keeps what is written to it, in memory up to a threshold and past
// it in a temporary file, unlinked as soon as it is made so that nothing
// outlives the Spool, not even a crash. It tracks whether what it holds is
// valid UTF-8 as it goes, so its JSON form (WriteJSONString) can be
// written in one pass without reading it twice. Buffered exec output goes
// through one, so a 128 MiB answer costs the agent disk, not memory.
//
// Its methods may be called from several goroutines.
type Spool struct {
	dir string
	mem int64

	mu   sync.Mutex
	buf  bytes.Buffer
	f    *os.File
	n    int64
	text utf8Check
	err  error
}

// NewSpool returns a Spool that keeps up to mem bytes in memory and the
// rest in a file in dir ("" for os.TempDir()).
func NewSpool(dir string, mem int64) *Spool {
	if dir == "" {
		dir = os.TempDir()
	}
	return &Spool{dir: dir, mem: max(mem, 0), text: utf8Check{ok: true}}
}

// Write keeps p. A failure to spill to disk is kept for Err, and what
// follows is dropped; Write never fails, so the writer is never blocked.
func (s *Spool) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return len(p), nil
	}
	s.text.write(p)
	if s.f == nil && int64(s.buf.Len()+len(p)) > s.mem {
		if s.err = s.spill(); s.err != nil {
			return len(p), nil
		}
	}
	if s.f != nil {
		if _, err := s.f.Write(p); err != nil {
			s.err = fmt.Errorf("spool exec output: %w", err)
			return len(p), nil
		}
	} else {
		s.buf.Write(p)
	}
	s.n += int64(len(p))
	return len(p), nil
}

// spill moves what is in memory to a new unlinked file.
func (s *Spool) spill() error {
	f, err := os.CreateTemp(s.dir, spoolPattern)
	if err != nil {
		return fmt.Errorf("spool exec output: %w", err)
	}
	os.Remove(f.Name()) // open, it lives on until Close
	if _, err := f.Write(s.buf.Bytes()); err != nil {
		f.Close()
		return fmt.Errorf("spool exec output: %w", err)
	}
	s.f, s.buf = f, bytes.Buffer{}
	return nil
}

// spoolPattern names spool files (os.CreateTemp).
const spoolPattern = "exec-*.out"

// SweepSpool removes spool files from dir: a Spool unlinks its file as
// soon as it makes it, so any found at a start were left by a crash in
// between. Call it only on a dir no running process spools to.
func SweepSpool(dir string) {
	old, _ := filepath.Glob(filepath.Join(dir, spoolPattern))
	for _, f := range old {
		os.Remove(f)
	}
}

// Len is the number of bytes kept.
func (s *Spool) Len() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// OnDisk reports whether the Spool moved to a file.
func (s *Spool) OnDisk() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f != nil
}

// Err is the error that made the Spool drop output, or nil.
func (s *Spool) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Encoding is how WriteJSONString renders the content: api.EncodingUTF8
// when it is valid UTF-8, else api.EncodingBase64 (as api.EncodeBytes).
func (s *Spool) Encoding() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.text.valid() {
		return api.EncodingUTF8
	}
	return api.EncodingBase64
}

// WriteJSONString writes the content as one JSON string in Encoding's
// form, streaming it from memory or disk. Call it after the last Write.
func (s *Spool) WriteJSONString(w io.Writer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var src io.Reader = bytes.NewReader(s.buf.Bytes())
	if s.f != nil {
		src = io.NewSectionReader(s.f, 0, s.n)
	}
	if _, err := io.WriteString(w, `"`); err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	if s.text.valid() {
		jw := &jsonStringWriter{w: w}
		if _, err := io.CopyBuffer(jw, src, buf); err != nil {
			return err
		}
	} else {
		enc := base64.NewEncoder(base64.StdEncoding, w)
		if _, err := io.CopyBuffer(enc, src, buf); err != nil {
			return err
		}
		if err := enc.Close(); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, `"`)
	return err
}

// Close drops the content and its file.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = bytes.Buffer{}
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

// utf8Check tells whether a byte stream written in pieces is valid UTF-8,
// holding back a rune cut between two writes.
type utf8Check struct {
	ok   bool
	pend []byte // the start of a rune the next write completes
}

func (v *utf8Check) write(p []byte) {
	if !v.ok {
		return
	}
	if len(v.pend) > 0 {
		take := min(len(p), utf8.UTFMax-len(v.pend))
		r := append(v.pend, p[:take]...)
		if !utf8.FullRune(r) {
			v.pend = r // p was too short to finish it
			return
		}
		c, size := utf8.DecodeRune(r)
		if c == utf8.RuneError && size <= 1 {
			v.ok = false
			return
		}
		p = p[size-len(v.pend):]
		v.pend = v.pend[:0]
	}
	cut := len(p)
	for j := len(p) - 1; j >= 0 && j >= len(p)-(utf8.UTFMax-1); j-- {
		if utf8.RuneStart(p[j]) {
			if !utf8.FullRune(p[j:]) {
				cut = j
			}
			break
		}
	}
	if !utf8.Valid(p[:cut]) {
		v.ok = false
		return
	}
	v.pend = append(v.pend[:0], p[cut:]...)
}

func (v *utf8Check) valid() bool { return v.ok && len(v.pend) == 0 }

// jsonStringWriter writes valid UTF-8 as the inside of a JSON string,
// escaped as encoding/json does (HTML characters and U+2028/U+2029
// included). An escape never spans writes: it acts on ASCII bytes, and
// U+2028/U+2029 are matched on the rune, held back when a write cuts it.
type jsonStringWriter struct {
	w    io.Writer
	pend []byte
	out  []byte
}

func (j *jsonStringWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(j.pend) > 0 {
		p = append(j.pend, p...)
		j.pend = nil
	}
	out := j.out[:0]
	start := 0
	for i := 0; i < len(p); {
		b := p[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			out = append(out, p[start:i]...)
			switch b {
			case '"', '\\':
				out = append(out, '\\', b)
			case '\n':
				out = append(out, '\\', 'n')
			case '\r':
				out = append(out, '\\', 'r')
			case '\t':
				out = append(out, '\\', 't')
			case '\b':
				out = append(out, '\\', 'b')
			case '\f':
				out = append(out, '\\', 'f')
			default:
				out = append(out, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		if !utf8.FullRune(p[i:]) {
			out = append(out, p[start:i]...)
			j.pend = append([]byte(nil), p[i:]...)
			start = len(p)
			break
		}
		c, size := utf8.DecodeRune(p[i:])
		if c == '\u2028' || c == '\u2029' {
			out = append(out, p[start:i]...)
			out = append(out, '\\', 'u', '2', '0', '2', hex[c&0xf])
			start = i + size
		}
		i += size
	}
	out = append(out, p[start:]...)
	j.out = out
	if _, err := j.w.Write(out); err != nil {
		return 0, err
	}
	return n, nil
}

const hex = "0123456789abcdef"

// WriteExecResult writes res as the JSON of an api.ExecResult, its Stdout
// and Stderr streamed from the two spools (and their encodings set from
// them): the same bytes json.Marshal would give, without holding them.
func WriteExecResult(w io.Writer, res api.ExecResult, stdout, stderr *Spool) error {
	res.Stdout, res.Stderr = "", ""
	res.StdoutEncoding, res.StderrEncoding = stdout.Encoding(), stderr.Encoding()
	head, err := json.Marshal(res)
	if err != nil {
		return err
	}
	rest := head
	for _, f := range []struct {
		key   []byte
		spool *Spool
	}{
		{[]byte(`"stdout":""`), stdout},
		{[]byte(`"stderr":""`), stderr},
	} {
		// An empty string value is `""` in the marshalled form and a key
		// never appears escaped-free inside a value, so this finds the
		// field itself.
		i := bytes.Index(rest, f.key)
		if i < 0 {
			return errors.New("guard: exec result without its output field")
		}
		k := i + len(f.key) - 2 // the value's opening quote
		if _, err := w.Write(rest[:k]); err != nil {
			return err
		}
		if err := f.spool.WriteJSONString(w); err != nil {
			return err
		}
		rest = rest[k+2:]
	}
	_, err = w.Write(append(rest, '\n'))
	return err
}

// ServeExec answers a buffered exec: it runs exec with a Spool for stdout
// and one for stderr (files in dir past SpoolMemory each), then writes the
// api.ExecResult JSON to w streamed from them. An error before the answer
// starts (the exec's, or a spool's) is returned for the caller to render;
// one while writing can only cut the answer short: the handler is aborted
// (http.ErrAbortHandler), so the client sees a truncated body, never a
// complete-looking one.
func ServeExec(w http.ResponseWriter, dir string, exec func(stdout, stderr io.Writer) (api.ExecResult, error)) error {
	stdout, stderr := NewSpool(dir, SpoolMemory), NewSpool(dir, SpoolMemory)
	defer stdout.Close()
	defer stderr.Close()
	res, err := exec(stdout, stderr)
	if err == nil {
		err = errors.Join(stdout.Err(), stderr.Err())
	}
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if err := WriteExecResult(w, res, stdout, stderr); err != nil {
		panic(http.ErrAbortHandler) // the status is out: only cutting the body short tells the client
	}
	return nil
}
