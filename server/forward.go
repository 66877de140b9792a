package server

// Session forwarding (server/README.md, "Session forwarding"): a session
// lives on one worker, and its id names that worker (server/sessionid), so
// any worker can take any session request and pass it to the owner; a
// client needs no affinity. The owner's address comes from server/peers.
//
//   - The request and the answer stream through (httputil.ReverseProxy,
//     flushed as they come: event streams and file bodies are never held
//     whole here).
//   - The owner authenticates the request as any other: the client's own
//     Authorization goes with it. The marker Sandboxd-Forwarded grants
//     nothing; it only stops a forwarded request from being forwarded
//     again (a loop between two workers whose peer lists disagree).
//   - The owner gone for good is 410 owner_gone, said only after the list
//     was read again (a worker's list may be a refresh old); an owner
//     listed but not ready, not known yet, or refusing the connection even
//     after its address was looked up again, is 503 + Retry-After: the
//     client tries again later. The forwarder's own waits are bounded:
//     a 3 s dial, one list of the peers (up to 10 s), a 3 s dial again, so
//     about 16 s at worst before the owner's answer or the refusal.
//   - A session this worker has is served here, whatever its id names (one
//     restored from before a worker_id rename, or an id a client chose
//     before owners existed).
//
// The defences against a request that would be sent elsewhere are
// SECURITY.md case 58; against a forged or stale peer list, case 59.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/peers"
	"github.com/sandboxd/sandboxd/server/sessionid"
)

// ForwardedHeader marks a request a worker forwarded to a session's owner;
// its value is the forwarding worker's worker_id (for logs only).
const ForwardedHeader = "Sandboxd-Forwarded"

// forwardDialTimeout bounds the connection to an owner: an address that no
// longer answers (its node gone) is a 503 within seconds, not a hang.
const forwardDialTimeout = 3 * time.Second

// forwardListTimeout bounds a list of the peers a request asks for (as the
// Kubernetes resolver's own client does).
const forwardListTimeout = 10 * time.Second

// Forwarding outcomes, the label of sandboxd_session_forwards_total.
const (
	fwdProxied     = "proxied"           // the owner answered (any status)
	fwdGone        = "owner_gone"        // 410: no worker has the owner token
	fwdUnavailable = "owner_unavailable" // 503: listed but not ready, or unreachable
	fwdLoop        = "forward_loop"      // 503: a forwarded request for another owner
	fwdFailed      = "failed"            // 502: the exchange with the owner broke before its answer
	fwdCut         = "cut"               // the owner's answer broke midway: the client's is cut
	fwdCancelled   = "cancelled"         // the client left first
)

// forwarder is the server's forwarding state: nil without peers_source.
type forwarder struct {
	peers     peers.Resolver
	transport *http.Transport
	stop      context.CancelFunc // the peer list's refresh loop (kubernetes)
}

// newForwarder builds the peer resolver named by cfg.PeersSource (nil for
// none) and, for kubernetes, starts its refresh loop (Close stops it).
func newForwarder(cfg config.Config, d Deps) (*forwarder, error) {
	f := &forwarder{stop: func() {}}
	switch cfg.PeersSource {
	case "":
		return nil, nil
	case config.PeersStatic:
		st, err := peers.NewStatic(cfg.WorkerID, cfg.Peers)
		if err != nil {
			return nil, err
		}
		f.peers = st
	case config.PeersKubernetes:
		k, err := peers.NewKubernetes(peers.KubeOptions{
			Service: cfg.PeersService, Namespace: cfg.PeersNamespace, Port: cfg.WorkerPort,
			Refresh: time.Duration(cfg.PeersRefresh), Logger: d.Logger,
		})
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(context.Background())
		go k.Run(ctx)
		f.peers, f.stop = k, cancel
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Peers are reached directly, never through an HTTP(S)_PROXY of the
	// worker's environment (the client's token goes to listed peers only:
	// SECURITY.md case 58), and bodies pass as they are (no gzip added and
	// removed on the way).
	tr.Proxy = nil
	tr.DisableCompression = true
	tr.DialContext = (&net.Dialer{Timeout: forwardDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	tr.MaxIdleConnsPerHost = 32
	f.transport = tr
	return f, nil
}

func (f *forwarder) close() {
	if f != nil {
		f.stop()
		f.transport.CloseIdleConnections()
	}
}

// lookup finds the owner's worker. Gone is final for the client (410), so
// it is answered only from a list read now (the resolver spaces them: at
// most one a second); listed says the list was read for this request.
func (f *forwarder) lookup(ctx context.Context, owner string) (a peers.Answer, listed bool) {
	if a = f.peers.Lookup(owner); a.Status != peers.Gone {
		return a, false
	}
	f.refresh(ctx)
	return f.peers.Lookup(owner), true
}

// refresh reads the peer list again, on a context of its own: the list is
// every request's, and a client that leaves must not cut it short (its
// failure would make every owner not listed "unknown" until the next one).
func (f *forwarder) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forwardListTimeout)
	defer cancel()
	f.peers.Refresh(ctx)
}

// forwarding wraps a /v1/sessions/:id… route: a session this worker owns
// or has (or an id that names no owner) is served by h; another owner's
// goes to that owner.
func (s *Server) forwarding(h httprouter.Handle) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
		id := ps.ByName("id")
		owner, ok := sessionid.Owner(id)
		// Only an id by the rule is forwarded (SECURITY.md cases 46 and
		// 58: an id is never more than a name, and it names an owner
		// token, never an address); the local route refuses the rest.
		if !ok || owner == s.owner || s.fwd == nil || !inside.ValidID(id) || s.hasSession(id) {
			h(w, r, ps)
			return
		}
		if by := r.Header.Get(ForwardedHeader); by != "" {
			// Loop defence (SECURITY.md case 58): the forwarder took this
			// worker for the owner (its list is stale, or an address was
			// reused): answering beats passing it on, which could go
			// round for ever. Its list will catch up: 503, not 410.
			s.forwardRefused(w, &apiError{status: http.StatusServiceUnavailable, reason: fwdLoop, code: fwdLoop, retryAfter: "2", msg: fmt.Sprintf(
				"session %s is owned by the worker with owner token %s, not this one (%s, token %s); %s forwarded it here: its list of workers is out of date",
				id, owner, s.cfg.WorkerID, s.owner, clip(by))})
			return
		}
		s.forward(w, r, id, owner)
	}
}

// hasSession: this worker has session id (a cheap lookup, no disk).
func (s *Server) hasSession(id string) bool {
	m, e := s.sessions()
	return e == nil && m.Has(id)
}

// forward passes r to the owner of session id and its answer back.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, id, owner string) {
	a, listed := s.fwd.lookup(r.Context(), owner)
	if a.Status != peers.Ready {
		s.forwardRefused(w, lookupRefusal(id, owner, a))
		return
	}
	u, err := url.Parse(a.Peer.URL)
	if err != nil {
		s.forwardRefused(w, &apiError{status: http.StatusBadGateway, reason: fwdFailed, code: "forward_failed",
			msg: fmt.Sprintf("session %s lives on worker %s, whose address %q cannot be used: %v", id, a.Peer.WorkerID, clip(a.Peer.URL), err)})
		return
	}
	// The owner may answer before it has read the whole body (an event
	// stream's headers come first), and the answer is passed on as it
	// comes: without full duplex, net/http would read and close what is
	// left of the client's body as that answer starts, the transport's
	// read of it would fail, and the transport would close the owner's
	// connection mid-answer (an event stream cut before its first event;
	// TestForwardStreamsWhileTheBodyIsSent). Unsupported (a recorder): no
	// connection to share.
	_ = http.NewResponseController(w).EnableFullDuplex()
	// The client's body, its read deadline paced as a direct upload's
	// (session_files.go): a large one is not cut at read_timeout.
	body := &forwardBody{rc: http.NewResponseController(w), has: r.ContentLength != 0, discard: time.Duration(s.cfg.ReadTimeout)}
	body.r = &paced{r: r.Body, pacer: newPacer(body.setReadDeadline, time.Duration(s.cfg.ReadTimeout))}
	// Before this handler returns, the transport is done with the client's
	// body (it may still be reading it: an owner that answered first):
	// net/http reads the connection next (forwardBody.end).
	defer body.end(w)
	var outcome atomic.Value
	outcome.Store(fwdProxied)
	defer func() {
		if v := recover(); v != nil {
			// The owner's answer broke midway (the proxy panics so that
			// net/http cuts the client's answer: router's PanicHandler).
			if v == http.ErrAbortHandler {
				o := fwdCut
				if r.Context().Err() != nil {
					o = fwdCancelled
				}
				s.metrics.forwards.WithLabelValues(o).Inc()
			}
			panic(v)
		}
	}()
	rp := &httputil.ReverseProxy{
		// httputil's Rewrite drops the hop-by-hop headers and the
		// client's X-Forwarded-*/Forwarded, and sends to the listed
		// address only (SECURITY.md case 58).
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			// The owner's guard accepts localhost: the DNS-rebinding
			// defence is about browsers, and this request comes from this
			// worker's own client, not from a page; the token still
			// authenticates it there (SECURITY.md case 58).
			pr.Out.Host = "localhost"
			pr.Out.Header.Set(ForwardedHeader, s.cfg.WorkerID)
			if pr.Out.Body != nil {
				pr.Out.Body = body
			}
			// An in-process /mcp call reaches the routes without the
			// token, which the guard checked on /mcp itself: the owner
			// gets this worker's own (the same one: the guard admitted
			// nothing else).
			if pr.Out.Header.Get("Authorization") == "" && s.cfg.WorkerToken != "" {
				pr.Out.Header.Set("Authorization", "Bearer "+s.cfg.WorkerToken)
			}
		},
		Transport:     &forwardTransport{s: s, owner: owner, body: body, listed: listed},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var le *lookupError
			var ue *unreachableError
			switch {
			case body.failed() != nil:
				// The client's body broke (too slow for its pace:
				// SECURITY.md case 44; or cut): said as for an upload to
				// this worker, never net/http's empty 200.
				outcome.Store(fwdFailed)
				e := s.uploadError(body.failed())
				s.logReject(e)
				writeAPIError(w, e)
			case r.Context().Err() != nil:
				outcome.Store(fwdCancelled)
			case errors.As(err, &le):
				outcome.Store("")
				s.forwardRefused(w, lookupRefusal(id, owner, le.answer))
			case errors.As(err, &ue):
				outcome.Store("")
				s.forwardRefused(w, &apiError{status: http.StatusServiceUnavailable, reason: fwdUnavailable, code: fwdUnavailable, retryAfter: "2",
					msg: fmt.Sprintf("session %s lives on worker %s, which cannot be reached now (tried twice, its address looked up in between): %v", id, a.Peer.WorkerID, err)})
			default:
				outcome.Store("")
				s.forwardRefused(w, &apiError{status: http.StatusBadGateway, reason: fwdFailed, code: "forward_failed",
					msg: fmt.Sprintf("session %s lives on worker %s; forwarding to it failed: %v", id, a.Peer.WorkerID, err)})
			}
		},
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	rp.ServeHTTP(&rearmWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: time.Duration(s.cfg.WriteTimeout), body: body}, r)
	if o := outcome.Load().(string); o != "" {
		s.metrics.forwards.WithLabelValues(o).Inc()
	}
}

// forwardRefused answers a request that could not be forwarded.
func (s *Server) forwardRefused(w http.ResponseWriter, e *apiError) {
	s.metrics.forwards.WithLabelValues(e.reason).Inc()
	s.logReject(e)
	writeAPIError(w, e)
}

// lookupRefusal is the answer when the owner is not ready or gone.
func lookupRefusal(id, owner string, a peers.Answer) *apiError {
	if a.Status == peers.Gone {
		return &apiError{status: http.StatusGone, reason: fwdGone, code: fwdGone, msg: fmt.Sprintf(
			"session %s lives on the worker with owner token %s, which is gone: %s", id, owner, a.Why)}
	}
	return &apiError{status: http.StatusServiceUnavailable, reason: fwdUnavailable, code: fwdUnavailable, retryAfter: "2", msg: fmt.Sprintf(
		"session %s lives on the worker with owner token %s, which cannot take it now: %s", id, owner, a.Why)}
}

// lookupError: the owner's address was looked up again and it is no
// longer ready (or gone).
type lookupError struct{ answer peers.Answer }

func (e *lookupError) Error() string { return e.answer.Why }

// unreachableError: the owner refused the connection twice.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// isDialError: the connection to the owner was not made, so nothing of
// the request was sent and sending it again is safe.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// forwardTransport sends the forwarded request, and once more when the
// first connection could not be made: the owner's address is looked up
// again first (a restarted pod has a new one), from a list read now
// unless one was read for this request already (listed). Only a request
// of which nothing was sent is sent again (SECURITY.md case 58).
type forwardTransport struct {
	s      *Server
	owner  string
	body   *forwardBody
	listed bool
}

func (t *forwardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f := t.s.fwd
	resp, err := f.transport.RoundTrip(req)
	if err == nil || !isDialError(err) || t.body.n.Load() > 0 || req.Context().Err() != nil {
		return resp, err
	}
	if !t.listed {
		f.refresh(req.Context())
	}
	a := f.peers.Lookup(t.owner)
	if a.Status != peers.Ready {
		return nil, &lookupError{a}
	}
	u, err := url.Parse(a.Peer.URL)
	if err != nil {
		return nil, err
	}
	again := req.Clone(req.Context())
	again.URL.Scheme, again.URL.Host = u.Scheme, u.Host
	resp, err = f.transport.RoundTrip(again)
	if err != nil && isDialError(err) {
		return nil, &unreachableError{err}
	}
	return resp, err
}

// forwardBody is the forwarded request's body: the client's, which the
// transport must not close (a second attempt reads it), counted (only an
// unread body may be sent again), whose end lifts the read deadline as
// decodeBody does (the owner may then take as long as the execution does,
// as when the worker runs it itself: limits.go, deadlines), and whose
// failure is kept for the answer (failed).
//
// It is read by the transport's write loop, which does not stop when the
// owner's answer comes: an owner may answer before it has read the body
// (a 4xx from the headers, or a stream), and the handler may then return
// while that loop is still in r.Body.Read, or about to call it. net/http
// reads the connection itself once the handler has returned, and a read of
// r.Body then is a read of that connection at the same time: "http: panic
// serving …: invalid concurrent Body.Read call" (the connection dropped),
// or the body's remaining bytes read by the wrong reader. So end, before
// the handler returns, stops all reads for good and waits for one under
// way (TestForwardEarlyAnswer).
type forwardBody struct {
	r       io.Reader
	rc      *http.ResponseController
	has     bool          // the request has a body (not Content-Length 0)
	discard time.Duration // read_timeout: how long net/http may drain what is left
	n       atomic.Int64
	eof     atomic.Bool // the client's body was read whole

	mu      sync.Mutex
	err     error // the first error but EOF
	ended   bool  // the handler is returning: no read starts, no deadline moves
	reading bool  // a read of r is under way
	idle    *sync.Cond
}

// errForwardEnded is a read of the client's body once its handler is done.
var errForwardEnded = errors.New("the request is over: its body is no longer read")

func (b *forwardBody) Read(p []byte) (int, error) {
	if b.eof.Load() {
		// Never r.Body again once it said EOF: the transport reads once
		// more to check the length, and net/http's background read of the
		// connection has started (a read of the body now would be one of
		// the connection too).
		return 0, io.EOF
	}
	b.mu.Lock()
	if b.ended {
		b.mu.Unlock()
		return 0, errForwardEnded
	}
	b.reading = true
	b.mu.Unlock()
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reading = false
	switch {
	case err == io.EOF:
		b.eof.Store(true)
		if !b.ended {
			b.rc.SetReadDeadline(time.Time{}) // liftReadDeadline
		}
	case err != nil:
		b.err = cmp.Or(b.err, err)
	}
	if b.idle != nil {
		b.idle.Broadcast()
	}
	return n, err
}

// setReadDeadline is the pacer's: a move once the handler is ending
// would undo end's (and, after the handler, be one of net/http's next
// request).
func (b *forwardBody) setReadDeadline(t time.Time) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return errForwardEnded
	}
	return b.rc.SetReadDeadline(t)
}

// unfinished: the request has a body not read whole yet. An answer that
// starts then closes the connection (rearmWriter.WriteHeader): what is
// left of the body may never be read, and must not be taken for the next
// request; and net/http, with full duplex, does not look for the next one
// safely after a body it had to finish itself (golang/go#68560: its
// finishRequest reads the rest to its end after it stopped the
// connection's background read, that end starts one again, and the read
// of the next request panics; TestForwardBodyLeftUnsent).
func (b *forwardBody) unfinished() bool { return b.has && !b.eof.Load() }

// end stops the reads of the client's body before its handler returns,
// and waits for one under way: a read still blocked on the client is cut
// (the read deadline now). Then, if the body was not read whole, net/http
// drains up to 256 KiB of what is left before it closes the connection
// (so that a client still sending reads the answer, not a reset), within
// read_timeout.
func (b *forwardBody) end(w http.ResponseWriter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended = true
	if !b.unfinished() {
		return
	}
	// No answer written (a client gone): the connection closes too.
	w.Header().Set("Connection", "close")
	if b.reading {
		b.rc.SetReadDeadline(time.Now())
		b.idle = sync.NewCond(&b.mu)
		for b.reading {
			b.idle.Wait()
		}
	}
	b.rc.SetReadDeadline(time.Now().Add(b.discard))
}

// failed is the error that broke the client's body, or nil.
func (b *forwardBody) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *forwardBody) Close() error { return nil } // the server closes the client's body

// rearmWriter re-arms the write deadline at every write of the owner's
// answer, as an event stream of this worker's own does (events.go): a long
// stream through a forwarder is not cut at write_timeout, and a client that
// stops reading still is.
type rearmWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	body    *forwardBody
}

// WriteHeader closes the connection after an answer that starts before
// the client's body was read whole (forwardBody.unfinished).
func (a *rearmWriter) WriteHeader(code int) {
	if code >= 200 && a.body.unfinished() {
		a.Header().Set("Connection", "close")
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *rearmWriter) Write(b []byte) (int, error) {
	a.rc.SetWriteDeadline(time.Now().Add(a.timeout))
	return a.ResponseWriter.Write(b)
}

// Unwrap lets http.NewResponseController (the proxy's flushes) reach the
// connection.
func (a *rearmWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }
