package mcp

import (
	"bytes"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// toolsJSON is the tools' definitions as MCP lists them: name, title,
// description (written for a model) and input schema. It is the one
// definition: the server registers exactly these, `sandboxd mcp
// --print-tool-schema` prints them, and clients for function-calling APIs
// (tools/clients/python) mirror the run_python entry.
//
//go:embed tools.json
var toolsJSON []byte

// ToolDef is one tool's definition, as in tools.json.
type ToolDef struct {
	Name        string          `json:"name"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

// Tools returns the tools' definitions (a fresh copy).
func Tools() []ToolDef {
	var defs []ToolDef
	dec := json.NewDecoder(bytes.NewReader(toolsJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&defs); err != nil {
		panic("server/mcp: tools.json: " + err.Error()) // embedded; TestToolsJSON decodes it
	}
	return defs
}

// Tool returns the definition of the named tool.
func Tool(name string) (ToolDef, bool) {
	defs := Tools()
	i := slices.IndexFunc(defs, func(d ToolDef) bool { return d.Name == name })
	if i < 0 {
		return ToolDef{}, false
	}
	return defs[i], true
}

// The tools' arguments, decoded after the SDK validated them against the
// schema in tools.json (TestToolArgsMatchSchema keeps the fields equal).

type fileArg struct {
	Path          string  `json:"path"`
	Text          *string `json:"text,omitempty"`
	ContentBase64 *string `json:"content_base64,omitempty"`
}

type runPythonArgs struct {
	Code      string    `json:"code"`
	SessionID string    `json:"session_id,omitempty"`
	TimeoutS  float64   `json:"timeout_s,omitempty"`
	Files     []fileArg `json:"files,omitempty"`
	Runtime   string    `json:"runtime,omitempty"`
}

type createSessionArgs struct {
	SessionID    string  `json:"session_id,omitempty"`
	Kernel       *bool   `json:"kernel,omitempty"`
	IdleTimeoutS float64 `json:"idle_timeout_s,omitempty"`
	Runtime      string  `json:"runtime,omitempty"`
}

type closeSessionArgs struct {
	SessionID string `json:"session_id"`
}

type uploadFileArgs struct {
	SessionID     string  `json:"session_id"`
	Path          string  `json:"path"`
	Text          *string `json:"text,omitempty"`
	ContentBase64 *string `json:"content_base64,omitempty"`
}

type readFileArgs struct {
	SessionID string `json:"session_id"`
	Path      string `json:"path"`
	Offset    int64  `json:"offset,omitempty"`
	MaxBytes  int64  `json:"max_bytes,omitempty"`
}

type listFilesArgs struct {
	SessionID string `json:"session_id"`
	Prefix    string `json:"prefix,omitempty"`
}

// argError is a bad argument: a tool result with isError, never a protocol
// error, so the model reads it and corrects the call.
type argError struct{ msg string }

func (e argError) Error() string { return e.msg }

func argErrorf(format string, a ...any) error { return argError{fmt.Sprintf(format, a...)} }

// checkSessionID refuses an id that is not a session id before it becomes
// part of a URL path: "x/files/y" must not reach another endpoint.
func checkSessionID(id string) error {
	if !inside.ValidID(id) {
		return argErrorf("session_id %q is not a session id (%s); use the session_id create_session returned", clip(id), inside.IDRule)
	}
	return nil
}

// checkRelPath refuses a path that the URL layer would rewrite ("..",
// ".", empty segments) before it is sent; the worker applies the full
// rule (volume.CheckPath) to what arrives.
func checkRelPath(name, p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return argErrorf("%s %q must be a relative path such as \"input/data.csv\"", name, clip(p))
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return argErrorf("%s %q must be a clean relative path (no empty, \".\" or \"..\" parts)", name, clip(p))
		}
	}
	return nil
}

// content returns a file's bytes from exactly one of text and base64.
func content(what string, text, b64 *string) ([]byte, error) {
	switch {
	case text != nil && b64 != nil:
		return nil, argErrorf("%s: give text or content_base64, not both", what)
	case text != nil:
		return []byte(*text), nil
	case b64 != nil:
		data, err := base64.StdEncoding.DecodeString(*b64)
		if err != nil {
			return nil, argErrorf("%s: content_base64 is not valid base64: %v", what, err)
		}
		return data, nil
	}
	return nil, argErrorf("%s: give its content as text or content_base64", what)
}

// apiFiles turns run_python's files into the API's [{path, content_base64}].
func apiFiles(files []fileArg) ([]map[string]string, error) {
	var out []map[string]string
	for i, f := range files {
		what := fmt.Sprintf("files[%d] (%s)", i, clip(f.Path))
		if err := checkRelPath(what+" path", f.Path); err != nil {
			return nil, err
		}
		var b64 string
		switch {
		case f.Text != nil && f.ContentBase64 != nil:
			return nil, argErrorf("%s: give text or content_base64, not both", what)
		case f.Text != nil:
			b64 = base64.StdEncoding.EncodeToString([]byte(*f.Text))
		case f.ContentBase64 != nil:
			b64 = *f.ContentBase64 // the worker checks it (400 with the reason)
		default:
			return nil, argErrorf("%s: give its content as text or content_base64", what)
		}
		out = append(out, map[string]string{"path": f.Path, "content_base64": b64})
	}
	return out, nil
}

// clip bounds a string echoed back in an error.
func clip(s string) string {
	const n = 128
	if len(s) <= n {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	return strings.ToValidUTF8(s[:n], "\uFFFD") + fmt.Sprintf("…(%d bytes)", len(s))
}
