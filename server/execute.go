package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/results"
	"github.com/sandboxd/sandboxd/server/runner"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/stream"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// CodePath is where the request's code is inside the sandbox.
var CodePath = inside.Path(inside.CodeFile)

// Artifact and Omitted are the answer's artifacts and what was left out of
// them, as package workspace collects them.
type (
	Artifact = workspace.Artifact
	Omitted  = workspace.Omitted
)

// ExecutionRequest is the body of POST /v1/executions.
type ExecutionRequest struct {
	ID        string            `json:"id,omitempty"`
	Type      string            `json:"type,omitempty"`
	Runtime   string            `json:"runtime,omitempty"` // a name of the config's runtimes (default: the policy's)
	Code      string            `json:"code"`
	Input     json.RawMessage   `json:"input,omitempty"`
	Files     []File            `json:"files,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// DisplayLastExpression answers the value of the code's final
	// expression in `display` (as a notebook shows it).
	DisplayLastExpression bool `json:"display_last_expression,omitempty"`
	// CaptureFigures (default true) returns the pyplot figures the code
	// leaves open or shows as artifacts figure-N.png.
	CaptureFigures *bool `json:"capture_figures,omitempty"`
}

// ExecutionResponse is the result of one execution.
type ExecutionResponse struct {
	ID              string  `json:"id"`
	Type            string  `json:"type"`
	Runtime         string  `json:"runtime"`
	Status          string  `json:"status"`
	ExitCode        int     `json:"exit_code"`
	Signal          *string `json:"signal"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
	// StdoutOmittedBytes and StderrOmittedBytes count what the cap cut
	// between the head and the tail that Stdout and Stderr keep.
	StdoutOmittedBytes int64           `json:"stdout_omitted_bytes"`
	StderrOmittedBytes int64           `json:"stderr_omitted_bytes"`
	Result             json.RawMessage `json:"result"`
	ResultError        *string         `json:"result_error"`
	Artifacts          []Artifact      `json:"artifacts"`
	ArtifactsOmitted   []Omitted       `json:"artifacts_omitted"`
	LimitsHit          []string        `json:"limits_hit"`
	Usage              nsjail.Usage    `json:"usage"`
	StartedAt          time.Time       `json:"started_at"`
	FinishedAt         time.Time       `json:"finished_at"`
	DurationMS         int64           `json:"duration_ms"`
	Policy             Policy          `json:"policy"`
	// Error is a message explaining sandbox_error, cancelled or
	// interrupted (our side), or the typed error of code that raised
	// (status failed only).
	Error *ExecError `json:"error,omitempty"`
	// Display is the value of the code's final expression, when asked
	// (always in a session): at most one entry.
	Display []runner.Display `json:"display"`
	// Session is a session's execution's: what happened to the Python
	// state (POST /v1/sessions/{id}/executions).
	Session *session.ExecInfo `json:"session,omitempty"`
}

// ExecError is the answer's `error`: a JSON string, the message of our
// side's failure (sandbox_error, cancelled, interrupted), or a JSON object,
// the typed error of code that raised (runner.Error). One field, as the
// clients read it (server/mcp, tools/clients/python).
type ExecError struct {
	Message string
	Code    *runner.Error
}

// errorMessage is an ExecError of our side's failure.
func errorMessage(msg string) *ExecError { return &ExecError{Message: msg} }

// String is the message, or the typed error's last line ("" for nil).
func (e *ExecError) String() string {
	switch {
	case e == nil:
		return ""
	case e.Code != nil:
		return e.Code.Type + ": " + e.Code.Message
	}
	return e.Message
}

func (e ExecError) MarshalJSON() ([]byte, error) {
	if e.Code != nil {
		return json.Marshal(e.Code)
	}
	return json.Marshal(e.Message)
}

func (e *ExecError) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '{' {
		e.Code = new(runner.Error)
		return json.Unmarshal(b, e.Code)
	}
	return json.Unmarshal(b, &e.Message)
}

// apiError is a refusal with its HTTP status; reason labels the metric;
// code, when set, is the answer's errorBody.Code.
type apiError struct {
	status     int
	reason     string
	msg        string
	retryAfter string
	code       string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, reason: "bad_request", msg: fmt.Sprintf(format, a...)}
}

func newID() string {
	var b [10]byte
	rand.Read(b[:])
	return "ex-" + hex.EncodeToString(b[:])
}

// newRunName names one run: its sandbox (container, cgroup, state), its
// workspace and its files in the result store. It is never the client's id,
// so an id reused right after its result expired cannot meet a sandbox or
// files of the previous run still being removed.
func newRunName() string {
	var b [10]byte
	rand.Read(b[:])
	return "run-" + hex.EncodeToString(b[:])
}

// plan is a validated request, ready to run.
type plan struct {
	id      string
	run     string // newRunName
	hash    string // requestHash of the request
	policy  Policy
	runtime string // the runtime's name (runtimeFor)
	code    string
	input   []byte
	files   []workspace.File
	env     []string          // the whole environment (a sandbox's)
	extra   map[string]string // the request's env (a kernel's execution)
	session string            // a session's execution: its session id
	// hub gets the execution's live events (registered when its id is
	// claimed); accepted is closed once the execution goes ahead
	// (execution.accept), when an answer that does not wait for it can be
	// given (events, 202).
	hub      *stream.Hub
	accepted chan struct{}
	detached bool // answered at accept (events, 202): answerDetached
	// display and figures are the runner's (display_last_expression,
	// capture_figures).
	display, figures bool
}

// validate turns a request into a plan, or says why not. Nothing is started
// and nothing is written before it succeeds.
func (s *Server) validate(req *ExecutionRequest) (*plan, *apiError) {
	p, e := s.newPlan(req.ID, requestHash(req))
	if e != nil {
		return nil, e
	}
	pol, err := s.policies.Apply(req.Type, req.TimeoutMS)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	if p.runtime, e = s.runtimeFor(pol, req.Runtime); e != nil {
		return nil, e
	}
	if len(req.Input) > 0 && string(req.Input) != "null" {
		p.input = req.Input
	}
	if e := s.checkRun(p, pol, req.Code, p.input, req.Files, req.Env); e != nil {
		return nil, e
	}
	p.display, p.figures = req.DisplayLastExpression, req.CaptureFigures == nil || *req.CaptureFigures
	return p, nil
}

// newPlan starts a plan: the client's id, checked, or a new one.
func (s *Server) newPlan(id, hash string) (*plan, *apiError) {
	p := &plan{id: id, run: newRunName(), hash: hash, hub: s.streams.NewHub(), accepted: make(chan struct{})}
	if p.id == "" {
		p.id = newID()
	} else if !inside.ValidID(p.id) {
		// The sandbox id rule, so a client id is usable as is.
		return nil, badRequest("id %q is invalid: want %s", clip(p.id), inside.IDRule)
	}
	return p, nil
}

// checkRun checks what every execution has, its code, files and env,
// against the limits and the policy pol, and fills p with them.
func (s *Server) checkRun(p *plan, pol Policy, code string, input []byte, files []File, env map[string]string) *apiError {
	p.policy, p.code = pol, code
	if strings.TrimSpace(code) == "" {
		return badRequest("code is required")
	}
	if int64(len(code)) > s.cfg.MaxCodeBytes {
		return &apiError{status: http.StatusRequestEntityTooLarge, reason: "too_large",
			msg: fmt.Sprintf("code is %d bytes, more than max_code_bytes (%d)", len(code), s.cfg.MaxCodeBytes)}
	}
	decoded, total, err := decodeFiles(files, s.cfg.MaxInputFiles)
	if errors.Is(err, errTooManyFiles) {
		return &apiError{status: http.StatusRequestEntityTooLarge, reason: "too_large", msg: err.Error()}
	}
	if err != nil {
		return badRequest("%v", err)
	}
	p.files = decoded
	if total += int64(len(input)); total > s.cfg.MaxInputBytes {
		return &apiError{status: http.StatusRequestEntityTooLarge, reason: "too_large",
			msg: fmt.Sprintf("input and files are %d bytes, more than max_input_bytes (%d)", total, s.cfg.MaxInputBytes)}
	}
	allowed := map[string]bool{}
	for _, n := range s.cfg.AllowedEnv {
		allowed[n] = true
	}
	for k, v := range env {
		if !allowed[k] {
			return badRequest("env %q is not allowed: allowed names are %v", clip(k), s.cfg.AllowedEnv)
		}
		if strings.ContainsRune(v, 0) {
			return badRequest("env %q contains a NUL byte", clip(k))
		}
	}
	p.env, p.extra = pol.Env(env), env
	return nil
}

// idTaken: executeNew lost the race for the id to another request.
var idTaken = &apiError{status: http.StatusConflict, reason: "conflict", msg: "id taken"}

// execute answers a validated request: with the stored answer of the
// execution that has its id when it is the same request (a retry; the code
// does not run twice), with 409 when it is another, else by running it.
// run is the context of a run (cancelled by the client, DELETE or the
// drain); wait ends a retry's wait for another request's run (the client
// left). The answer is opened in the result store, to be streamed.
func (s *Server) execute(run, wait context.Context, p *plan) (*results.Reader, *apiError) {
	for {
		if rd, e, found := s.existing(wait, p); found {
			return rd, e
		}
		_, rd, e := s.executeNew(run, p)
		if e != idTaken {
			return rd, e
		}
	}
}

// executeNew runs a validated request end to end: admission, workspace (a
// session's volume for a session's execution), sandbox, output
// collection, the stored answer, cleanup. It returns only once the
// workspace is gone. The context cancels the run (client gone, DELETE,
// drain).
func (s *Server) executeNew(ctx context.Context, p *plan) (*ExecutionResponse, *results.Reader, *apiError) {
	if p.session != "" {
		return s.executeInSession(ctx, p)
	}
	rootfs, python, e := s.runtimeOr503(p.runtime)
	if e != nil {
		return nil, nil, e
	}
	ctx, x, e := s.admit(ctx, p, nil)
	if e != nil {
		return nil, nil, e
	}
	defer x.done()
	x.accept()
	if !x.wait(ctx) {
		return x.finish()
	}
	log := x.log
	evR, evW, err := runner.Pipe()
	if err != nil {
		log.Error("events pipe failed", "err", err)
		return nil, nil, x.refuse(&apiError{status: http.StatusInternalServerError, reason: "sandbox", msg: err.Error()})
	}
	events := runner.NewReader(evR, runner.Want{Display: p.display, Figures: p.figures, Done: true}, p.runnerEvent)
	spec := s.spec(p, rootfs, python, "", evW, events.Done())
	spec.Logger = log // execution_id and policy on the sandbox's lines too
	spec.Output = p.hub.Output
	// Removal (lazy unmounts, whose RCU waits cost milliseconds) happens
	// after the response; Drain waits for it.
	var remove []string
	s.cleanups.Add(1)
	defer func() {
		go func() {
			defer s.cleanups.Done()
			for _, dir := range remove {
				if err := workspace.Remove(dir); err != nil {
					log.Error("workspace removal failed", "dir", dir, "err", err)
				}
			}
		}()
	}()
	req := workspace.Request{Code: p.code, Input: p.input, Files: p.files}
	// The plan lets the request's bytes go; req keeps them until they are
	// in the workspace that runs, a warm run until it ends (see run and
	// server/README.md, "Admitted requests").
	p.code, p.input, p.files = "", nil, nil
	res, outputs, e := s.run(ctx, x, spec, &req, &remove)
	evW.Close()
	ev := events.Stop()
	if e != nil {
		return nil, nil, x.refuse(e)
	}
	if res == nil {
		return x.finish() // the spec was refused: x.resp says why
	}
	s.fill(x.resp, res, ev, outputs, nil, x.saveArtifact, log)
	return x.finish()
}

// run runs spec with *req written into its workspace: a warm sandbox's own
// when the pool has one for it (warmpool.Claim: no workspace of the
// request's own, no copy), else a fresh one (createWorkspace), which also
// serves when the warm sandbox is found dead at its hand-off. It drops
// *req once the request is in the workspace that runs, and adds every
// workspace to *remove. outputs holds what the code left in /workspace.
// An apiError means nothing ran and nothing is to run (the workspace could
// not be made); a nil res with no apiError means the sandbox refused the
// spec, said in x.resp.
func (s *Server) run(ctx context.Context, x *execution, spec nsjail.Spec, req *workspace.Request, remove *[]string) (res *nsjail.Result, outputs string, e *apiError) {
	log := x.log
	o := workspace.Options{Bytes: s.cfg.WorkspaceBytes, Inodes: s.cfg.WorkspaceInodes, UID: s.sandbox.HostUID(), GID: s.sandbox.HostGID()}
	s.mu.Lock()
	pool := s.pool
	s.mu.Unlock()
	// A request already cancelled (its client gone while it queued) takes
	// no warm sandbox: it would be killed before its hand-off is read and
	// counted as found dead.
	if pool != nil && ctx.Err() == nil {
		if c := pool.Claim(ctx, spec, req.Code); c != nil {
			if err := workspace.Write(c.Workspace(), o, *req); err != nil {
				// As a cold workspace's would (ErrFull among them): the
				// cold path below says so.
				log.Warn("unable to write the request into a warm sandbox's workspace; running cold", "err", err)
				c.Release()
			} else {
				log.Info("sandbox starting")
				x.started = true
				res, delivered, err := c.Run(ctx, spec)
				if err != nil || delivered {
					*req = workspace.Request{}
				}
				if delivered {
					*remove = append(*remove, c.Workspace()) // else the pool removes it
				}
				if err != nil {
					refusedSpec(x, err)
					return nil, "", nil
				}
				if delivered {
					x.ended = res.Ended
					return res, c.Workspace(), nil
				}
				// Dead at hand-off: nothing ran; cold, below.
			}
		}
	}
	ws, err := s.createWorkspace(s.cfg.WorkRoot, x.p.run, o, *req)
	if err != nil {
		log.Error("workspace failed", "err", err)
		if errors.Is(err, workspace.ErrFull) {
			return nil, "", &apiError{status: http.StatusInsufficientStorage, reason: "disk_full", msg: err.Error(), retryAfter: "5"}
		}
		return nil, "", &apiError{status: http.StatusInternalServerError, reason: "workspace", msg: err.Error()}
	}
	*req = workspace.Request{}
	*remove = append(*remove, ws.Dir)
	spec.Workspace = ws.Dir
	log.Info("sandbox starting")
	x.started = true
	res, err = s.sandbox.Run(ctx, spec)
	if err != nil {
		refusedSpec(x, err)
		return nil, "", nil
	}
	x.ended = res.Ended
	return res, ws.Dir, nil
}

// refusedSpec says in x's answer that the sandbox refused the spec before
// anything started: our bug, not the caller's.
func refusedSpec(x *execution, err error) {
	x.log.Error("sandbox refused the spec", "err", err)
	x.resp.Status = string(nsjail.StatusSandboxError)
	x.resp.Error = errorMessage(err.Error())
}

// readyOr503 is ready, its error as the API answers it.
func (s *Server) readyOr503() *apiError {
	if err := s.ready(); err != nil {
		return &apiError{status: http.StatusServiceUnavailable, reason: "not_ready", msg: "not ready: " + err.Error(), retryAfter: "5"}
	}
	return nil
}

// execution is one execution from its admission to its stored answer: what
// single-shot and session executions share.
type execution struct {
	s        *Server
	p        *plan
	log      *slog.Logger
	rec      *record
	ticket   *Ticket
	cancel   context.CancelFunc
	admitted time.Time
	resp     *ExecutionResponse
	// started: the sandbox was asked to run the code, so the id must stay
	// taken whatever happens (a retry must not run it again).
	started bool
	// ended, when not nil, closes once the sandbox that answered on its
	// done word is gone (nsjail.Result.Ended): done keeps the slot till then.
	ended <-chan struct{}
}

// admit registers the execution (refused while draining), claims its id
// in the live table and the result store, runs reserve when it is not nil
// (a session's reservation: refused before a slot is taken, so that a busy
// session is 409 session_busy, not 429, when its own running execution
// holds the last slot), and reserves its admission ticket. The returned
// context is cancelled by DELETE and the drain. On success the caller must
// call done once the run is over.
func (s *Server) admit(ctx context.Context, p *plan, reserve func() *apiError) (context.Context, *execution, *apiError) {
	x := &execution{s: s, p: p, log: s.log.With("execution_id", p.id, "run", p.run, "policy", p.policy.Name, "runtime", p.runtime)}
	if p.session != "" {
		x.log = x.log.With("session_id", p.session)
	}
	if !s.enter() {
		return nil, nil, &apiError{status: http.StatusServiceUnavailable, reason: "draining", msg: "shutting down: not accepting executions"}
	}
	ctx, x.cancel = context.WithCancel(ctx)
	rec, err := s.claim(p, x.cancel)
	if err != nil {
		x.cancel()
		s.inFlight.Done()
		if errors.Is(err, errIDTaken) {
			return nil, nil, idTaken
		}
		x.log.Error("recording the execution failed", "err", err)
		return nil, nil, storeError(err)
	}
	x.rec = rec
	if reserve != nil {
		if e := reserve(); e != nil {
			x.cancel()
			s.inFlight.Done()
			return nil, nil, x.refuse(e)
		}
	}
	ticket, err := s.admission.Reserve()
	if err != nil {
		s.forget(rec)
		x.cancel()
		s.inFlight.Done()
		return nil, nil, &apiError{status: http.StatusTooManyRequests, reason: "over_capacity", msg: err.Error(), retryAfter: "1"}
	}
	x.ticket = ticket
	x.admitted = time.Now()
	x.log.Info("execution admitted", "timeout_ms", p.policy.TimeoutMS)
	x.resp = &ExecutionResponse{ID: p.id, Type: p.policy.Name, Runtime: p.runtime, Policy: p.policy,
		Artifacts: []Artifact{}, ArtifactsOmitted: []Omitted{}, LimitsHit: []string{}, Display: []runner.Display{}}
	return ctx, x, nil
}

// done gives back what admit took: the slot, the context, the drain's
// count. A sandbox answered on its done word still holds its memory until
// its kill and teardown, after the answer: its slot is given back only
// then, so that max_concurrent bounds the sandboxes alive, not only the
// executions being answered.
func (x *execution) done() {
	if x.ended == nil {
		x.ticket.Release()
	} else {
		go func(t *Ticket, ended <-chan struct{}) {
			<-ended
			t.Release()
		}(x.ticket, x.ended)
	}
	x.cancel()
	x.s.inFlight.Done()
}

// wait waits for a slot; false when the wait was cancelled (the answer is
// then "cancelled": finish it).
func (x *execution) wait(ctx context.Context) bool {
	if err := x.ticket.Wait(ctx); err != nil {
		x.resp.Status = string(nsjail.StatusCancelled)
		x.resp.Error = errorMessage("cancelled while queued")
		return false
	}
	x.s.live.setRunning(x.rec)
	return true
}

// accept says the execution goes ahead: admitted, and in a session the
// session reserved. What may still refuse it (a full work root, the
// session's quota, its kernel's start) comes after the queue; a client
// answered at accept (202, or its event stream started) learns it from
// the execution's events (refuse).
func (x *execution) accept() { close(x.p.accepted) }

// refuse ends an execution refused before its code ran: its id is free
// again, and the client gets e. Its events end with e; they are kept a
// while (and GET answers e) when its client was answered already (a
// detached answer), else forgotten at once, as the execution is.
func (x *execution) refuse(e *apiError) *apiError {
	body, _ := json.Marshal(errorBody{Error: e.msg, Code: e.code})
	x.rec.hub.Refuse(e.status, body) // before forget's Finish
	x.s.forget(x.rec)
	if x.p.detached {
		x.s.streams.Refuse(x.p.id, x.rec.hub, e.status, body)
	}
	return e
}

// saveArtifact stores the i-th artifact's content in the result store.
func (x *execution) saveArtifact(i int, r io.Reader) (int64, error) {
	f, err := x.s.results.CreatePart(x.p.id, i)
	if err != nil {
		x.log.Error("storing an artifact failed", "err", err)
		return 0, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		x.log.Error("storing an artifact failed", "err", err)
	}
	return n, err
}

// finish stores the answer and takes the execution out of the live table
// (stored first: a lookup finds one or the other), and opens the answer to
// be streamed.
func (x *execution) finish() (*ExecutionResponse, *results.Reader, *apiError) {
	s, p, log, resp := x.s, x.p, x.log, x.resp
	if resp.StartedAt.IsZero() {
		resp.StartedAt = x.admitted
	}
	if resp.FinishedAt.IsZero() {
		resp.FinishedAt = time.Now()
	}
	resp.DurationMS = resp.FinishedAt.Sub(resp.StartedAt).Milliseconds()
	s.metrics.executions.WithLabelValues(resp.Type, resp.Status).Inc()
	s.metrics.duration.WithLabelValues(resp.Type).Observe(time.Since(x.admitted).Seconds())
	text, holes := storedDocument(resp)
	rd, err := s.results.Finish(p.id, text, holes)
	if err != nil && x.started {
		// The code ran: the id must stay taken, or a retry of this
		// request would run it again. A small answer without
		// artifacts, kept in the database, may still be stored.
		log.Error("storing the result failed; storing a sandbox_error answer instead", "status", resp.Status, "err", err)
		resp = unstoredResponse(resp, err)
		text, _ = storedDocument(resp)
		rd, err = s.results.Finish(p.id, text, nil)
	}
	if err != nil {
		log.Error("storing the result failed", "status", resp.Status, "err", err)
		e := storeError(err)
		e.msg = fmt.Sprintf("execution %q ended (%s) but its result could not be stored: %s", p.id, resp.Status, e.msg)
		if x.started {
			// Still pending in the store: the id stays taken, and
			// the next worker answers it interrupted.
			s.live.remove(x.rec)
			s.streams.Finish(p.id, x.rec.hub)
		} else {
			s.forget(x.rec)
		}
		return nil, nil, e
	}
	// The result event's clients open the stored answer: stored first,
	// and out of the live table before the event, or a GET sent on the
	// event could still be answered "running".
	s.live.remove(x.rec)
	s.streams.Finish(p.id, x.rec.hub)
	log.Info("execution finished", "status", resp.Status, "exit_code", resp.ExitCode,
		"duration_ms", resp.DurationMS, "limits_hit", resp.LimitsHit, "artifacts", len(resp.Artifacts),
		"artifacts_omitted", len(resp.ArtifactsOmitted))
	return resp, rd, nil
}

// unstoredResponse is the answer kept when resp, of an execution that ran,
// could not be stored: a small sandbox_error without its output.
func unstoredResponse(resp *ExecutionResponse, err error) *ExecutionResponse {
	return &ExecutionResponse{ID: resp.ID, Type: resp.Type, Runtime: resp.Runtime, Policy: resp.Policy, Status: string(nsjail.StatusSandboxError),
		ExitCode: resp.ExitCode, Signal: resp.Signal, Usage: resp.Usage, LimitsHit: resp.LimitsHit,
		Artifacts: []Artifact{}, ArtifactsOmitted: []Omitted{},
		StartedAt: resp.StartedAt, FinishedAt: resp.FinishedAt, DurationMS: resp.DurationMS,
		Display: []runner.Display{},
		Error:   errorMessage(fmt.Sprintf("the execution ran (status %s) but its result could not be stored: %v; its output is lost", resp.Status, err))}
}

// spec is the sandbox spec of a plan: the runner running the code file
// (runner.Args) with events, the write end of its events pipe, as its
// runner.EventsFD (none when nil: a kernel's, whose Args are the zygote's), the policy's Limits and Env (BaseEnv plus the request's
// extras), so the warm pool can match it to the policy's Template.
func (s *Server) spec(p *plan, rootfs, python, workspace string, events *os.File, done <-chan int) nsjail.Spec {
	job := runner.Job{Path: CodePath, Cwd: inside.Workspace, Display: p.display, Figures: p.figures}
	var extra []*os.File
	if events != nil {
		job.EventsFD, extra = runner.EventsFD, []*os.File{events}
	} else {
		done = nil // the done event comes on the events pipe
	}
	job.Done = done != nil
	return nsjail.Spec{
		ID:         p.run,
		Rootfs:     rootfs,
		Args:       runner.Args(python, job),
		Env:        p.env,
		Cwd:        inside.Workspace,
		Workspace:  workspace,
		ExtraFiles: extra,
		Limits:     p.policy.Limits(s.cfg),
		Done:       done,
	}
}

// fill copies the sandbox result, the runner's events and the workspace
// output into resp, and the artifacts' contents through save. since, for a
// session's volume, is output/ before the execution: only what it created
// or changed is its result and artifacts.
func (s *Server) fill(resp *ExecutionResponse, res *nsjail.Result, ev runner.Outcome, dir string, since *workspace.Snapshot,
	save workspace.SaveArtifact, log *slog.Logger) {
	resp.Status = string(res.Status)
	resp.ExitCode = res.ExitCode
	if res.Signal != "" {
		sig := res.Signal
		resp.Signal = &sig
	}
	// Invalid UTF-8 becomes U+FFFD in JSON; the bytes are not otherwise
	// altered.
	resp.Stdout = string(res.Stdout)
	resp.Stderr = string(res.Stderr)
	resp.StdoutTruncated = res.StdoutTruncated
	resp.StderrTruncated = res.StderrTruncated
	resp.StdoutOmittedBytes = max(0, res.StdoutBytes-int64(len(res.Stdout)))
	resp.StderrOmittedBytes = max(0, res.StderrBytes-int64(len(res.Stderr)))
	if res.LimitsHit != nil {
		resp.LimitsHit = res.LimitsHit
	}
	resp.Usage = res.Usage
	resp.StartedAt = res.StartedAt
	resp.FinishedAt = res.FinishedAt
	if res.Error != "" {
		resp.Error = errorMessage(res.Error)
	}
	fillEvents(resp, res, ev, log)
	result, msg := workspace.ReadResultSince(dir, s.cfg.MaxResultBytes, since)
	resp.Result = result
	if msg != "" {
		resp.ResultError = &msg
	}
	resp.Artifacts, resp.ArtifactsOmitted = workspace.CollectArtifactsSince(dir, workspace.ArtifactLimits{
		MaxFileBytes:  s.cfg.MaxArtifactBytes,
		MaxTotalBytes: s.cfg.MaxArtifactsBytes,
		MaxCount:      s.cfg.MaxArtifacts,
	}, since, save)
	if resp.Artifacts == nil {
		resp.Artifacts = []Artifact{}
	}
	if resp.ArtifactsOmitted == nil {
		resp.ArtifactsOmitted = []Omitted{}
	}
}

// runnerEvent publishes a runner event as it is read, for the clients
// following the execution: `display` ({mime}) and `figure` ({name}: its
// size comes with the answer's artifact, the worker's reading of the PNG,
// never the sandbox's word, SECURITY.md case 51). The typed error comes
// with the result.
func (p *plan) runnerEvent(ev runner.Event) {
	var data any
	switch ev.Type {
	case runner.EventDisplay:
		data = runner.Display{Mime: ev.Mime}
	case runner.EventFigure:
		data = struct {
			Name string `json:"name"`
		}{ev.Name}
	default:
		return
	}
	b, err := json.Marshal(data)
	if err == nil {
		p.hub.Publish(ev.Type, b)
	}
}

// fillEvents puts what the runner said into resp: the typed error only
// when the code failed by itself (an exit code, no signal, no timeout, OOM
// or cancel, no limit hit: a limit is never dressed as a Python error,
// not even one the code saw as an exception, such as the pids limit's
// "can't start new thread"), and the displayed values. All of it is the code's own word (it can write the
// events fd): it only ever shapes this answer.
func fillEvents(resp *ExecutionResponse, res *nsjail.Result, ev runner.Outcome, log *slog.Logger) {
	if ev.Error != nil && res.Status == nsjail.StatusFailed && res.Signal == "" && res.ExitCode != 0 && len(res.LimitsHit) == 0 &&
		resp.Error == nil {
		resp.Error = &ExecError{Code: ev.Error}
	}
	resp.Display = ev.Display
	if resp.Display == nil {
		resp.Display = []runner.Display{}
	}
	if ev.Dropped > 0 || ev.Overflow {
		log.Warn("the runner's events had invalid lines (dropped)", "dropped", ev.Dropped, "overflow", ev.Overflow)
	}
}

// logReject logs a refused request; the fields are what is known of it.
func (s *Server) logReject(e *apiError, attrs ...any) {
	s.metrics.rejected.WithLabelValues(e.reason).Inc()
	s.log.LogAttrs(context.Background(), slog.LevelWarn, "request rejected",
		append([]slog.Attr{slog.Int("status", e.status), slog.String("reason", e.reason), slog.String("error", e.msg)}, argsToAttrs(attrs)...)...)
}

func argsToAttrs(args []any) []slog.Attr {
	var out []slog.Attr
	for i := 0; i+1 < len(args); i += 2 {
		if k, ok := args[i].(string); ok {
			out = append(out, slog.Any(k, args[i+1]))
		}
	}
	return out
}
