package proto

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// pair runs both sides of a handshake over a connected pair; guestIn
// lets a test put bytes before what the guest reads.
func pair(t *testing.T, hostSecret, guestSecret string, noise string, skipFirst bool) (hostErr, guestErr error) {
	return pairVersion(t, hostSecret, guestSecret, noise, skipFirst, Version)
}

// pairVersion is pair with a guest that says version.
func pairVersion(t *testing.T, hostSecret, guestSecret string, noise string, skipFirst bool, version int) (hostErr, guestErr error) {
	t.Helper()
	h, g := net.Pipe()
	defer h.Close()
	defer g.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		r := bufio.NewReader(g)
		if noise != "" {
			r = bufio.NewReader(io.MultiReader(stringsReader(noise), g))
		}
		if skipFirst { // a guest busy elsewhere misses the first hello
			r.ReadString('\n')
			r.ReadString('\n')
		}
		done <- guestHandshake(r, g, guestSecret, version)
	}()
	hostErr = HostHandshake(ctx, h, bufio.NewReader(h), hostSecret)
	h.Close()
	return hostErr, <-done
}

type sr struct{ s string }

func (r *sr) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	n := copy(p, r.s)
	r.s = r.s[n:]
	return n, nil
}

func stringsReader(s string) io.Reader { return &sr{s} }

func TestHandshake(t *testing.T) {
	secret := NewSecret()
	if h, g := pair(t, secret, secret, "", false); h != nil || g != nil {
		t.Fatalf("same secret: host %v, guest %v", h, g)
	}
	// Bytes of an earlier session, before the hello on the same line.
	if h, g := pair(t, secret, secret, "\x00\x00\x12\x04garbage", false); h != nil || g != nil {
		t.Fatalf("with noise: host %v, guest %v", h, g)
	}
	// The first hello lost: the host says it again.
	if h, g := pair(t, secret, secret, "", true); h != nil || g != nil {
		t.Fatalf("first hello missed: host %v, guest %v", h, g)
	}
	// A guest of another build is refused, saying so.
	if h, _ := pairVersion(t, secret, secret, "", false, Version-1); !errors.Is(h, ErrVersion) {
		t.Errorf("guest of version %d: host got %v, want ErrVersion", Version-1, h)
	}
	// A guest that does not know the secret is refused by the host.
	if h, _ := pair(t, secret, NewSecret(), "", false); !errors.Is(h, ErrHandshake) {
		t.Errorf("guest with another secret: host got %v, want ErrHandshake", h)
	}
}

func TestFrames(t *testing.T) {
	pr, pw := io.Pipe()
	go func() {
		WriteFrame(pw, FrameStdout, []byte("out"))
		WriteFrame(pw, FrameResult, []byte("{}"))
		pw.Close()
	}()
	for _, want := range []struct {
		k byte
		p string
	}{{FrameStdout, "out"}, {FrameResult, "{}"}} {
		k, p, err := ReadFrame(pr)
		if err != nil || k != want.k || string(p) != want.p {
			t.Fatalf("ReadFrame = %c %q %v, want %c %q", k, p, err, want.k, want.p)
		}
	}
	if _, _, err := ReadFrame(pr); err != io.EOF {
		t.Errorf("at the end: %v, want EOF", err)
	}
}
