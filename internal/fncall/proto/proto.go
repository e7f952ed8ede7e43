// Package proto is the wire between the node agent and warren-fninit
// (cmd/warren-fninit/fninit.c), the launcher of FnCall containers and the
// pid 1 of each. It is a small binary format so that the C side stays a
// few hundred lines with nothing to parse but lengths:
//
//	frame  = len u32 | type u8 | body          (len counts type and body)
//	u64    = 8 bytes; bytes = n u32 | n bytes; strs = count u64 | bytes...
//
// all little-endian, the fields of each body in the order the encoders below
// write them. File descriptors travel as SCM_RIGHTS on a frame's first byte.
//
// The launcher (its socket on fd 3, started once per node): MAKE (Setup,
// with the container's network namespace and then the cgroup.procs files it
// joins attached, opened for writing) is answered by MADE
// (the container's pid and an errno; on success its socket and a pidfd
// attached), in order. EXITED tells that a container's pid 1 was reaped:
// its whole pid namespace is gone by then.
//
// A container's socket: the container answers READY once its root is built
// (or ERROR, and exits). A call sends FILES once, answered by DONE or
// ERROR, and RUN once per case, answered by RESULT; KILL may arrive while a
// run goes on and ends it. Closing the socket ends the container's pid 1,
// and with it every process of the container.
package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol's, raised with every change to a message; the
// agent starts warren-fninit with the argument "proto=<Version>", and a
// warren-fninit of another version refuses to run (keep PROTO in
// fninit.c in step).
const Version = 2

// Message types; keep in step with fninit.c.
const (
	TypeMake   = 'M'
	TypeMade   = 'm'
	TypeExited = 'x'
	TypeFiles  = 'F'
	TypeRun    = 'R'
	TypeKill   = 'K'
	TypeReady  = 'r'
	TypeDone   = 'k'
	TypeError  = 'e'
	TypeResult = 'o'
)

// Fd is the file descriptor the launcher finds its socket on.
const Fd = 3

// MaxFrame bounds a frame either side accepts.
const MaxFrame = 256 << 20

// Encoder builds one frame.
type Encoder struct{ b []byte }

// Frame starts a frame of type t, reusing e's buffer.
func (e *Encoder) Frame(t byte) *Encoder {
	e.b = append(e.b[:0], 0, 0, 0, 0, t)
	return e
}

func (e *Encoder) U64(v int64) *Encoder {
	e.b = binary.LittleEndian.AppendUint64(e.b, uint64(v))
	return e
}

func (e *Encoder) Bytes(p []byte) *Encoder {
	e.b = binary.LittleEndian.AppendUint32(e.b, uint32(len(p)))
	e.b = append(e.b, p...)
	return e
}

func (e *Encoder) Str(s string) *Encoder {
	e.b = binary.LittleEndian.AppendUint32(e.b, uint32(len(s)))
	e.b = append(e.b, s...)
	return e
}

func (e *Encoder) Strs(v []string) *Encoder {
	e.U64(int64(len(v)))
	for _, s := range v {
		e.Str(s)
	}
	return e
}

// Done fills in the length and returns the frame.
func (e *Encoder) Done() ([]byte, error) {
	if len(e.b)-4 > MaxFrame {
		return nil, fmt.Errorf("message of %d bytes is over the %d-byte limit", len(e.b)-4, MaxFrame)
	}
	binary.LittleEndian.PutUint32(e.b, uint32(len(e.b)-4))
	return e.b, nil
}

// Make encodes a MAKE.
func Make(s *Setup) ([]byte, error) {
	var e Encoder
	e.Frame(TypeMake).Str(s.Scratch).U64(s.ScratchBytes).Str(s.Hostname).Str(s.Workdir).
		U64(int64(s.UID)).U64(int64(s.GID)).U64(b2i(s.ReadOnly)).Strs(s.Lower).Bytes(s.Seccomp).Str(s.Dev).Str(s.AppArmor)
	return e.Done()
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// FilesFrame encodes a FILES.
func FilesFrame(files []File) ([]byte, error) {
	var e Encoder
	e.Frame(TypeFiles).U64(int64(len(files)))
	for _, f := range files {
		e.Str(f.Path).U64(int64(f.Mode)).Bytes(f.Data)
	}
	return e.Done()
}

// RunFrame encodes a RUN.
func RunFrame(r *Run) ([]byte, error) {
	var e Encoder
	e.Frame(TypeRun).Strs(r.Argv).Strs(r.Env).Str(r.Dir).Bytes(r.Stdin).
		U64(r.WallNs).U64(r.OutputBytes).U64(r.FileBytes).U64(r.CPUSeconds).U64(r.StackBytes)
	return e.Done()
}

// KillFrame encodes a KILL.
func KillFrame(reason string) []byte {
	var e Encoder
	b, _ := e.Frame(TypeKill).Str(reason).Done()
	return b
}

// Decoder walks one frame's body; the first malformed field sets Err and
// every later read returns zero.
type Decoder struct {
	b   []byte
	Err error
}

var errShort = errors.New("fncall proto: malformed frame")

func NewDecoder(body []byte) *Decoder { return &Decoder{b: body} }

func (d *Decoder) U64() int64 {
	if d.Err != nil || len(d.b) < 8 {
		d.Err = errShort
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return int64(v)
}

func (d *Decoder) Bytes() []byte {
	if d.Err != nil || len(d.b) < 4 {
		d.Err = errShort
		return nil
	}
	n := int(binary.LittleEndian.Uint32(d.b))
	if n > len(d.b)-4 {
		d.Err = errShort
		return nil
	}
	p := d.b[4 : 4+n : 4+n]
	d.b = d.b[4+n:]
	return p
}

func (d *Decoder) Str() string { return string(d.Bytes()) }

// Reader reads frames from a stream whose reads may stop at a deadline
// and be retried: a frame cut short by one stays buffered for the next
// Next. One read usually brings a whole frame, or several.
type Reader struct {
	r   io.Reader
	buf []byte // read and not yet returned
}

// NewReader reads frames from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// Next returns the next frame's type and body. A read error (a deadline's
// among them) is returned as it is, and Next may be called again; a frame
// of a bad length is an error for good.
func (r *Reader) Next() (byte, []byte, error) {
	for {
		if len(r.buf) >= 4 {
			n := binary.LittleEndian.Uint32(r.buf)
			if n == 0 || n > MaxFrame {
				return 0, nil, fmt.Errorf("fncall proto: bad frame length %d", n)
			}
			if end := 4 + int(n); len(r.buf) >= end {
				// The frame keeps its bytes: later reads go past them.
				f := r.buf[4:end:end]
				r.buf = r.buf[end:]
				return f[0], f[1:], nil
			}
			if need := 4 + int(n); cap(r.buf) < need {
				r.buf = append(make([]byte, 0, need), r.buf...)
			}
		}
		if cap(r.buf)-len(r.buf) < 512 {
			r.buf = append(make([]byte, 0, max(4096, 2*len(r.buf))), r.buf...)
		}
		n, err := r.r.Read(r.buf[len(r.buf):cap(r.buf)])
		r.buf = r.buf[:len(r.buf)+n]
		if n > 0 {
			continue // an error comes back on the next read
		}
		if err == nil {
			err = io.ErrNoProgress
		}
		return 0, nil, err
	}
}

// ReadBody reads the rest of a frame whose length header was read.
func ReadBody(r io.Reader, header [4]byte) (byte, []byte, error) {
	return readBody(r, binary.LittleEndian.Uint32(header[:]))
}

func readBody(r io.Reader, n uint32) (byte, []byte, error) {
	if n == 0 || n > MaxFrame {
		return 0, nil, fmt.Errorf("fncall proto: bad frame length %d", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, err
	}
	return b[0], b[1:], nil
}

// DecodeReply turns a container's frame into a Reply.
func DecodeReply(t byte, body []byte) (Reply, error) {
	d := NewDecoder(body)
	var r Reply
	switch t {
	case TypeReady:
		r.Ready = true
	case TypeDone:
	case TypeError:
		r.Error = d.Str()
		if r.Error == "" {
			r.Error = "unknown error"
		}
	case TypeResult:
		res := &RunResult{
			ExitCode: int(d.U64()), Signal: int(d.U64()), StartError: d.Str(),
			Stdout: d.Bytes(), Stderr: d.Bytes(), StdoutBytes: d.U64(), StderrBytes: d.U64(),
			Killed: d.Str(), WallNs: d.U64(), CPUNs: d.U64(), MaxRSSKiB: d.U64(),
		}
		r.Result = res
	default:
		return r, fmt.Errorf("fncall proto: unexpected message type %q from a container", t)
	}
	return r, d.Err
}

// Setup describes the container's root filesystem and identity.
type Setup struct {
	// Lower are the read-only layer directories, top first (overlayfs
	// lowerdir order).
	Lower []string
	// Scratch is an empty host directory fninit mounts a tmpfs of
	// ScratchBytes on, private to its mount namespace; the overlay's
	// upper and work dirs live there, so every write of the container
	// goes to memory charged to its cgroup and vanishes with it.
	Scratch      string
	ScratchBytes int64
	Hostname     string
	// ReadOnly binds the single layer Lower[0] read-only as the root, with
	// the scratch's directories on /tmp and Workdir (which must exist in
	// the layer, as must /tmp, /proc and /dev), instead of an overlay.
	ReadOnly bool
	// Seccomp is the filter's program, struct sock_filter in the host's
	// layout (8 bytes each), loaded last; empty loads none.
	Seccomp []byte
	// Dev is a read-only directory of device nodes (and a shm/ mount
	// point), bound on every container's /dev.
	Dev string
	// AppArmor is the profile every run execs under (where the host runs
	// AppArmor); empty asks for none.
	AppArmor string
	// Workdir is created and given to UID:GID (the runs' identity).
	Workdir string
	UID     int
	GID     int
}

// File is written under Setup.Workdir, owned by UID:GID.
type File struct {
	Path string
	Data []byte
	Mode uint32
}

// Run is one process to run to completion.
type Run struct {
	Argv  []string // argv[0] looked up in Env's PATH
	Env   []string
	Dir   string
	Stdin []byte
	// WallNs kills the run after this long (0: never).
	WallNs int64
	// OutputBytes caps stdout and stderr each; past it the run is killed
	// (OutputLimit). FileBytes is RLIMIT_FSIZE, CPUSeconds RLIMIT_CPU (a
	// backstop: the agent watches CPU time in the cgroup), StackBytes
	// RLIMIT_STACK; 0 leaves a limit as it is.
	OutputBytes int64
	FileBytes   int64
	CPUSeconds  int64
	StackBytes  int64
}

// Reply answers Setup (Ready), Files and Run; Error is set when the
// platform, not the program, failed.
type Reply struct {
	Ready  bool
	Result *RunResult
	Error  string
}

// RunResult is how a Run ended.
type RunResult struct {
	// ExitCode, or Signal (a number) when killed by one.
	ExitCode int
	Signal   int
	// StartError is set when the program could not be started at all
	// (not found, not executable): the program's fault, not the platform's.
	StartError string
	Stdout     []byte
	Stderr     []byte
	// Totals written, kept or not.
	StdoutBytes int64
	StderrBytes int64
	// Why fninit killed the run, if it did: "wall", "output", or the
	// reason a Kill gave.
	Killed string
	WallNs int64
	// From wait4 for the run's process and the descendants it waited
	// for; the agent prefers the cgroup's figures.
	CPUNs     int64
	MaxRSSKiB int64
}
