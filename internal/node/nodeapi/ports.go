package nodeapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/httperr"
	"github.com/warrenhq/warren/internal/node"
)

// The routes of a sandbox's ports (api/ports.go), here as on REST v1.
const (
	// PortsPattern is HTTP to a sandbox's port, for every method: the
	// rest of the path and the query go to the sandbox's server.
	PortsPattern = "/v1/sandboxes/{id}/ports/{port}/{path...}"
	// PortsRootPattern is the same with no path: the server's "/".
	PortsRootPattern = "/v1/sandboxes/{id}/ports/{port}"
	// TunnelPattern is a port-forward tunnel: an Upgrade to
	// api.TunnelUpgrade, then raw bytes both ways.
	TunnelPattern = "GET /v1/sandboxes/{id}/portforward/{port}"
)

func (s *Server) portRoutes() {
	h := s.authenticated
	p := newPortProxy(s.log)
	s.mux.Handle(PortsPattern, h(func(w http.ResponseWriter, r *http.Request) error { return s.portHTTP(p, w, r) }))
	s.mux.Handle(PortsRootPattern, h(func(w http.ResponseWriter, r *http.Request) error { return s.portHTTP(p, w, r) }))
	s.mux.Handle(TunnelPattern, h(s.portForward))
}

func pathPort(r *http.Request) (int, error) {
	p, err := api.ParsePort(r.PathValue("port"))
	if err != nil {
		return 0, errdefs.Invalid("%v", err)
	}
	return p, nil
}

// portTarget is the context key of the sandbox port a proxied request
// goes to.
type portTarget struct{}

type target struct {
	id   string
	port int
	dial node.PortDial
}

// portHTTP proxies one request to a sandbox's port. The request is a call
// on the sandbox for as long as it runs (an upgraded one: until its
// connection ends); the connections to the sandbox are kept between
// requests and hold nothing.
func (s *Server) portHTTP(p *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request) error {
	port, err := pathPort(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	dial, done, err := s.agent.Ports(r.Context(), id)
	if err != nil {
		return err
	}
	defer done(nil) // the answer is out: an end meanwhile changes nothing
	ctx := context.WithValue(r.Context(), portTarget{}, target{id: id, port: port, dial: dial})
	p.ServeHTTP(w, r.WithContext(ctx))
	return nil
}

// newPortProxy is the reverse proxy to sandboxes' ports. Its transport
// keys connections by sandbox and port (the URL's host is "<id>:<port>"),
// so one sandbox's kept connections never serve another's requests.
func newPortProxy(log *slog.Logger) *httputil.ReverseProxy {
	t := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			tg, ok := ctx.Value(portTarget{}).(target)
			if !ok {
				return nil, errors.New("no sandbox port to dial")
			}
			return tg.dial(ctx, tg.port)
		},
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true, // bodies pass as the server sent them
		ForceAttemptHTTP2:   false,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			tg := pr.In.Context().Value(portTarget{}).(target)
			port := strconv.Itoa(tg.port)
			path, raw := portPath(pr.In.URL)
			pr.Out.URL = &url.URL{Scheme: "http", Host: tg.id + ":" + port, Path: path, RawPath: raw, RawQuery: pr.In.URL.RawQuery}
			// What a server expects of a browser on the same host; the
			// API's own host means nothing inside the sandbox.
			pr.Out.Host = "localhost:" + port
			// The caller's credentials are warren's (or the node's
			// secret): never the sandbox's to see.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Proxy-Authorization")
		},
		Transport:     t,
		BufferPool:    proxyBufs{},
		FlushInterval: -1, // event streams and long polls pass as they come
		ModifyResponse: func(res *http.Response) error {
			res.Header.Set(api.PortResponseHeader, "1")
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the caller left
			}
			var e *errdefs.Error
			if !errors.As(err, &e) {
				tg, _ := r.Context().Value(portTarget{}).(target)
				err = &errdefs.Error{Kind: errdefs.ErrUnreachable, Code: api.CodePortUnreachable,
					Msg: fmt.Sprintf("sandbox %s port %d did not answer: %v", tg.id, tg.port, err)}
			}
			httperr.Write(w, err)
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// proxyBufs lends the proxy its copy buffers (copyBufs, client.go)
// instead of a new 32 KiB one per answer.
type proxyBufs struct{}

func (proxyBufs) Get() []byte  { return *copyBufs.Get().(*[]byte) }
func (proxyBufs) Put(b []byte) { copyBufs.Put(&b) }

// portPath is the path a ports request names on the sandbox's server:
// what follows /v1/sandboxes/{id}/ports/{port}, escaped as it came, "/"
// if nothing.
func portPath(u *url.URL) (path, raw string) {
	p := u.EscapedPath()
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] == '/' {
			if n++; n == 6 {
				raw = p[i:]
				break
			}
		}
	}
	if raw == "" {
		raw = "/"
	}
	path, err := url.PathUnescape(raw)
	if err != nil {
		return raw, ""
	}
	if path == raw {
		raw = ""
	}
	return path, raw
}

// IsPortsPath reports whether path is HTTP to a sandbox's port
// (PortsPattern, PortsRootPattern): such calls keep their caller's
// headers but credentials, and the sandbox server's answers pass as they
// are, whatever their status.
func IsPortsPath(path string) bool {
	rest, ok := strings.CutPrefix(path, "/v1/sandboxes/")
	if !ok {
		return false
	}
	_, rest, ok = strings.Cut(rest, "/")
	return ok && (rest == "ports" || strings.HasPrefix(rest, "ports/"))
}

// isUpgrade reports whether h asks to switch protocols (WebSocket, or a
// tunnel's tcp).
func isUpgrade(h http.Header) bool {
	return h.Get("Upgrade") != "" && httpguts.HeaderValuesContainsToken(h["Connection"], "upgrade")
}

// portForward opens a tunnel to a sandbox's port: the connection is made
// first, so that an unknown sandbox, a bad port or nothing listening is
// an ordinary error answer; then 101 and bytes both ways until both sides
// closed, each half-close passed on. The tunnel is a call on the sandbox
// while it is open.
func (s *Server) portForward(w http.ResponseWriter, r *http.Request) error {
	port, err := pathPort(r)
	if err != nil {
		return err
	}
	if !isUpgrade(r.Header) || !strings.EqualFold(r.Header.Get("Upgrade"), api.TunnelUpgrade) {
		return errdefs.Invalid("portforward needs Connection: Upgrade and Upgrade: %s", api.TunnelUpgrade)
	}
	id := r.PathValue("id")
	// Not r's context: net/http ends it when the caller half-closes,
	// which it may do as soon as it sent its request (DialPort has a
	// timeout of its own).
	conn, err := s.agent.DialPort(context.WithoutCancel(r.Context()), id, port)
	if err != nil {
		return err
	}
	defer conn.Close()
	cc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return fmt.Errorf("portforward %s:%d: %w", id, port, err)
	}
	defer cc.Close()
	cc.SetDeadline(time.Time{})
	if _, err := io.WriteString(cc, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+api.TunnelUpgrade+"\r\n\r\n"); err != nil {
		return nil
	}
	splice(cc, hijacked(cc, brw), conn, conn)
	return nil
}
