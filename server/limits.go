package server

// What one client can make the worker itself hold, whatever it sends
// (SECURITY.md case 32: slowloris and idle connections holding the worker's
// memory and fds; the request side of case 33):
//
//   - a connection has read_header_timeout to send its headers, read_timeout
//     to send its whole request, idle_timeout between keep-alive requests,
//     and write_timeout to take the response once it is ready;
//   - headers are at most maxHeaderBytes;
//   - at most max_decoding bodies are read and decoded at once, each at most
//     maxBody bytes; the others wait decodeWait for a turn, then get 429;
//   - every client string echoed in an error or a log line goes through clip.

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// maxHeaderBytes bounds a request's headers (net/http's default is 1 MiB per
// connection). No client of this API sends more than a token and a few
// standard headers.
const maxHeaderBytes = 64 << 10

// decodeWait is how long a request waits for a decoding turn before 429. A
// waiting request holds no body buffer (its body is still unread), so
// a short wait absorbs bursts of small requests without holding memory.
const decodeWait = time.Second

// maxEchoBytes caps each client string echoed in an error or a log line.
const maxEchoBytes = 128

// clip returns s as valid UTF-8 of at most maxEchoBytes, with a marker
// saying how long it was: a client string (a field name, id, path, env
// name) echoed in an error or log line cannot make either large.
func clip(s string) string {
	if len(s) <= maxEchoBytes {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	cut := maxEchoBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.ToValidUTF8(s[:cut], "\uFFFD") + fmt.Sprintf("…(%d bytes)", len(s))
}

// decodeSlots bounds the request bodies being read and decoded at once.
type decodeSlots chan struct{}

// acquire takes a decoding turn, waiting at most decodeWait; the returned
// release must be called once the body is decoded and validated.
func (d decodeSlots) acquire(ctx context.Context) (release func(), e *apiError) {
	t := time.NewTimer(decodeWait)
	defer t.Stop()
	select {
	case d <- struct{}{}:
		return func() { <-d }, nil
	case <-t.C:
		return nil, &apiError{status: http.StatusTooManyRequests, reason: "over_capacity", retryAfter: "1",
			msg: fmt.Sprintf("over capacity: max_decoding (%d) request bodies are being received already", cap(d))}
	case <-ctx.Done():
		return nil, &apiError{status: http.StatusServiceUnavailable, reason: "over_capacity", retryAfter: "1",
			msg: "request abandoned while waiting to be decoded"}
	}
}

// HTTPServer returns the http.Server for the API with the configured
// timeouts; serve it on every listener (TCP, and the unix socket from
// ListenUnix). errorLog may be nil.
func (s *Server) HTTPServer(errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: time.Duration(s.cfg.ReadHeaderTimeout),
		ReadTimeout:       time.Duration(s.cfg.ReadTimeout),
		WriteTimeout:      time.Duration(s.cfg.WriteTimeout),
		IdleTimeout:       time.Duration(s.cfg.IdleTimeout),
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       markUnixConn,
		ErrorLog:          errorLog,
	}
}

// deadlines makes read_timeout and write_timeout bound what the client
// does, never how long an execution may run. net/http arms both deadlines
// when a request's headers arrive; left alone, a synchronous POST whose run
// outlasts them would have its context cancelled (the connection's
// background read fails at the read deadline) and its answer dropped (the
// write deadline has passed). So the read deadline is lifted once the body
// is read (here for a request without one, in readBody for the others) and
// the write deadline is re-armed when the response starts.
func (s *Server) deadlines(next http.Handler) http.Handler {
	write := time.Duration(s.cfg.WriteTimeout)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			liftReadDeadline(w)
		}
		next.ServeHTTP(&deadlineWriter{ResponseWriter: w, write: write}, r)
	})
}

// liftReadDeadline clears the connection's read deadline once nothing more
// is read from the client but an EOF telling it left. Unsupported
// (a ResponseRecorder) is fine: there is no connection.
func liftReadDeadline(w http.ResponseWriter) {
	http.NewResponseController(w).SetReadDeadline(time.Time{})
}

// deadlineWriter re-arms the write deadline when the response starts.
type deadlineWriter struct {
	http.ResponseWriter
	write   time.Duration
	started bool
}

func (d *deadlineWriter) start() {
	if !d.started {
		d.started = true
		http.NewResponseController(d.ResponseWriter).SetWriteDeadline(time.Now().Add(d.write))
	}
}

func (d *deadlineWriter) WriteHeader(code int) {
	d.start()
	d.ResponseWriter.WriteHeader(code)
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	d.start()
	return d.ResponseWriter.Write(b)
}

// Unwrap lets http.NewResponseController reach the connection.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// unixConnKey marks the context of a request that came over the unix socket.
type unixConnKey struct{}

func markUnixConn(ctx context.Context, c net.Conn) context.Context {
	if _, ok := c.(*net.UnixConn); ok {
		return context.WithValue(ctx, unixConnKey{}, true)
	}
	return ctx
}

// viaUnixSocket reports whether r came over the unix socket.
func viaUnixSocket(r *http.Request) bool {
	v, _ := r.Context().Value(unixConnKey{}).(bool)
	return v
}
