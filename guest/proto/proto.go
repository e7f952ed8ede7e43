// Package proto is the protocol between a microVM sandbox's guest agent
// (guest/agent, pid 1 of the guest) and the node's microvm backend, over
// one virtio-serial port: nothing in the guest listens on a network socket.
//
// A session starts with a mutual challenge (Handshake): each side proves
// it knows the sandbox's secret, which the host hands the guest through
// QEMU's fw_cfg (never the kernel command line, which the workload can
// read), by an HMAC of the other side's fresh nonce. Then the port carries
// HTTP/2 (h2c), the host the client: requests multiplex, bodies stream
// both ways with HTTP/2's own flow control. When the host goes away (the
// agent restarts, the sandbox is paused), the guest waits for the next
// session; a new one starts with a new handshake. A guest restored from
// a saved state is still in the session it was saved in: the host's
// hello (a newline first, read as an HTTP/2 frame header, announces a
// frame over HTTP/2's default limit) ends it at once.
//
// Endpoints (all under /v1, JSON unless said otherwise):
//
//	GET  /v1/status                 Status
//	POST /v1/start                  StartRequest -> Status (idempotent)
//	POST /v1/exec                   ExecRequest line, then stdin -> frames (Frame*)
//	GET  /v1/stat?path=P            backend.FileInfo
//	GET  /v1/file?path=P            the file's bytes
//	PUT  /v1/file?path=P&mode=M     body: the file's bytes
//	GET  /v1/tar?path=P             a tar stream
//	PUT  /v1/tar?dir=D              body: a tar stream
//	GET  /v1/stats                  backend.Stats
//	POST /v1/port?port=N            full duplex: bytes to and from 127.0.0.1:N
//	POST /v1/sync?freeze=1|0        sync the writable disk, freeze or thaw it
//	POST /v1/shutdown?grace=D       stop every process, sync, power off
//
// Errors are an Error body with the HTTP status of its kind.
package proto

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/internal/backend"
)

// PortName is the virtio-serial port's name (/sys/class/virtio-ports/*/name).
const PortName = "warren.dev.agent"

// ConfigName is the fw_cfg entry holding the guest's Config as JSON.
const ConfigName = "opt/warren.dev/config"

// Config is what the host tells the guest before it boots.
type Config struct {
	Secret string `json:"secret"` // hex; authenticates both ends of every session
	// Layers are the virtio-blk serials of the read-only layers, bottom
	// first; Upper is the writable disk's (ext4, made by the host).
	Layers []string `json:"layers"`
	Upper  string   `json:"upper"`
	// DAX layers are on virtio-pmem instead, in the same order, their
	// EROFS mounted with dax (the host's page cache, shared).
	DAX bool `json:"dax,omitempty"`
}

// StartRequest makes the guest start the sandbox's processes.
type StartRequest struct {
	Hostname string   `json:"hostname"`
	Env      []string `json:"env,omitempty"`
	Workdir  string   `json:"workdir,omitempty"`
	Memory   int64    `json:"memory,omitempty"` // bytes for the sandbox's processes; 0: all the guest can spare
	PIDs     int64    `json:"pids,omitempty"`
	DNS      []string `json:"dns,omitempty"`
}

// Status is the guest's view of its sandbox.
type Status struct {
	Started bool  `json:"started"`
	Uptime  int64 `json:"uptime_ms"`
	// BootMs is how long the guest took from its kernel's start to ready.
	BootMs int64 `json:"boot_ms"`
	// DAX says the layers are mounted with DAX (read in place from the
	// host's page cache).
	DAX bool `json:"dax,omitempty"`
}

// ExecRequest is the first line of an exec's request body; stdin follows.
type ExecRequest struct {
	Argv    []string      `json:"argv,omitempty"`
	Shell   string        `json:"shell,omitempty"` // run with the platform's shell
	Env     []string      `json:"env,omitempty"`
	Cwd     string        `json:"cwd,omitempty"`
	User    string        `json:"user,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"`
	Stdin   bool          `json:"stdin,omitempty"` // false: stdin is empty
}

// ExecResult ends an exec's response.
type ExecResult struct {
	backend.ExecResult
	// Error, if set, means the exec failed (Code as in Error).
	Error *Error `json:"error,omitempty"`
}

// Frame kinds of an exec's response body: each frame is a kind byte, a
// big-endian uint32 length and that many bytes.
const (
	FrameStdout byte = 'o'
	FrameStderr byte = 'e'
	FrameResult byte = 'x' // JSON ExecResult, last
)

// MaxFrame is the largest frame payload.
const MaxFrame = 1 << 20

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, kind byte, p []byte) error {
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(p)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(p)
	return err
}

// ReadFrame reads one frame.
func ReadFrame(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes", n)
	}
	p := make([]byte, n)
	_, err := io.ReadFull(r, p)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return h[0], p, err
}

// Error codes, each with its HTTP status.
const (
	CodeNotFound    = "not_found"   // 404
	CodeInvalid     = "invalid"     // 400
	CodeConflict    = "conflict"    // 409
	CodeUnavailable = "unavailable" // 503
	CodeInternal    = "internal"    // 500
	CodeRefused     = "refused"     // 502: nothing accepts on the port
)

// Error is an error answer.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Handshake lines. The host opens with "HELLO <nonce>"; the guest answers
// "WELCOME <host nonce> <mac> <guest nonce>"; the host proves itself with
// "PROVE <mac>"; the guest says "READY v<Version>". Anything before the line a side
// waits for is discarded (up to maxNoise bytes): bytes of an earlier
// session may still be in flight on the port.
const (
	helloWord   = "HELLO"
	welcomeWord = "WELCOME"
	proveWord   = "PROVE"
	readyWord   = "READY"
	maxNoise    = 4 << 20
)

// ErrHandshake is wrapped by every handshake failure caused by the other
// side (a wrong secret, a malformed line).
var ErrHandshake = errors.New("handshake failed")

// Version is the protocol's: the guest says it when ready, and the host
// refuses a guest of another (ErrVersion): a warren-guest from another
// build, in an initramfs or a vm's disk made before an upgrade, would
// otherwise fail later in ways that name no cause. Raise it with every
// change to the protocol (endpoints, frames, request fields).
const Version = 2

// ErrVersion is wrapped by HostHandshake's error when the guest speaks
// another version (or says none: before versions).
var ErrVersion = errors.New("the guest agent is from another build of warren")

func nonce() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func mac(secret, role, n string) string {
	key, _ := hex.DecodeString(secret)
	h := hmac.New(sha256.New, key)
	h.Write([]byte(role + ":" + n))
	return hex.EncodeToString(h.Sum(nil))
}

// lines reads lines holding one of a few words, keeping a partial line
// across a read deadline (the host waits in half-second steps).
type lines struct {
	r       *bufio.Reader
	partial []byte
	noise   int
}

// next returns the next line holding one of words, from that word on,
// discarding lines without one (bytes of an earlier session may precede
// the word on its line).
func (l *lines) next(words ...string) ([]string, error) {
	for {
		frag, err := l.r.ReadSlice('\n')
		l.partial = append(l.partial, frag...)
		if err == bufio.ErrBufferFull {
			err = nil
		}
		if len(l.partial) > maxLine {
			l.noise += len(l.partial)
			l.partial = l.partial[:0]
		}
		if err != nil {
			return nil, err
		}
		if len(frag) == 0 || frag[len(frag)-1] != '\n' {
			continue
		}
		line := string(l.partial)
		l.partial = l.partial[:0]
		for _, w := range words {
			if i := strings.Index(line, w+" "); i >= 0 {
				return strings.Fields(line[i:]), nil
			}
			if strings.HasSuffix(strings.TrimSpace(line), w) {
				return []string{w}, nil
			}
		}
		if l.noise += len(line); l.noise > maxNoise {
			return nil, fmt.Errorf("%w: no %s line", ErrHandshake, strings.Join(words, " or "))
		}
	}
}

// maxLine bounds a handshake line.
const maxLine = 1024

// HostHandshake runs the host's side on a fresh connection. r must be
// the buffered reader the rest of the session reads from. The hello is
// sent again every half second until the guest answers: a guest restored
// from a saved state is still in its earlier session, which the first
// hello ends. ctx bounds the whole handshake.
func HostHandshake(ctx context.Context, conn net.Conn, r *bufio.Reader, secret string) error {
	defer conn.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	l := &lines{r: r}
	hn := nonce()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(conn, "\n%s %s\n", helloWord, hn); err != nil {
			return err
		}
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		f, err := l.next(welcomeWord)
		if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return err
		}
		if len(f) != 4 || f[1] != hn {
			continue // an answer to an earlier hello
		}
		conn.SetReadDeadline(time.Time{})
		if !hmac.Equal([]byte(f[2]), []byte(mac(secret, "guest", hn))) {
			return fmt.Errorf("%w: the guest does not know the sandbox's secret", ErrHandshake)
		}
		if _, err := fmt.Fprintf(conn, "%s %s\n", proveWord, mac(secret, "host", f[3])); err != nil {
			return err
		}
		for {
			// Answers to hellos sent meanwhile may come first.
			f, err := l.next(readyWord, welcomeWord)
			if err != nil {
				return err
			}
			if f[0] == readyWord {
				if want := "v" + strconv.Itoa(Version); len(f) < 2 || f[1] != want {
					return fmt.Errorf("%w: it speaks protocol %q, this warren %s: install this build's warren-guest (scripts/build-helpers) and make its image again",
						ErrVersion, strings.Join(f[1:], " "), want)
				}
				return nil
			}
		}
	}
}

// GuestHandshake runs the guest's side. r must be the buffered reader
// the rest of the session reads from. Every hello gets an answer (the
// host says it again until it hears one), all with this handshake's one
// guest nonce, which the proof must answer.
func GuestHandshake(r *bufio.Reader, w io.Writer, secret string) error {
	return guestHandshake(r, w, secret, Version)
}

func guestHandshake(r *bufio.Reader, w io.Writer, secret string, version int) error {
	l := &lines{r: r}
	gn := nonce()
	answered := false
	for {
		f, err := l.next(helloWord, proveWord)
		if err != nil {
			return err
		}
		switch {
		case f[0] == helloWord && len(f) == 2:
			answered = true
			if _, err := fmt.Fprintf(w, "\n%s %s %s %s\n", welcomeWord, f[1], mac(secret, "guest", f[1]), gn); err != nil {
				return err
			}
		case f[0] == proveWord && len(f) == 2 && answered:
			if !hmac.Equal([]byte(f[1]), []byte(mac(secret, "host", gn))) {
				return fmt.Errorf("%w: the host does not know the sandbox's secret", ErrHandshake)
			}
			_, err = fmt.Fprintf(w, "\n%s v%d\n", readyWord, version)
			return err
		}
	}
}

// NewSecret returns a fresh secret for Config.Secret.
func NewSecret() string { return nonce() + nonce() }
