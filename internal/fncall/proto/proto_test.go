package proto

import (
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// A frame cut by a deadline is not lost: the next Next finishes it, and
// frames that arrive together come out one by one.
func TestReaderAcrossDeadlines(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	var e Encoder
	kill := KillFrame("cpu")
	big, err := e.Frame(TypeError).Bytes(make([]byte, 10000)).Done()
	if err != nil {
		t.Fatal(err)
	}
	big = append([]byte(nil), big...)
	fr := NewReader(r)

	w.Write(kill[:3]) // not even a whole header
	r.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, _, err := fr.Next(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("cut frame: %v, want a deadline error", err)
	}
	w.Write(append(kill[3:], big[:5000]...))
	r.SetReadDeadline(time.Now().Add(time.Second))
	typ, body, err := fr.Next()
	if err != nil || typ != TypeKill || NewDecoder(body).Str() != "cpu" {
		t.Fatalf("first frame: %c %q %v", typ, body, err)
	}
	r.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, _, err := fr.Next(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("half a big frame: %v, want a deadline error", err)
	}
	w.Write(append(big[5000:], kill...))
	r.SetReadDeadline(time.Now().Add(time.Second))
	typ, body, err = fr.Next()
	if err != nil || typ != TypeError || len(NewDecoder(body).Bytes()) != 10000 {
		t.Fatalf("big frame: %c, %d bytes, %v", typ, len(body), err)
	}
	if typ, _, err := fr.Next(); err != nil || typ != TypeKill {
		t.Fatalf("last frame: %c %v", typ, err)
	}
	w.Close()
	if _, _, err := fr.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the end: %v, want EOF", err)
	}
}

func TestReaderBadLength(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w.Write([]byte{0, 0, 0, 0, 'x'})
	w.Close()
	if _, _, err := NewReader(r).Next(); err == nil {
		t.Fatal("a zero-length frame was accepted")
	}
}
