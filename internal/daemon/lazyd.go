package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/cgroup"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fncall"
	"github.com/warrenhq/warren/internal/hostbin"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/lazy"
	"github.com/warrenhq/warren/internal/node"
	"github.com/warrenhq/warren/internal/node/nodeapi"
)

// LayerServerConfig configures ServeLayers: `warren lazyd`.
type LayerServerConfig struct {
	Dir        string // the server's directory: <node dir>/lazy
	Blobs      string // the blob store (blob.Open); S3 credentials from the environment
	CacheBytes int64  // the chunk cache's limit (default DefaultChunkCache)
	// TraceWindow is how long a layer's first reads are recorded into
	// its prefetch trace (lazy.ServerConfig).
	TraceWindow time.Duration
	Log         *slog.Logger
}

// ServeLayers runs a node's lazy layer server (lazy.Serve) until ctx ends
// or its agent stops it: the process an agent with lazy layers starts,
// so that sandboxes keep reading their layers while the agent restarts.
func ServeLayers(ctx context.Context, cfg LayerServerConfig) error {
	if cfg.Dir == "" || cfg.Blobs == "" {
		return errdefs.Invalid("layer server: a directory and a blob store are required")
	}
	if cfg.CacheBytes <= 0 {
		cfg.CacheBytes = DefaultChunkCache
	}
	store, err := blob.Open(ctx, cfg.Blobs)
	if err != nil {
		return fmt.Errorf("layer server: %w", err)
	}
	return lazy.Serve(ctx, lazy.ServerConfig{Dir: cfg.Dir, Store: store, CacheBytes: cfg.CacheBytes, TraceWindow: cfg.TraceWindow, Log: cfg.Log})
}

// layerServerCommand returns the command that runs a layer server with
// these `warren lazyd` flags. Tests replace it: their binary is not
// warren.
var layerServerCommand = func(flags []string) (*exec.Cmd, error) {
	bin, err := warrenBinary()
	if err != nil {
		return nil, err
	}
	return exec.Command(bin, append([]string{"lazyd"}, flags...)...), nil
}

// warrenMain is the warren binary's main package.
const warrenMain = "github.com/warrenhq/warren/cmd/warren"

// warrenBinary is the warren binary to run `warren lazyd` with: this
// program if it is warren, else the one beside it or on $PATH.
func warrenBinary() (string, error) {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Path == warrenMain {
		return os.Executable()
	}
	if p := hostbin.Find("warren"); filepath.IsAbs(p) {
		return p, nil
	}
	exe, _ := os.Executable()
	return "", errdefs.Unavailable("the layer server runs as `warren lazyd`, and this program (%s) is not warren: no warren binary beside it or on $PATH", exe)
}

// Supervision of the layer server (variables: tests shorten them).
var (
	layerProbeEvery   = 2 * time.Second
	layerProbeTimeout = 5 * time.Second
)

const (
	layerProbeFails  = 2                // probes in a row that make a live server dead
	layerServerStart = 10 * time.Second // for a new server to answer
	layerLossShown   = time.Hour        // a loss no known sandbox outlives stays a problem so long
)

// layerServerConfig configures startLayerServer.
type layerServerConfig struct {
	Dir         string // the server's directory (lazy.Serve)
	Blobs       string // its blob store's spec
	CacheBytes  int64
	TraceWindow time.Duration // 0: the server's default
	// Cgroup is where the server's process goes (in the unified
	// hierarchy and v1's name=systemd, the ones service managers track
	// processes by), out of the agent's: stopping the agent's service
	// must not kill it. "" leaves it in the agent's.
	Cgroup string
	Log    *slog.Logger
}

// layerServer is a node's lazy layers as its agent sees them: the layer
// server process (package lazy, `warren lazyd`) an earlier agent left
// serving or this one started, probed every layerProbeEvery and replaced
// when it dies. It implements lazy.Layers for image.Cache through
// whichever server is live; while none is, Add fails with
// ErrUnavailable.
//
// A server's death costs the layer mounts on its files (reads of them
// fail: ENOTCONN): the supervisor detaches them, so that new sandboxes
// mount those layers afresh from the next server, logs what was lost and
// keeps it among the node's problems (Problems) while sandboxes that used
// them live. So does an agent that finds the server of an earlier one
// dead when it starts.
type layerServer struct {
	cfg layerServerConfig
	mnt string
	log *slog.Logger

	mu      sync.Mutex
	cur     *serverProc // nil while none serves
	down    string      // why none serves, then
	suspect bool        // cur did not answer its last probe
	lost    []layerLoss
	seq     int        // of the last loss
	users   liveLayers // which sandboxes use which layers (Node); nil until known

	traces *layerTraces // collects the server's prefetch traces (traces.go)

	stop  chan struct{} // closed by Close
	done  chan struct{} // closed when supervise returns
	close sync.Once
}

var _ lazy.Layers = (*layerServer)(nil)

// serverProc is one layer server process.
type serverProc struct {
	client  *lazy.Client
	info    lazy.Info
	watched bool          // by a pidfd: exited tells its end
	exited  chan struct{} // closed when the process is gone (if watched)
	quit    chan struct{} // closed to stop watching it

	mu    sync.Mutex
	pidfd int // -1 once closed, or if the kernel has no pidfd_open
}

// layerLoss is what one death of the server took.
type layerLoss struct {
	seq       int
	at        time.Time
	pid       int
	why       string
	layers    []string // digests of the layer mounts lost
	sandboxes []string // using them when it died
	known     bool     // sandboxes is known
}

// startLayerServer goes on with the server in cfg.Dir if one answers
// there, else clears what a dead one left and starts another; then it
// watches it.
func startLayerServer(cfg layerServerConfig) (*layerServer, error) {
	s := &layerServer{cfg: cfg, mnt: lazy.MountDir(cfg.Dir), log: cfg.Log, stop: make(chan struct{}), done: make(chan struct{})}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	p, err := s.adopt()
	for i := 0; err != nil && i < 2 && s.hungPid() > 0; i++ {
		// A server runs but did not answer (busy?): more chances
		// before it is taken for hung and killed.
		time.Sleep(time.Second)
		p, err = s.adopt()
	}
	if err == nil {
		s.log.Info("lazy layers: the layer server of an earlier agent is still serving; going on with it", "pid", p.info.Pid, "started", p.info.Start)
	} else {
		s.clearDead()
		if p, err = s.spawn(); err != nil {
			return nil, err
		}
	}
	s.cur = p
	go s.supervise()
	return s, nil
}

// adopt returns the server that answers in the directory.
func (s *layerServer) adopt() (*serverProc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, info, err := lazy.Dial(ctx, s.cfg.Dir)
	if err != nil {
		return nil, err
	}
	p := watchServer(c, info)
	// The pid was read before pidfd_open: make sure it still serves.
	if again, err := c.Info(ctx); err != nil || again.Pid != info.Pid {
		p.close()
		return nil, fmt.Errorf("the layer server in %s went away", s.cfg.Dir)
	}
	return p, nil
}

// clearDead clears what a server that no longer answers left: its
// process if it still runs (hung), and the layer mounts on its dead
// filesystem, which sandboxes still running on them lose.
func (s *layerServer) clearDead() {
	why := "was gone when this agent started"
	if pid := s.hungPid(); pid > 0 {
		s.log.Warn("lazy layers: killing a layer server that does not answer", "pid", pid)
		killWait(pid)
		why = "did not answer when this agent started (killed)"
	}
	layers, err := detachLayerMounts(s.mnt)
	if len(layers) > 0 || err != nil {
		s.log.Warn("lazy layers: the layer server of an earlier agent is gone; its layer mounts were detached, and sandboxes still using them fail reads of them until recreated",
			"mounts", len(layers), "layers", layers, "err", err)
	}
	if len(layers) > 0 {
		// Which sandboxes they were is known once the agent has
		// recovered its sandboxes (Node).
		s.seq++
		s.lost = append(s.lost, layerLoss{seq: s.seq, at: time.Now(), pid: s.lastPid(), why: why, layers: layers})
	}
}

// lastPid is the pid the last server of the directory wrote, or 0.
func (s *layerServer) lastPid() int {
	b, _ := os.ReadFile(lazy.PidFile(s.cfg.Dir))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// hungPid is the pid of a layer server of the directory that still runs,
// from its pid file, or 0.
func (s *layerServer) hungPid() int {
	pid := s.lastPid()
	if pid <= 1 || pid == os.Getpid() {
		return 0
	}
	// The pid may have gone to another process since.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte("\x00--dir\x00"+s.cfg.Dir+"\x00")) {
		return 0
	}
	return pid
}

// spawn starts a layer server in its own session (a terminal's Ctrl-C or
// a kill of the agent's process group does not reach it) and cgroup, its
// output appended to server.log, and waits until it answers.
func (s *layerServer) spawn() (*serverProc, error) {
	flags := []string{"--dir", s.cfg.Dir, "--blobs", s.cfg.Blobs, "--chunk-cache", strconv.FormatInt(s.cfg.CacheBytes, 10)}
	if s.cfg.TraceWindow != 0 {
		flags = append(flags, "--trace-window", s.cfg.TraceWindow.String())
	}
	cmd, err := layerServerCommand(flags)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(s.cfg.Dir, "server.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, 2)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the layer server: %w", err)
	}
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() // reaps it: no zombie
	if s.cfg.Cgroup != "" {
		if err := joinCgroup(s.cfg.Cgroup, pid); err != nil {
			s.log.Warn("lazy layers: the layer server stays in the agent's cgroup: a service manager that stops the agent's may kill it (systemd: KillMode=process)", "err", err)
		}
	}
	deadline := time.Now().Add(layerServerStart)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, info, err := lazy.Dial(ctx, s.cfg.Dir)
		cancel()
		if err == nil && info.Pid == pid {
			s.log.Info("lazy layers: layer server started", "pid", pid, "log", logPath)
			return watchServer(c, info), nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("the layer server exited: %s (%s)", cmd.ProcessState, tail(logPath, logStart))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return nil, fmt.Errorf("the layer server did not answer within %v (%s)", layerServerStart, tail(logPath, logStart))
		}
	}
}

// tail is the end of what a log file got since off, on one line.
func tail(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < off {
		return "see " + path
	}
	b = bytes.TrimSpace(b[off:])
	if len(b) > 1000 {
		b = b[len(b)-1000:]
	}
	return path + ": " + strings.ReplaceAll(string(b), "\n", " | ")
}

// joinCgroup moves pid into the cgroup path of the hierarchies service
// managers track processes by: the unified one and v1's name=systemd.
func joinCgroup(path string, pid int) error {
	dirs, err := serverCgroups(path)
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d.Path, 0o755); err != nil {
			return err
		}
		if err := d.Join(pid); err != nil {
			return fmt.Errorf("cgroup %s: %w", d.Path, err)
		}
	}
	return nil
}

func serverCgroups(path string) ([]cgroup.Dir, error) {
	l, err := cgroup.Host()
	if err != nil {
		return nil, err
	}
	var dirs []cgroup.Dir
	if d, ok := l.V1Dir("name=systemd", path); ok {
		dirs = append(dirs, cgroup.Dir{Path: d})
	}
	if l.Unified != "" {
		dirs = append(dirs, cgroup.Dir{Path: filepath.Join(l.Unified, path), V2: true})
	}
	return dirs, nil
}

// watchServer watches the process of a server that answered: exited is
// closed when it is gone (a pidfd polls readable), whether it is this
// agent's child or an earlier agent's.
func watchServer(c *lazy.Client, info lazy.Info) *serverProc {
	p := &serverProc{client: c, info: info, pidfd: -1, exited: make(chan struct{}), quit: make(chan struct{})}
	fd, err := unix.PidfdOpen(info.Pid, 0)
	if err != nil {
		return p // probes alone tell its death
	}
	p.pidfd, p.watched = fd, true
	go func() {
		defer func() {
			p.mu.Lock()
			unix.Close(p.pidfd)
			p.pidfd = -1
			p.mu.Unlock()
		}()
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			select {
			case <-p.quit:
				return
			default:
			}
			if n, err := unix.Poll(fds, 500); err == nil && n > 0 {
				close(p.exited)
				return
			}
		}
	}()
	return p
}

// kill kills the process (by its pidfd: never another that took its pid
// since) and waits up to 5 s for it to be gone.
func (p *serverProc) kill() {
	if !p.watched {
		killWait(p.info.Pid)
		return
	}
	p.mu.Lock()
	if p.pidfd >= 0 {
		unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0)
	}
	p.mu.Unlock()
	select {
	case <-p.exited:
	case <-p.quit:
	case <-time.After(5 * time.Second):
	}
}

// close stops watching the process (it may run on).
func (p *serverProc) close() {
	select {
	case <-p.quit:
	default:
		close(p.quit)
		p.client.Close()
	}
}

// killWait kills pid and waits up to 5 s for it to be gone: its FUSE
// connection is aborted then, and reads of its files fail at once.
func killWait(pid int) {
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		return
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || bytes.Contains(b, []byte(") Z ")) {
			return
		}
	}
}

// detachLayerMounts detaches the layer mounts on the files of the dead
// filesystem mnt and returns their layers' digests.
func detachLayerMounts(mnt string) ([]string, error) {
	points, err := image.DetachMountsOf(mnt)
	var digests []string
	for _, p := range points {
		digests = append(digests, mountDigest(filepath.Base(p)))
	}
	slices.Sort(digests)
	return digests, err
}

// mountDigest is the digest of the layer image.Mounts mounts at a
// directory named name ("<hex>" for sha256, "<algo>-<hex>" otherwise).
func mountDigest(name string) string {
	if algo, hex, ok := strings.Cut(name, "-"); ok {
		return algo + ":" + hex
	}
	return blob.Algorithm + ":" + name
}

// supervise probes the server until Close, and replaces it when it dies.
func (s *layerServer) supervise() {
	defer close(s.done)
	fails := 0
	retry := layerProbeEvery // between failed starts, doubling
	tick := time.NewTicker(layerProbeEvery)
	defer tick.Stop()
	var nextStart time.Time
	for {
		s.mu.Lock()
		p := s.cur
		s.mu.Unlock()
		var exited chan struct{}
		if p != nil {
			exited = p.exited
		}
		select {
		case <-s.stop:
			return
		case <-exited:
			s.died(p, "exited")
			fails = 0
			continue
		case <-tick.C:
		}
		if p == nil { // none serves: start one when it is time
			if time.Now().Before(nextStart) {
				continue
			}
			if err := s.restart(); err != nil {
				s.log.Error("lazy layers: no layer server: new creates on this node cannot mount lazily loaded layers", "err", err, "retry_in", retry)
				nextStart = time.Now().Add(retry)
				retry = min(2*retry, time.Minute)
			} else {
				retry = layerProbeEvery
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), layerProbeTimeout)
		_, err := p.client.Info(ctx)
		cancel()
		s.mu.Lock()
		s.suspect = err != nil
		s.mu.Unlock()
		if err == nil {
			fails = 0
			continue
		}
		fails++
		s.log.Warn("lazy layers: the layer server did not answer", "pid", p.info.Pid, "probes_failed", fails, "err", err)
		if fails >= layerProbeFails {
			s.died(p, fmt.Sprintf("stopped answering (%v)", err))
			fails = 0
		}
	}
}

// died handles the death of server p: it makes sure the process is gone
// (a server that does not answer is killed, so that reads of its files
// fail instead of hanging), detaches the layer mounts on its dead
// filesystem, says what was lost and starts another server.
func (s *layerServer) died(p *serverProc, why string) {
	s.mu.Lock()
	s.cur, s.down = nil, fmt.Sprintf("the layer server (pid %d) %s; starting another", p.info.Pid, why)
	users := s.users
	s.mu.Unlock()
	p.kill()
	p.close()
	layers, err := detachLayerMounts(s.mnt)
	loss := layerLoss{at: time.Now(), pid: p.info.Pid, why: why, layers: layers}
	if users != nil && len(layers) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		live, uerr := users(ctx)
		cancel()
		if uerr == nil {
			loss.sandboxes, loss.known = usersOf(live, layers), true
		}
	}
	msg := "lazy layers: the layer server died; no layer was mounted on it"
	if len(layers) > 0 {
		msg = "lazy layers: the layer server died, and the layer mounts on it are lost: the sandboxes using them fail their reads (ENOTCONN) until recreated, but for what the page cache still holds"
	}
	s.log.Error(msg, "pid", p.info.Pid, "why", why, "layer_mounts_lost", len(layers), "layers", layers, "sandboxes", loss.sandboxes, "err", err)
	if len(layers) > 0 {
		s.mu.Lock()
		s.seq++
		loss.seq = s.seq
		s.lost = append(s.lost, loss)
		s.mu.Unlock()
	}
	if err := s.restart(); err != nil {
		s.log.Error("lazy layers: no layer server: new creates on this node cannot mount lazily loaded layers", "err", err)
	}
}

// usersOf are the sandboxes of live that use any of layers.
func usersOf(live map[string][]string, layers []string) []string {
	var ids []string
	for _, d := range layers {
		ids = append(ids, live[d]...)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// restart starts a new server in place of a dead one.
func (s *layerServer) restart() error {
	p, err := s.spawn()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.down = fmt.Sprintf("no layer server: %v", err)
		return err
	}
	s.cur, s.down, s.suspect = p, "", false
	return nil
}

// Add implements lazy.Layers, through the live server.
func (s *layerServer) Add(l lazy.Layer) (string, error) {
	c, err := s.client()
	if err != nil {
		return "", err
	}
	return c.Add(l)
}

// Stats implements lazy.Layers, through the live server. The node's
// status asks for them holding its lock: a server that missed its last
// probe is not asked, and none is waited for more than a second.
func (s *layerServer) Stats() (lazy.Stats, error) {
	c, err := s.client()
	if err != nil {
		return lazy.Stats{}, err
	}
	s.mu.Lock()
	suspect := s.suspect
	s.mu.Unlock()
	if suspect {
		return lazy.Stats{}, errdefs.Unavailable("lazy layers: the layer server did not answer its last probe")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.StatsContext(ctx)
}

func (s *layerServer) client() (*lazy.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil, errdefs.Unavailable("lazy layers: %s", s.down)
	}
	return s.cur.client, nil
}

// pid is the live server's pid, or 0.
func (s *layerServer) pid() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return 0
	}
	return s.cur.info.Pid
}

// Problems are the node's problems with its lazy layers, one line each:
// no server serves, or one died and took the layer mounts of sandboxes
// still running (shown while any of them lives; for layerLossShown if
// which sandboxes is not known).
func (s *layerServer) Problems(ctx context.Context) []string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	down, lost, users := s.down, slices.Clone(s.lost), s.users
	s.mu.Unlock()
	var live map[string]bool
	if users != nil && len(lost) > 0 {
		if m, err := users(ctx); err == nil {
			live = map[string]bool{}
			for _, ids := range m {
				for _, id := range ids {
					live[id] = true
				}
			}
		}
	}
	var out []string
	var gone []int // seq of losses no sandbox outlived
	if down != "" {
		out = append(out, "lazy layers: "+down)
	}
	for _, l := range lost {
		var still []string
		for _, id := range l.sandboxes {
			if live == nil || live[id] {
				still = append(still, id)
			}
		}
		if (l.known && live != nil && len(still) == 0) || (!l.known && time.Since(l.at) > layerLossShown) {
			gone = append(gone, l.seq)
			continue
		}
		msg := fmt.Sprintf("lazy layers: the layer server (pid %d) %s at %s: %d layer mounts lost (%s)",
			l.pid, l.why, l.at.UTC().Format(time.RFC3339), len(l.layers), strings.Join(l.layers, ", "))
		if len(still) > 0 {
			msg += fmt.Sprintf("; sandboxes %s fail reads of them until recreated", strings.Join(still, ", "))
		} else {
			msg += "; the sandboxes using them fail reads of them until recreated"
		}
		out = append(out, msg)
	}
	if len(gone) > 0 {
		s.mu.Lock()
		s.lost = slices.DeleteFunc(s.lost, func(l layerLoss) bool { return slices.Contains(gone, l.seq) })
		s.mu.Unlock()
	}
	return out
}

// Node returns agent as its API serves it, with the lazy layers'
// problems among the node's, and tells the supervisor which sandboxes
// use which layers (fn's runtimes too), to say whose mounts a server's
// death took.
func (s *layerServer) Node(agent *node.Agent, fn *fncall.Service) nodeapi.Agent {
	if s == nil {
		return agent
	}
	users := agentLayers(agent, fn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	live, err := users(ctx) // the recovered sandboxes: no create yet
	cancel()
	s.mu.Lock()
	s.users = users
	for i, l := range s.lost {
		if !l.known && err == nil {
			s.lost[i].sandboxes, s.lost[i].known = usersOf(live, l.layers), true
		}
	}
	s.mu.Unlock()
	return layerAgent{agent, s}
}

// layerAgent is a node agent with its lazy layers' problems.
type layerAgent struct {
	*node.Agent
	layers *layerServer
}

func (a layerAgent) Status() api.Node {
	n := a.Agent.Status()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n.Problems = append(n.Problems, a.layers.Problems(ctx)...)
	n.LayerPrefetch = true
	n.PrefetchTraces = a.layers.traces.Recent()
	return n
}

// Close stops watching the server. If no layer is mounted on its files
// any more (every sandbox is gone), it stops the server too and waits for
// it to exit; otherwise the server serves on, for the sandboxes and the
// next agent.
func (s *layerServer) Close() {
	if s == nil {
		return
	}
	s.close.Do(s.stopServer)
}

func (s *layerServer) stopServer() {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	p := s.cur
	s.cur, s.down = nil, "the agent is stopping"
	s.mu.Unlock()
	if p == nil {
		return
	}
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err := p.client.StopUnused(ctx)
	switch {
	case errors.Is(err, errdefs.ErrConflict):
		s.log.Info("lazy layers: the layer server serves on: sandboxes read layers from it; the next agent goes on with it", "pid", p.info.Pid)
		return
	case err != nil:
		s.log.Warn("lazy layers: stop the layer server; it may serve on", "pid", p.info.Pid, "err", err)
		return
	}
	if p.watched {
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			s.log.Warn("lazy layers: the layer server has not exited 10s after it stopped", "pid", p.info.Pid)
			return
		}
	}
	if s.cfg.Cgroup != "" {
		if dirs, err := serverCgroups(s.cfg.Cgroup); err == nil {
			for _, d := range dirs {
				removeCgroup(d)
			}
		}
	}
	s.log.Info("lazy layers: the layer server stopped (no layer was mounted on it)", "pid", p.info.Pid)
}

// removeCgroup removes the server's empty cgroup, waiting briefly for
// the kernel to let go of the exited process.
func removeCgroup(d cgroup.Dir) {
	for i := 0; i < 50 && d.Exists(); i++ {
		if err := os.Remove(d.Path); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
