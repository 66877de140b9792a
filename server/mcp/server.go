// Package mcp is sandboxd's Model Context Protocol server: the tools
// (tools.json) and resources an agent uses to run Python in sandboxd,
// served over Streamable HTTP at /mcp by `sandboxd serve` and over stdio
// by `sandboxd mcp`, both with the official Go SDK.
//
// One implementation serves both transports: every tool is a client of
// sandboxd's HTTP API through a Backend (in-process routes for serve, a
// real HTTP client for the stdio bridge). This package imports nothing of
// package server; cmd/sandboxd wires the two.
//
// Resources (read with resources/read; run_python links to them):
//
//	sandboxd://executions/{id}/artifacts/{name}   an execution's artifact (GET /v1/executions/{id}/artifacts/{name})
//	sandboxd://sessions/{id}/files/{path}         a session's file (GET /v1/sessions/{id}/files/{path})
//
// {name} and {path} are relative paths, each segment percent-encoded.
package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// instructions tell a model what the server is for and how its tools fit.
const instructions = "sandboxd runs Python for data analysis in isolated sandboxes (pandas, numpy, matplotlib, scikit-learn, ...; no network). " +
	"For a one-off computation call run_python with the code. For several steps on the same data, create_session, upload_file the data " +
	"(or pass it in run_python's files), then call run_python with the session_id: variables persist between calls. " +
	"Save charts and files under output/artifacts/ to get them back. Close the session when done."

// maxAnswerBytes bounds an execution's answer as read by a tool: far above
// what the worker's own caps allow (stdout, stderr, result.json and
// max_artifacts_bytes of artifacts in base64), a bound against a broken
// backend only.
const maxAnswerBytes = 512 << 20

// maxResourceBytes bounds a resource read or an inlined file: a resource
// is sent whole in one JSON-RPC message.
const maxResourceBytes = 16 << 20

// NewServer returns the MCP server whose tools and resources call the API
// through b.
func NewServer(b *Backend, log *slog.Logger) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "sandboxd", Title: "sandboxd: sandboxed Python for data analysis", Version: version()},
		&sdk.ServerOptions{Instructions: instructions, Logger: log, Capabilities: &sdk.ServerCapabilities{}})
	t := tools{b: b}
	for _, d := range Tools() {
		tool := &sdk.Tool{Name: d.Name, Title: d.Title, Description: d.Description, InputSchema: d.InputSchema}
		switch d.Name {
		case "run_python":
			sdk.AddTool(s, tool, t.runPython)
		case "create_session":
			sdk.AddTool(s, tool, t.createSession)
		case "close_session":
			sdk.AddTool(s, tool, t.closeSession)
		case "upload_file":
			sdk.AddTool(s, tool, t.uploadFile)
		case "read_file":
			sdk.AddTool(s, tool, t.readFile)
		case "list_files":
			sdk.AddTool(s, tool, t.listFiles)
		default:
			panic("server/mcp: tools.json defines " + d.Name + ", which has no handler")
		}
	}
	s.AddResourceTemplate(&sdk.ResourceTemplate{
		URITemplate: "sandboxd://executions/{id}/artifacts/{+name}", Name: "artifact",
		Description: "A file an execution saved under output/artifacts/ (run_python links to them).",
	}, t.readArtifact)
	s.AddResourceTemplate(&sdk.ResourceTemplate{
		URITemplate: "sandboxd://sessions/{id}/files/{+path}", Name: "session-file",
		Description: "A file in a session's workspace, by its path relative to /workspace.",
	}, t.readSessionFile)
	return s
}

// Handler serves MCP over Streamable HTTP for sandboxd serve's /mcp:
// stateless (every POST stands alone; GET and DELETE are 405), answers as
// JSON (one response when the call is done, so the API's write deadline
// covers writing it, not the run). maxBody bounds a request.
func Handler(b *Backend, maxBody int64, log *slog.Logger) http.Handler {
	s := NewServer(b, log)
	return sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{
		Stateless:           true,
		JSONResponse:        true,
		Logger:              log,
		MaxRequestBodyBytes: maxBody,
		// The worker's guard (Host, Origin, token) runs before this
		// handler, with the worker's own list of allowed hosts.
		DisableLocalhostProtection: true,
		// A client that goes away cancels its tool call (and so its run).
		PropagateRequestCancellation: true,
	})
}

// ServeStdio serves MCP on stdin/stdout until the client closes it or ctx
// is done (sandboxd mcp). maxLine bounds one message (an upload in base64).
func ServeStdio(ctx context.Context, b *Backend, maxLine int, log *slog.Logger) error {
	return NewServer(b, log).Run(ctx, &sdk.StdioTransport{MaxLineLength: maxLine})
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "devel"
}

// tools holds the tool handlers.
type tools struct{ b *Backend }

// toolError turns an argument error or an API refusal into the tool result
// a model can act on (isError, the reason as text); anything else (the
// backend unreachable) too, as the SDK would.
func toolError(err error) (*sdk.CallToolResult, any, error) {
	msg := err.Error()
	var ae *apiError
	if errors.As(err, &ae) {
		msg = fmt.Sprintf("sandboxd refused the call (%d %s): %s", ae.Status, http.StatusText(ae.Status), ae.Message)
		switch {
		case ae.Code == "session_busy":
			msg += " Wait for the running call to finish, then retry."
		case ae.Status == http.StatusTooManyRequests || ae.Status == http.StatusServiceUnavailable:
			msg += " The worker is busy or starting: retry in a few seconds."
		case ae.Status == http.StatusNotFound && strings.Contains(ae.Message, "session"):
			msg += " The session may have expired: create_session again."
		}
	}
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: msg}}}, nil, nil
}

func sessionPath(id string, rest ...string) string {
	return "/v1/sessions/" + url.PathEscape(id) + strings.Join(rest, "")
}

// escapePath percent-encodes each segment of a relative path.
func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

func newExecutionID() string {
	var b [9]byte
	rand.Read(b[:])
	return "mcp-" + hex.EncodeToString(b[:])
}

func (t tools) runPython(ctx context.Context, _ *sdk.CallToolRequest, in runPythonArgs) (*sdk.CallToolResult, any, error) {
	files, err := apiFiles(in.Files)
	if err != nil {
		return toolError(err)
	}
	// A named execution: a retried POST (429, 503, a lost connection)
	// answers the same run, never a second one; the run outlives its
	// connection, so a call the client cancels is cancelled by id below.
	body := map[string]any{"id": newExecutionID(), "code": in.Code}
	if len(files) > 0 {
		body["files"] = files
	}
	if in.TimeoutS > 0 {
		body["timeout_ms"] = int64(math.Ceil(min(in.TimeoutS, 1e9) * 1000))
	}
	path := "/v1/executions"
	if in.SessionID != "" {
		if err := checkSessionID(in.SessionID); err != nil {
			return toolError(err)
		}
		if in.Runtime != "" {
			return toolError(errors.New("runtime is for a call without session_id: a session runs on its own runtime (create_session's)"))
		}
		path = sessionPath(in.SessionID, "/executions")
	} else if in.Runtime != "" {
		// Passed on as is: the worker looks the name up in its config.
		body["runtime"] = in.Runtime
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, nil, err
	}
	res, err := t.execute(ctx, path, data, body["id"].(string))
	if err != nil {
		return toolError(err)
	}
	return res, nil, nil
}

// execute POSTs an execution and returns its answer as run_python's
// result; when ctx ends first (the client cancelled the call or went
// away) the execution is cancelled.
func (t tools) execute(ctx context.Context, path string, body []byte, id string) (*sdk.CallToolResult, error) {
	res, err := t.post(ctx, path, body)
	if err == nil && ctx.Err() == nil {
		return res, nil
	}
	if ctx.Err() != nil {
		// Cancelled mid-call: the run, named, would go on without its
		// client. (Once it has finished, the DELETE is a harmless 409.)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		// path + "/" + id is the execution's own route: under its
		// session for a session's (forwarded to the session's owner
		// like the POST, which /v1/executions/{id} would not be).
		if resp, derr := t.b.do(cctx, http.MethodDelete, path+"/"+url.PathEscape(id), nil, nil); derr == nil {
			resp.Body.Close()
		}
		return nil, ctx.Err()
	}
	return nil, err
}

// post sends an execution and reads its answer as it streams in
// (executionResult), at most maxAnswerBytes of it.
func (t tools) post(ctx context.Context, path string, body []byte) (*sdk.CallToolResult, error) {
	resp, err := t.b.do(ctx, http.MethodPost, path, body, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	lr := &io.LimitedReader{R: resp.Body, N: maxAnswerBytes + 1}
	res, err := executionResult(lr)
	if err != nil && lr.N <= 0 {
		err = fmt.Errorf("the execution's answer is larger than %d bytes", maxAnswerBytes)
	}
	return res, err
}

func (t tools) createSession(ctx context.Context, _ *sdk.CallToolRequest, in createSessionArgs) (*sdk.CallToolResult, any, error) {
	body := map[string]any{}
	if in.SessionID != "" {
		if err := checkSessionID(in.SessionID); err != nil {
			return toolError(err)
		}
		body["id"] = in.SessionID
	}
	if in.Kernel != nil {
		body["kernel"] = *in.Kernel
	}
	if in.Runtime != "" {
		body["runtime"] = in.Runtime
	}
	if in.IdleTimeoutS > 0 {
		body["idle_timeout_ms"] = int64(math.Ceil(min(in.IdleTimeoutS, 1e9) * 1000))
	}
	var sess map[string]json.RawMessage
	if err := t.b.doJSON(ctx, http.MethodPost, "/v1/sessions", body, &sess, 1<<20); err != nil {
		return toolError(err)
	}
	var v struct {
		ID        string    `json:"id"`
		ExpiresAt time.Time `json:"expires_at"`
		Kernel    struct {
			Enabled bool `json:"enabled"`
		} `json:"kernel"`
	}
	raw, _ := json.Marshal(sess)
	json.Unmarshal(raw, &v)
	kernel := "its Python keeps variables between run_python calls"
	if !v.Kernel.Enabled {
		kernel = "each run_python call starts a fresh Python on its files"
	}
	text := fmt.Sprintf("Created session %s: %s; its files are kept under /workspace. Pass session_id=%q to run_python, upload_file, read_file and list_files; close_session when done (unused, it expires at %s).",
		v.ID, kernel, v.ID, v.ExpiresAt.Format(time.RFC3339))
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: sess}, nil, nil
}

func (t tools) closeSession(ctx context.Context, _ *sdk.CallToolRequest, in closeSessionArgs) (*sdk.CallToolResult, any, error) {
	if err := checkSessionID(in.SessionID); err != nil {
		return toolError(err)
	}
	if err := t.b.doJSON(ctx, http.MethodDelete, sessionPath(in.SessionID), nil, nil, 0); err != nil {
		return toolError(err)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "Deleted session " + in.SessionID + " and its files."}}}, nil, nil
}

func (t tools) uploadFile(ctx context.Context, _ *sdk.CallToolRequest, in uploadFileArgs) (*sdk.CallToolResult, any, error) {
	if err := checkSessionID(in.SessionID); err != nil {
		return toolError(err)
	}
	if err := checkRelPath("path", in.Path); err != nil {
		return toolError(err)
	}
	data, err := content("upload_file", in.Text, in.ContentBase64)
	if err != nil {
		return toolError(err)
	}
	resp, err := t.b.do(ctx, http.MethodPut, sessionPath(in.SessionID, "/files/", escapePath(in.Path)), data,
		http.Header{"Content-Type": {"application/octet-stream"}})
	if err != nil {
		return toolError(err)
	}
	defer resp.Body.Close()
	var info map[string]any
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&info); err != nil {
		return nil, nil, fmt.Errorf("decoding the upload's answer: %w", err)
	}
	text := fmt.Sprintf("Wrote %s (%d bytes) in session %s; the session's code reads it at %q (cwd /workspace).", in.Path, len(data), in.SessionID, in.Path)
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: info}, nil, nil
}

func (t tools) listFiles(ctx context.Context, _ *sdk.CallToolRequest, in listFilesArgs) (*sdk.CallToolResult, any, error) {
	if err := checkSessionID(in.SessionID); err != nil {
		return toolError(err)
	}
	var list struct {
		Files []struct {
			Name string `json:"name"`
			Size int64  `json:"size"`
		} `json:"files"`
		Truncated bool `json:"truncated"`
	}
	q := url.Values{}
	if in.Prefix != "" {
		q.Set("prefix", in.Prefix)
	}
	path := sessionPath(in.SessionID, "/files")
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var raw json.RawMessage
	if err := t.b.doJSON(ctx, http.MethodGet, path, nil, &raw, 64<<20); err != nil {
		return toolError(err)
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, nil, err
	}
	var sb strings.Builder
	if len(list.Files) == 0 {
		sb.WriteString("No files")
		if in.Prefix != "" {
			fmt.Fprintf(&sb, " under %q", in.Prefix)
		}
		sb.WriteString(".")
	}
	for _, f := range list.Files {
		fmt.Fprintf(&sb, "%s\t%d bytes\n", f.Name, f.Size)
	}
	if list.Truncated {
		sb.WriteString("(more files than listed: narrow the prefix)\n")
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: strings.TrimRight(sb.String(), "\n")}}, StructuredContent: raw}, nil, nil
}
