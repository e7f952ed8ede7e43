package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/guest/boot"
	"github.com/warrenhq/warren/guest/proto"
	"github.com/warrenhq/warren/internal/backend"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/rootfs"
)

func (a *agent) handler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { reply(w, a.status(), nil) })
	m.HandleFunc("POST /v1/start", a.handleStart)
	m.HandleFunc("POST /v1/exec", a.handleExec)
	m.HandleFunc("GET /v1/stat", func(w http.ResponseWriter, r *http.Request) {
		fi, err := rootfs.Stat(rootDir, r.URL.Query().Get("path"))
		reply(w, fi, err)
	})
	m.HandleFunc("GET /v1/file", func(w http.ResponseWriter, r *http.Request) {
		stream(w, func(w io.Writer) error { return rootfs.ReadFile(rootDir, r.URL.Query().Get("path"), w) })
	})
	m.HandleFunc("PUT /v1/file", func(w http.ResponseWriter, r *http.Request) {
		mode, err := strconv.ParseUint(r.URL.Query().Get("mode"), 8, 32)
		if err != nil {
			reply(w, nil, errdefs.Invalid("mode %q", r.URL.Query().Get("mode")))
			return
		}
		reply(w, struct{}{}, rootfs.WriteFile(rootDir, r.URL.Query().Get("path"), uint32(mode), r.Body))
	})
	m.HandleFunc("GET /v1/tar", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		if _, err := rootfs.Stat(rootDir, p); err != nil { // before any byte of the stream
			reply(w, nil, err)
			return
		}
		stream(w, func(w io.Writer) error { return rootfs.ReadTar(rootDir, p, w) })
	})
	m.HandleFunc("PUT /v1/tar", func(w http.ResponseWriter, r *http.Request) {
		reply(w, struct{}{}, rootfs.WriteTar(rootDir, r.URL.Query().Get("dir"), r.Body))
	})
	m.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		st, err := sandboxStats()
		reply(w, st, err)
	})
	m.HandleFunc("POST /v1/port", a.handlePort)
	m.HandleFunc("POST /v1/sync", a.handleSync)
	m.HandleFunc("POST /v1/shutdown", a.handleShutdown)
	return m
}

// reply writes v as JSON, or err as a proto.Error with its status.
func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		e := toError(err)
		w.WriteHeader(statusOf(e.Code))
		json.NewEncoder(w).Encode(e)
		return
	}
	json.NewEncoder(w).Encode(v)
}

// stream writes what f produces; an error before the first byte is a
// proper error reply, one later breaks the stream (the host sees a
// truncated body and an error trailer).
func stream(w http.ResponseWriter, f func(io.Writer) error) {
	sw := &startedWriter{w: w}
	err := f(sw)
	if err != nil && !sw.started {
		reply(w, nil, err)
		return
	}
	if !sw.started {
		w.WriteHeader(http.StatusOK)
	}
	if err != nil {
		w.Header().Set(http.TrailerPrefix+"Warren-Error", err.Error())
	}
}

type startedWriter struct {
	w       http.ResponseWriter
	started bool
}

func (s *startedWriter) Write(p []byte) (int, error) {
	if !s.started {
		s.started = true
		s.w.Header().Set("Trailer", "Warren-Error")
		s.w.WriteHeader(http.StatusOK)
	}
	return s.w.Write(p)
}

func toError(err error) *proto.Error {
	code := proto.CodeInternal
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		code = proto.CodeNotFound
	case errors.Is(err, errdefs.ErrInvalid):
		code = proto.CodeInvalid
	case errors.Is(err, errdefs.ErrConflict):
		code = proto.CodeConflict
	case errors.Is(err, errdefs.ErrUnavailable):
		code = proto.CodeUnavailable
	}
	return &proto.Error{Code: code, Message: err.Error()}
}

func statusOf(code string) int {
	switch code {
	case proto.CodeNotFound:
		return http.StatusNotFound
	case proto.CodeInvalid:
		return http.StatusBadRequest
	case proto.CodeConflict:
		return http.StatusConflict
	case proto.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func (a *agent) status() proto.Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	return proto.Status{Started: a.started, Uptime: uptime().Milliseconds(), BootMs: a.ready.Milliseconds(), DAX: layersDAX()}
}

func (a *agent) handleStart(w http.ResponseWriter, r *http.Request) {
	var req proto.StartRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		reply(w, nil, errdefs.Invalid("start: %v", err))
		return
	}
	var err error
	if a.vm {
		err = a.startVM(req)
	} else {
		err = a.startSandbox(req)
	}
	reply(w, a.status(), err)
}

// sandboxStats reads the sandbox cgroup's counters.
func sandboxStats() (backend.Stats, error) {
	var st backend.Stats
	b, err := os.ReadFile(filepath.Join(sandboxCg, "cpu.stat"))
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, _ := strconv.ParseInt(v, 10, 64)
			st.CPU = time.Duration(us) * time.Microsecond
		}
	}
	st.Memory = readInt(filepath.Join(sandboxCg, "memory.current"))
	st.MemoryPeak = readInt(filepath.Join(sandboxCg, "memory.peak"))
	st.PIDs = readInt(filepath.Join(sandboxCg, "pids.current"))
	return st, nil
}

func readInt(p string) int64 {
	b, _ := os.ReadFile(p)
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// handlePort relays a full-duplex stream to 127.0.0.1:port in the
// guest (whose network the sandbox shares). The answer's status says
// whether the connection was made: 502 with "refused" when nothing
// accepts it.
func (a *agent) handlePort(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	if err != nil || port < 1 || port > 65535 {
		reply(w, nil, errdefs.Invalid("port %q", r.URL.Query().Get("port")))
		return
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 10*time.Second)
	if err != nil {
		if errors.Is(err, unix.ECONNREFUSED) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			json.NewEncoder(w).Encode(proto.Error{Code: proto.CodeRefused, Message: fmt.Sprintf("127.0.0.1:%d: connection refused", port)})
			return
		}
		reply(w, nil, err)
		return
	}
	defer c.Close()
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	rc.EnableFullDuplex()
	// Host to guest: until the host ends its side, or the stream ends
	// (this handler returns once the guest's side has ended).
	go func() {
		io.Copy(c, r.Body)
		c.(*net.TCPConn).CloseWrite()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				break
			}
			rc.Flush()
		}
		if err != nil {
			break
		}
	}
}

// handleSync syncs the writable disk and freezes it (freeze=1) so the
// host can copy it whole, or thaws it (freeze=0).
func (a *agent) handleSync(w http.ResponseWriter, r *http.Request) {
	if a.vm {
		reply(w, nil, notInVM("sync"))
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	freeze := r.URL.Query().Get("freeze")
	f, err := os.Open(rwDir)
	if err != nil {
		reply(w, nil, err)
		return
	}
	defer f.Close()
	switch {
	case freeze == "1" && !a.frozen:
		unix.Syncfs(int(f.Fd()))
		err = unix.IoctlSetInt(int(f.Fd()), fifreeze, 0)
		a.frozen = err == nil
	case freeze == "0" && a.frozen:
		err = unix.IoctlSetInt(int(f.Fd()), fithaw, 0)
		a.frozen = false
	case freeze == "":
		err = unix.Syncfs(int(f.Fd()))
	}
	if err != nil {
		err = fmt.Errorf("sync %s: %w", rwDir, err)
	}
	reply(w, struct{}{}, err)
}

// handleShutdown stops the sandbox's processes (SIGTERM, SIGKILL after
// grace), syncs and powers off: QEMU exits.
func (a *agent) handleShutdown(w http.ResponseWriter, r *http.Request) {
	if a.vm {
		reply(w, nil, notInVM("shutdown (the vm backend presses the power button)"))
		return
	}
	grace, _ := time.ParseDuration(r.URL.Query().Get("grace"))
	reply(w, struct{}{}, nil)
	http.NewResponseController(w).Flush()
	go func() {
		a.mu.Lock()
		if a.frozen {
			if f, err := os.Open(rwDir); err == nil {
				unix.IoctlSetInt(int(f.Fd()), fithaw, 0)
				f.Close()
			}
		}
		a.mu.Unlock()
		signalAll(unix.SIGTERM)
		deadline := time.Now().Add(grace)
		for time.Now().Before(deadline) && readInt(filepath.Join(sandboxCg, "pids.current")) > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		os.WriteFile(filepath.Join(sandboxCg, "cgroup.kill"), []byte("1"), 0)
		unix.Unmount(rootDir, unix.MNT_DETACH)
		boot.PowerOff()
	}()
}

// The filesystem freeze ioctls (linux/fs.h: _IOWR('X', 119, int) and 120).
const (
	fifreeze = 0xc0045877
	fithaw   = 0xc0045878
)

// layersDAX says whether the first layer is mounted with DAX.
func layersDAX() bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == layersDir+"/0" {
			return strings.Contains(line, "dax")
		}
	}
	return false
}
