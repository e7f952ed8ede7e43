package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/api"
)

// newWarren is the FnCall peer: POST /v1/fn/run with plain net/http (no
// dependency on the Go client's FnCall methods), one keep-alive
// connection per worker. It is skipped, with the reason, when -url does
// not answer GET /v1/fn/runtimes; it waits up to -warren-wait for the
// runtimes it needs to become available (a fresh `warren up` publishes
// the runtime images in the background); a job whose runtime is missing,
// unavailable or unfit is left out of this peer only.
func newWarren(ctx context.Context, cfg config, jobs []*job, g *cpuGroup) (*peer, error) {
	p := &peer{name: "warren", not: map[string]string{}}
	tok, err := os.ReadFile(cfg.tokenFile)
	if err != nil {
		p.skip = fmt.Sprintf("no admin token (-token-file): %v", err)
		return p, nil
	}
	w := &warren{url: strings.TrimRight(cfg.url, "/"), token: strings.TrimSpace(string(tok)),
		hc: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
		}},
		body: map[string][]byte{}}
	runtimeOf := func(j *job) string {
		return map[string]string{"python": "python3", "c": cfg.warrenCRun, "c-compile": "c"}[j.name]
	}
	var rts map[string]api.FnRuntime
	for deadline := time.Now().Add(cfg.warrenWait); ; {
		var list api.FnRuntimeList
		if err := w.do(ctx, http.MethodGet, "/v1/fn/runtimes", nil, &list); err != nil {
			p.skip = fmt.Sprintf("%s not usable: %v (start `warren up`, or pass -url and -token-file)", cfg.url, err)
			return p, nil
		}
		rts = map[string]api.FnRuntime{}
		for _, rt := range list.Runtimes {
			rts[rt.Name] = rt
		}
		var waiting []string
		for _, j := range jobs {
			if rt, ok := rts[runtimeOf(j)]; ok && !rt.Available {
				waiting = append(waiting, rt.Name+" ("+rt.Reason+")")
			}
		}
		if len(waiting) == 0 || !time.Now().Before(deadline) || ctx.Err() != nil {
			break
		}
		fmt.Printf("peer warren: waiting for runtimes %s\n", strings.Join(waiting, ", "))
		time.Sleep(3 * time.Second)
	}
	var notes []string
	for _, j := range jobs {
		name := runtimeOf(j)
		rt, ok := rts[name]
		switch {
		case !ok:
			p.not[j.name] = "no runtime " + name
			continue
		case !rt.Available:
			p.not[j.name] = fmt.Sprintf("runtime %s unavailable: %s", name, rt.Reason)
			continue
		}
		var req api.FnRunRequest
		switch j.name {
		case "python":
			req = api.FnRunRequest{Runtime: name, Source: j.source}
			// The local peers run the same interpreter flags (-python-args
			// auto): the runtime's run command without the interpreter and
			// the source file.
			p.pythonArgs = []string{}
			for _, a := range rt.Run[min(1, len(rt.Run)):] {
				if a != rt.Source {
					p.pythonArgs = append(p.pythonArgs, a)
				}
			}
			notes = append(notes, fmt.Sprintf("python3 (env %s, run %q) with Source print(1)", rt.Env, rt.Run))
		case "c":
			// Run only: the prepared binary as the file the runtime runs,
			// no Source.
			if len(rt.Compile) > 0 {
				p.not[j.name] = fmt.Sprintf("runtime %s compiles every call (%q), so it has no run-only path: declare one without a compile step"+
					` (e.g. {"name": "c-bin", "env": "debian-gcc@12", "source": "main", "run": ["./main"]} in warren up --fn-runtimes) and pass -warren-c-runtime`,
					name, rt.Compile)
				continue
			}
			if len(rt.Run) == 0 {
				p.not[j.name] = "runtime " + name + " declares no run command"
				continue
			}
			bin := strings.TrimPrefix(strings.TrimPrefix(path.Clean(rt.Run[0]), "/box/"), "./")
			req = api.FnRunRequest{Runtime: name, Files: []api.FnFile{{Path: bin, Mode: 0o755,
				Content: base64.StdEncoding.EncodeToString(j.binary), Encoding: "base64"}}}
			notes = append(notes, fmt.Sprintf("%s (env %s, run %q) with the prepared binary as /box/%s", name, rt.Env, rt.Run, bin))
		case "c-compile":
			req = api.FnRunRequest{Runtime: name, Source: j.source}
			notes = append(notes, fmt.Sprintf("c-compile: runtime c (compile %q, run %q) with Source hello.c", rt.Compile, rt.Run))
		}
		if w.body[j.name], err = json.Marshal(req); err != nil {
			return nil, err
		}
	}
	for job, why := range p.not {
		fmt.Printf("peer warren: job %s left out: %s\n", job, why)
	}
	pid := cfg.warrenPID
	if pid == 0 {
		pid = listenerPID(w.url)
	}
	var cpu string
	p.cpu, cpu = warrenCPU(g, pid, func() string {
		if cfg.warrenCgroup != "" {
			return cfg.warrenCgroup
		}
		if n := w.node.Load(); n != nil {
			return "/warren/" + *n + "/fn"
		}
		return ""
	})
	p.about = fmt.Sprintf("POST %s/v1/fn/run: %s; CPU: %s", w.url, strings.Join(notes, "; "), cpu)
	p.call = w.call
	return p, nil
}

type warren struct {
	url, token string
	hc         *http.Client
	body       map[string][]byte      // job -> request body
	node       atomic.Pointer[string] // the node that answered, for its cgroups
}

func (w *warren) call(ctx context.Context, j *job) (string, error) {
	var res api.FnResult
	if err := w.do(ctx, http.MethodPost, "/v1/fn/run", w.body[j.name], &res); err != nil {
		return "", err
	}
	if res.Node != "" && w.node.Load() == nil {
		w.node.Store(&res.Node)
	}
	if res.Status != api.FnOK || len(res.Cases) != 1 {
		c := res.Compile
		if len(res.Cases) > 0 {
			c = &res.Cases[0]
		}
		if c != nil {
			return "", fmt.Errorf("status %s (%d cases): %s %s", res.Status, len(res.Cases), c.Message, tail([]byte(c.Stderr)))
		}
		return "", fmt.Errorf("status %s, %d cases", res.Status, len(res.Cases))
	}
	out := res.Cases[0].Stdout
	if res.Cases[0].StdoutEncoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(out)
		if err != nil {
			return "", err
		}
		out = string(b)
	}
	return out, nil
}

func (w *warren) do(ctx context.Context, method, p string, body []byte, into any) error {
	req, err := http.NewRequestWithContext(ctx, method, w.url+p, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+w.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := w.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, p, resp.Status, tail(b))
	}
	return json.Unmarshal(b, into)
}

// warrenCPU says how the daemon's CPU is read: the cgroup subtree its
// FnCall containers run in (fnCgroup, known once a call has named the
// node: /warren/<node>/fn) plus the daemon itself: its own cgroup when it
// runs in one (everything it forks is charged there, its FnCall launcher
// included, until moved into a container's), else its utime+stime and its
// launcher's (warren-fninit, a long-lived child). A container's pid 1 joins
// its cgroups first thing after the launcher clones it.
func warrenCPU(g *cpuGroup, pid int, fnCgroup func() string) (func() time.Duration, string) {
	fn := func() time.Duration {
		if cg := fnCgroup(); cg != "" {
			return cgroupCPU(filepath.Join(g.base, cg), g.v2)
		}
		return 0
	}
	desc := "the containers' cgroup " + filepath.Join(g.base, "/warren/<node>/fn")
	if pid <= 0 {
		return fn, desc + "; daemon not found (no local listener on -url's port; pass -warren-pid)"
	}
	own := g.procCgroup(pid)
	if own != "" && own != "/" {
		ownDir := filepath.Join(g.base, own)
		return func() time.Duration {
				cg := fnCgroup()
				if cg != "" && strings.HasPrefix(cg+"/", own+"/") {
					return cgroupCPU(ownDir, g.v2) // the containers are below it
				}
				return cgroupCPU(ownDir, g.v2) + fn()
			},
			fmt.Sprintf("daemon pid %d in cgroup %s, and %s", pid, ownDir, desc)
	}
	return func() time.Duration { return procCPU(pid) + childrenCPU(pid, "warren-fninit") + fn() },
		fmt.Sprintf("daemon pid %d and its launcher (utime+stime), and %s", pid, desc)
}

// listenerPID finds the local process listening on u's port (through
// /proc/net/tcp{,6} and the processes' socket fds), or 0.
func listenerPID(u string) int {
	pu, err := url.Parse(u)
	if err != nil {
		return 0
	}
	port, err := strconv.ParseUint(pu.Port(), 10, 16)
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			// sl local_address rem_address st ... inode (field 9)
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "0A" {
				continue
			}
			_, hexPort, ok := strings.Cut(fs[1], ":")
			if pp, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && pp == port {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
		fh.Close()
	}
	if len(inodes) == 0 {
		return 0
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && inodes[l] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}
