package server

// The file API of a session's workspace: PUT (streamed to disk), GET
// (Range, ETag, or ?profile=1), DELETE, and a bounded listing. Package
// volume does every open (SECURITY.md case 38: no link followed, nothing
// but a regular file opened, never blocking); this file bounds what a
// client can make the worker hold while it streams (SECURITY.md case 44).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/workspace"
	"golang.org/x/sys/unix"
)

// minStreamRate is the least average rate an upload or a download must
// keep beyond its first read_timeout (write_timeout): its deadline is
// start + that timeout + bytes so far / minStreamRate, moved as bytes
// arrive. An honest client on any real link keeps it; a slow one holds a
// connection (and an upload its turn) no longer than the timeout would
// for a small request (SECURITY.md case 44).
const minStreamRate = 1 << 20 // bytes per second

// maxListLimit bounds ?limit= of a listing.
const maxListLimit = 10_000

// FileInfo is the answer to a PUT.
type FileInfo struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// FileList is the answer to GET /v1/sessions/{id}/files.
type FileList struct {
	Files []volume.Entry `json:"files"`
	// Truncated: more files matched than listed (?limit=), or the walk
	// stopped at its bound.
	Truncated bool `json:"truncated"`
}

// fileError maps the volume's errors (server/volume/README.md). The
// message carries the path, bounded by volume's own echo.
func (s *Server) fileError(err error) *apiError {
	msg := clip(err.Error())
	switch {
	case errors.Is(err, volume.ErrBadPath):
		return badRequest("%s", msg)
	case errors.Is(err, volume.ErrNotFound):
		return &apiError{status: http.StatusNotFound, reason: "not_found", msg: msg}
	case errors.Is(err, volume.ErrNotRegular), errors.Is(err, volume.ErrNotEmpty):
		return &apiError{status: http.StatusConflict, reason: "not_regular", msg: msg}
	case errors.Is(err, volume.ErrQuota):
		// The client's limit: a 4xx, never the 507 of the worker's disk.
		s.metrics.quotaRefusals.Inc()
		return &apiError{status: http.StatusRequestEntityTooLarge, reason: "quota",
			msg: msg + " (the session's workspace is full: delete files first)"}
	}
	return &apiError{status: http.StatusInternalServerError, reason: "sessions", msg: msg}
}

// filePath is the URL's file path: the catch-all's, without its leading
// slash, checked by the one path rule.
func filePath(ps httprouter.Params) (string, *apiError) {
	p := strings.TrimPrefix(ps.ByName("path"), "/")
	if err := volume.CheckPath(p); err != nil {
		return "", badRequest("%s", clip(err.Error()))
	}
	return p, nil
}

// withVolume runs fn with the URL's file path and the session's volume
// lent (a Delete waits for fn, and cancels the lend's context: a transfer
// must end with it; SECURITY.md case 49), or answers why not. The session
// counts as used.
func (s *Server) withVolume(w http.ResponseWriter, ps httprouter.Params, needPath bool, fn func(id, p string, l *session.Lend) *apiError) {
	s.withSession(w, ps, func(id string, m *session.Manager) *apiError {
		var p string
		if needPath {
			var e *apiError
			if p, e = filePath(ps); e != nil {
				return e
			}
		}
		l, err := m.Lend(id)
		if err != nil {
			return sessionError(id, err)
		}
		defer l.Release()
		e := fn(id, p, l)
		if e != nil && l.Ctx.Err() != nil {
			// Cut short by the session's delete (or the drain): say so,
			// not what the cut did to the transfer.
			return sessionError(id, session.ErrNotFound)
		}
		return e
	})
}

// cutOnDelete ends pc's transfer once the lend's context is cancelled;
// call the returned stop when the transfer is over. Once stop returns, the
// connection's deadline is left alone: AfterFunc's own stop does not wait
// for a cut it already started, and that cut, run after the handler
// returned, would set the deadline of the connection's next request (a
// keep-alive connection cut while idle, or mid-way through the next
// upload or answer; TestUnitCutOffAfterStopIsNoOp).
func cutOnDelete(l *session.Lend, pc *pacer) (stop func()) {
	stopCut := context.AfterFunc(l.Ctx, pc.cutOff)
	return func() {
		stopCut()
		pc.end()
	}
}

func (s *Server) handlePutFile(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	s.withVolume(w, ps, true, func(id, p string, l *session.Lend) *apiError {
		if r.ContentLength > s.cfg.SessionMaxBytes {
			s.metrics.quotaRefusals.Inc()
			return &apiError{status: http.StatusRequestEntityTooLarge, reason: "quota", msg: fmt.Sprintf(
				"the file is %d bytes, more than a session's workspace holds (session_max_bytes %d)", r.ContentLength, s.cfg.SessionMaxBytes)}
		}
		release, e := s.uploads.acquire(r.Context())
		if e != nil {
			return e
		}
		defer release()
		body := &paced{r: http.MaxBytesReader(w, r.Body, s.cfg.SessionMaxBytes),
			pacer: newPacer(http.NewResponseController(w).SetReadDeadline, time.Duration(s.cfg.ReadTimeout))}
		stop := cutOnDelete(l, &body.pacer)
		size, sum, err := l.Volume.Put(p, body)
		stop()
		if err != nil {
			return s.uploadError(err)
		}
		// Nothing more is read from this client.
		liftReadDeadline(w)
		s.log.Info("session file written", "session_id", id, "path", clip(p), "size", size)
		w.Header().Set("ETag", `"`+sum+`"`)
		writeJSON(w, http.StatusOK, FileInfo{Path: p, Size: size, SHA256: sum})
		return nil
	})
}

// uploadError tells what cut an upload short: the quota, the client's
// pace, or the client itself. Nothing of it is left in the volume (Put).
func (s *Server) uploadError(err error) *apiError {
	var tooBig *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &tooBig):
		s.metrics.quotaRefusals.Inc()
		return &apiError{status: http.StatusRequestEntityTooLarge, reason: "quota", msg: fmt.Sprintf(
			"the file is more than a session's workspace holds (session_max_bytes %d); nothing was written", tooBig.Limit)}
	case errors.As(err, &netErr) && netErr.Timeout():
		return &apiError{status: http.StatusRequestTimeout, reason: "timeout", msg: fmt.Sprintf(
			"upload too slow: it must average %d bytes/s beyond its first read_timeout (%s); nothing was written",
			minStreamRate, time.Duration(s.cfg.ReadTimeout))}
	case errors.Is(err, volume.ErrBadPath), errors.Is(err, volume.ErrNotFound), errors.Is(err, volume.ErrNotRegular),
		errors.Is(err, volume.ErrNotEmpty), errors.Is(err, volume.ErrQuota):
		return s.fileError(err)
	case errors.Is(err, io.ErrUnexpectedEOF), strings.Contains(err.Error(), "read upload"):
		return badRequest("upload incomplete (%s); nothing was written", clip(err.Error()))
	}
	return s.fileError(err)
}

// pacer moves one of a connection's deadlines (read or write) as a
// transfer goes: start + grace + bytes so far / minStreamRate, so a large
// transfer is not cut at the first timeout and a slow one is (SECURITY.md
// case 44). cutOff ends the transfer for good (the session is being
// deleted: SECURITY.md case 49): the deadline is now, and never moved
// again, so a blocked read or write returns at once. end (the transfer is
// over) makes a later cutOff do nothing.
type pacer struct {
	set   func(time.Time) error // http.ResponseController's SetReadDeadline or SetWriteDeadline
	start time.Time
	grace time.Duration

	mu    sync.Mutex // orders the moves, the cut and the end
	cut   bool
	ended bool  // the transfer is over: no cut any more (cutOnDelete)
	moved int64 // bytes at the last move
}

// errCut is a transfer's error once cut off.
var errCut = errors.New("transfer cut off: the session is being deleted")

func newPacer(set func(time.Time) error, grace time.Duration) pacer {
	return pacer{set: set, start: time.Now(), grace: grace}
}

// pace moves the deadline for a transfer of n bytes so far (every 256 KiB),
// or says it was cut off.
func (p *pacer) pace(n int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return errCut
	}
	if n-p.moved >= 256<<10 || p.moved == 0 {
		p.moved = max(n, 1)
		p.set(p.start.Add(p.grace + time.Duration(n)*time.Second/minStreamRate))
	}
	return nil
}

func (p *pacer) cutOff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.cut = true
	p.set(time.Now())
}

// end makes a later cutOff do nothing; a cut under way is done when it
// returns (the mutex).
func (p *pacer) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended = true
}

// paced reads an upload, pacing the connection's read deadline.
type paced struct {
	r io.Reader
	pacer
	n int64
}

func (p *paced) Read(b []byte) (int, error) {
	if err := p.pace(p.n + int64(len(b))); err != nil {
		return 0, err
	}
	n, err := p.r.Read(b)
	p.n += int64(n)
	return n, err
}

// pacedWriter writes a download, pacing the connection's write deadline.
type pacedWriter struct {
	http.ResponseWriter
	pacer
	n int64
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	if err := p.pace(p.n + int64(len(b))); err != nil {
		return 0, err
	}
	n, err := p.ResponseWriter.Write(b)
	p.n += int64(n)
	return n, err
}

func (p *pacedWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

func (s *Server) handleGetFile(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	if r.URL.Query().Has("profile") {
		s.handleProfile(w, r, ps)
		return
	}
	s.withVolume(w, ps, true, func(id, p string, l *session.Lend) *apiError {
		f, fi, err := l.Volume.OpenFile(p)
		if err != nil {
			return s.fileError(err)
		}
		defer f.Close()
		sum, err := s.etags.sum(f)
		if err != nil {
			return &apiError{status: http.StatusInternalServerError, reason: "sessions", msg: clip(fmt.Sprintf("%s: %v", p, err))}
		}
		h := w.Header()
		h.Set("ETag", `"`+sum+`"`)
		h.Set("Content-Type", workspace.MediaType(p))
		h.Set("X-Content-Type-Options", "nosniff")
		// The code wrote it: never rendered as a page (svg, html).
		h.Set("Content-Disposition", "attachment")
		h.Set("Content-Security-Policy", "sandbox")
		h.Set("Cache-Control", "no-cache")
		pw := &pacedWriter{ResponseWriter: w, pacer: newPacer(http.NewResponseController(w).SetWriteDeadline, time.Duration(s.cfg.WriteTimeout))}
		stop := cutOnDelete(l, &pw.pacer)
		defer stop()
		http.ServeContent(pw, r, "", fi.ModTime(), f)
		return nil
	})
}

func (s *Server) handleDeleteFile(w http.ResponseWriter, _ *http.Request, ps httprouter.Params) {
	s.withVolume(w, ps, true, func(id, p string, l *session.Lend) *apiError {
		if err := l.Volume.Delete(p); err != nil {
			return s.fileError(err)
		}
		s.log.Info("session file deleted", "session_id", id, "path", clip(p))
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) handleListFiles(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	s.withVolume(w, ps, false, func(_, _ string, l *session.Lend) *apiError {
		q := r.URL.Query()
		limit := volume.DefaultListLimit
		if l := q.Get("limit"); l != "" {
			n, err := strconv.Atoi(l)
			if err != nil || n < 1 || n > maxListLimit {
				return badRequest("limit must be in 1..%d, got: %q", maxListLimit, clip(l))
			}
			limit = n
		}
		files, truncated, err := l.Volume.List(q.Get("prefix"), limit)
		if err != nil {
			return s.fileError(err)
		}
		writeJSON(w, http.StatusOK, FileList{Files: files, Truncated: truncated})
		return nil
	})
}

// etagCache keeps the SHA-256 of files served, by their stamp (device,
// inode, size, mtime, ctime), so a file fetched again, or by ranges, is not
// read whole again for its ETag. Only stamps at least a second old are
// kept: a write within the clock tick of the stamp could otherwise leave
// it unchanged.
type etagCache struct {
	mu   sync.Mutex
	sums map[etagKey]string
}

type etagKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

const maxETags = 1024

func (c *etagCache) sum(f *os.File) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", err
	}
	key := etagKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
	c.mu.Lock()
	sum, ok := c.sums[key]
	c.mu.Unlock()
	if ok {
		return sum, nil
	}
	sum, err := volume.SHA256(f)
	if err != nil {
		return "", err
	}
	if time.Since(time.Unix(st.Ctim.Unix())) > time.Second {
		c.mu.Lock()
		if c.sums == nil || len(c.sums) >= maxETags {
			c.sums = map[etagKey]string{}
		}
		c.sums[key] = sum
		c.mu.Unlock()
	}
	return sum, nil
}
