package httperr

import (
	"io"
	"log/slog"
	"net/http"
)

// Stream runs fn with a writer that sends w's headers on its first write.
// An error before that is returned, so the caller can still answer with a
// proper error (headers set for the body, such as Content-Length, are
// dropped first). An error after it can only cut the stream: it is logged
// and the connection aborted, which the client sees as a short body (a tar
// then lacks its end marker).
func Stream(w http.ResponseWriter, log *slog.Logger, fn func(io.Writer) error) error {
	cw := &commitWriter{w: w}
	err := fn(cw)
	if err == nil {
		if !cw.committed {
			w.WriteHeader(http.StatusOK)
		}
		return nil
	}
	if !cw.committed {
		w.Header().Del("Content-Length")
		w.Header().Del("X-Warren-File-Mode")
		return err
	}
	log.Warn("stream cut short", "err", err)
	panic(http.ErrAbortHandler)
}

type commitWriter struct {
	w         http.ResponseWriter
	committed bool
}

func (c *commitWriter) Write(p []byte) (int, error) {
	c.committed = true
	return c.w.Write(p)
}
