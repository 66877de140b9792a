package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Backend is how the tools reach sandboxd's HTTP API: the one seam between
// the MCP tools and the worker. The same tools run on both transports; only
// the backend differs:
//
//   - InProcess (sandboxd serve's /mcp): the API's own routes, called
//     in-process through an http.Handler. The guard (Host, Origin, token)
//     already ran once on the /mcp request itself, so the routes are given
//     without it; nothing crosses a socket.
//   - Remote (sandboxd mcp, the stdio bridge): a real HTTP client with the
//     bearer token, to a worker's TCP address or unix socket, retrying 429
//     and 503 as the API asks (Retry-After).
type Backend struct {
	client *http.Client
	base   string // scheme://host, no trailing slash
	token  string
	// retries is how many times a 429 or 503 answer is retried (0: never).
	retries int
	// maxWait caps one Retry-After wait; the context bounds them all.
	maxWait time.Duration
	// sleep waits d or until ctx is done (tests shorten it).
	sleep func(ctx context.Context, d time.Duration) error
}

// InProcess is a Backend that serves every call with api, the worker's
// routes without its guard. No retries: a 429 reaches the model at once,
// as a tool error it can act on, instead of holding the /mcp request.
func InProcess(api http.Handler) *Backend {
	return &Backend{
		client: &http.Client{Transport: handlerTransport{api}, CheckRedirect: noRedirects},
		base:   "http://sandboxd.internal",
		sleep:  sleepCtx,
	}
}

// Remote is a Backend that calls a running worker at rawURL: http(s)://HOST:PORT
// or unix:PATH (its worker_socket). token is the worker's worker_token ("" for
// none). 429 and 503 answers are retried up to 5 times, each after the
// answer's Retry-After (at most 30 s).
func Remote(rawURL, token string) (*Backend, error) {
	b := &Backend{token: token, retries: 5, maxWait: 30 * time.Second, sleep: sleepCtx}
	if path, ok := strings.CutPrefix(rawURL, "unix:"); ok {
		path = strings.TrimPrefix(path, "//")
		if path == "" {
			return nil, errors.New("unix: URL without a socket path")
		}
		var d net.Dialer
		b.client = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", path)
			},
		}, CheckRedirect: noRedirects}
		b.base = "http://localhost"
		return b, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("worker URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("worker URL %q: want http://HOST:PORT, https://HOST:PORT or unix:PATH", rawURL)
	}
	b.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), CheckRedirect: noRedirects}
	b.base = u.Scheme + "://" + u.Host
	return b, nil
}

// noRedirects makes a redirect an answer like any other (a non-2xx
// apiError): the API never redirects a call the tools make, and following
// one would reach a route the tool never named (httprouter's cleaned-path
// redirect took ..%2F..%2Fmetrics to /metrics).
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// apiError is a non-2xx answer of the API: its status and message (the
// body's "error", else the body's start).
type apiError struct {
	Status  int
	Code    string // the body's "code", e.g. session_busy
	Message string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("sandboxd answered %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

// maxErrorBody bounds what is read of an error answer; maxForeignError
// what is kept of one that is not the API's JSON error.
const (
	maxErrorBody    = 64 << 10
	maxForeignError = 512
)

// do sends one API call and returns the response for a 2xx answer (the
// caller closes its body) or an *apiError. body is sent as is (nil: none),
// so a retry sends it again.
func (b *Backend) do(ctx context.Context, method, path string, body []byte, header http.Header) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, b.base+path, rd)
		if err != nil {
			return nil, err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		if body != nil && req.Header.Get("Content-Type") == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if b.token != "" {
			req.Header.Set("Authorization", "Bearer "+b.token)
		}
		resp, err := b.client.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		e := readAPIError(resp)
		if attempt >= b.retries || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable) {
			return nil, e
		}
		// 429 (over capacity) and 503 (not ready, draining, a retried
		// execution refused) mean nothing ran: the same request is safe
		// to send again after the wait the worker asks for.
		if err := b.sleep(ctx, b.retryWait(resp.Header.Get("Retry-After"), attempt)); err != nil {
			return nil, e
		}
	}
}

// retryWait is how long to wait before retry attempt+1: the answer's
// Retry-After in seconds, capped at maxWait; without one, 1 s doubled per
// attempt.
func (b *Backend) retryWait(retryAfter string, attempt int) time.Duration {
	d := time.Second << attempt
	if n, err := strconv.Atoi(strings.TrimSpace(retryAfter)); err == nil && n >= 0 {
		d = time.Duration(n) * time.Second
	}
	return min(d, b.maxWait)
}

func readAPIError(resp *http.Response) *apiError {
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &apiError{Status: resp.StatusCode}
	var body struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}
	if json.Unmarshal(data, &body) == nil && body.Error != "" {
		e.Message, e.Code = body.Error, body.Code
	} else {
		// Not the API's error body (a proxy's page, a redirect): its start
		// only, never a page of it to the model.
		e.Message = strings.ToValidUTF8(strings.TrimSpace(string(data[:min(len(data), maxForeignError)])), "\uFFFD")
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	return e
}

// doJSON sends in (nil: no body) as JSON and decodes a 2xx answer into out
// (nil: discarded), reading at most limit bytes of it.
func (b *Backend) doJSON(ctx context.Context, method, path string, in, out any, limit int64) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	resp, err := b.do(ctx, method, path, body, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	lr := &io.LimitedReader{R: resp.Body, N: limit + 1}
	if err := json.NewDecoder(lr).Decode(out); err != nil {
		if lr.N <= 0 {
			return fmt.Errorf("%s %s: answer larger than %d bytes", method, path, limit)
		}
		return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// handlerTransport is an http.RoundTripper that serves each request with
// an http.Handler in-process, streaming the answer through a pipe (an
// execution's answer, artifacts included, is never buffered here).
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	sreq := req.Clone(req.Context())
	sreq.RequestURI = req.URL.RequestURI()
	sreq.Host = "localhost"
	sreq.RemoteAddr = "127.0.0.1:0"
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, started: make(chan struct{})}
	go func() {
		defer func() {
			if v := recover(); v != nil {
				pw.CloseWithError(fmt.Errorf("handler panic: %v", v))
				w.start(http.StatusInternalServerError)
				return
			}
			w.start(http.StatusOK) // a handler that wrote nothing: 200, empty
			pw.Close()
		}()
		t.h.ServeHTTP(w, sreq)
	}()
	// As over a connection, a cancelled request fails its body's reads (not
	// a short, clean answer), and a handler still writing gets an error.
	stop := context.AfterFunc(req.Context(), func() {
		pr.CloseWithError(req.Context().Err())
	})
	select {
	case <-w.started:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	resp := &http.Response{
		Status:        fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)),
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.sent,
		Body:          stopOnClose{pr, stop},
		ContentLength: -1,
		Request:       req,
	}
	if n, err := strconv.ParseInt(w.sent.Get("Content-Length"), 10, 64); err == nil {
		resp.ContentLength = n
	}
	return resp, nil
}

// stopOnClose is an in-process answer's body: closing it also drops the
// request context's watch.
type stopOnClose struct {
	*io.PipeReader
	stop func() bool
}

func (s stopOnClose) Close() error {
	s.stop()
	return s.PipeReader.Close()
}

// pipeWriter is the http.ResponseWriter of an in-process request: the
// status and headers are handed over when the response starts, the body
// flows through the pipe as the handler writes it.
type pipeWriter struct {
	header  http.Header
	pw      *io.PipeWriter
	once    sync.Once
	started chan struct{}
	status  int
	sent    http.Header
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) start(code int) {
	w.once.Do(func() {
		w.status, w.sent = code, w.header.Clone()
		close(w.started)
	})
}

func (w *pipeWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 {
		return // informational: not the response
	}
	w.start(code)
}

func (w *pipeWriter) Write(p []byte) (int, error) {
	w.start(http.StatusOK)
	return w.pw.Write(p)
}

// Flush is a no-op: every Write is already handed to the reader.
func (w *pipeWriter) Flush() {}
