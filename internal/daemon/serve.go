package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// httpServer serves one handler in the background; every role has one.
type httpServer struct {
	srv  *http.Server
	errc chan error // the Serve error, if it ends on its own
}

func startHTTP(ln net.Listener, h http.Handler) *httpServer {
	s := &httpServer{
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		errc: make(chan error, 1),
	}
	go func() { s.errc <- s.srv.Serve(ln) }()
	return s
}

// wait blocks until ctx ends, then shuts down gracefully (5 s for calls in
// flight), or until the server fails.
func (s *httpServer) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case err := <-s.errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
