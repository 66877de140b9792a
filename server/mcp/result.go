package mcp

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// The execution answer as this package reads it: the fields of the API's
// ExecutionResponse (server/openapi.json) that shape the tool result. It
// is decoded from the wire, not shared with package server: this package
// is a client of the API, as the Python client is. Fields the worker does
// not send (yet) are absent and read as zero.
type execAnswer struct {
	ID                 string          `json:"id"`
	Status             string          `json:"status"`
	ExitCode           int             `json:"exit_code"`
	Signal             *string         `json:"signal"`
	Stdout             string          `json:"stdout"`
	Stderr             string          `json:"stderr"`
	StdoutTruncated    bool            `json:"stdout_truncated"`
	StderrTruncated    bool            `json:"stderr_truncated"`
	StdoutOmittedBytes int64           `json:"stdout_omitted_bytes"`
	StderrOmittedBytes int64           `json:"stderr_omitted_bytes"`
	Result             json.RawMessage `json:"result"`
	ResultError        *string         `json:"result_error"`
	ArtifactsOmitted   []struct {
		Name   string `json:"name"`
		Reason string `json:"reason"`
	} `json:"artifacts_omitted"`
	LimitsHit []string `json:"limits_hit"`
	Policy    struct {
		TimeoutMS int64 `json:"timeout_ms"`
		MemoryMB  int64 `json:"memory_mb"`
	} `json:"policy"`
	// Error is a string for sandbox_error and interrupted (our failure),
	// or the typed error of code that raised (issue 13: an object).
	Error   json.RawMessage `json:"error"`
	Display []struct {
		Mime map[string]string `json:"mime"`
	} `json:"display"`
	Session *struct {
		ID          string `json:"id"`
		State       string `json:"state"`
		Reason      string `json:"reason"`
		KernelEnded string `json:"kernel_ended"`
	} `json:"session"`
}

// artifact is an artifact of the answer: its entry, and its bytes when
// they are inlined as an image block (nil: a resource link).
type artifact struct {
	Name      string
	Size      int64
	MediaType string
	data      []byte
	inlined   *int64 // the answer's images inlined so far, in bytes
}

// typedError is the typed error of issue 13 (the fields used here).
type typedError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Text    string `json:"text"`
	Hint    string `json:"hint"`
}

// Budgets of a tool result: what a model's context can take, and what a
// client accepts as one image (several clients refuse more than 5 MB).
const (
	maxInlineImage  = 5 << 20  // larger images are resource links
	maxInlineImages = 16 << 20 // images inlined per answer, in total
	stderrTailBytes = 4000     // stderr shown when the code raised no typed error
	maxResultShown  = 4000     // output/result.json shown inline up to this
)

// inlineImageTypes are the image types MCP clients show (SVG is text and
// is a resource link).
var inlineImageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// executionResult turns an execution's answer (the API's JSON, read from
// r) into run_python's result: the text (stdout, the value shown, the
// traceback or stderr's tail, what went wrong), each image artifact an image
// block, the other artifacts resource links, the whole answer (without
// base64) as structuredContent, and IsError when the run did not succeed.
//
// SECURITY.md case 55: the answer is parsed once, as it arrives, never held
// whole: each field but the artifacts is kept as its JSON text (bounded by
// the worker's stdout, stderr and result caps), each artifact is decoded on
// its own and its base64 dropped unless it becomes an image block (at most
// maxInlineImages bytes in all), so a call holds one artifact's base64 at a
// time, not the answer.
func executionResult(r io.Reader) (*sdk.CallToolResult, error) {
	whole, arts, err := decodeAnswer(r)
	if err != nil {
		return nil, fmt.Errorf("decoding the execution's answer: %w", err)
	}
	var a execAnswer
	// The fields without the artifacts: the small part of the answer.
	if rest, err := json.Marshal(whole); err != nil || json.Unmarshal(rest, &a) != nil {
		return nil, fmt.Errorf("decoding the execution's answer: %v", err)
	}
	res := &sdk.CallToolResult{IsError: a.Status != "succeeded"}
	res.Content = append(res.Content, &sdk.TextContent{Text: answerText(&a)})
	listed := []map[string]any{}
	for _, art := range arts {
		uri := ArtifactURI(a.ID, art.Name)
		listed = append(listed, map[string]any{"name": art.Name, "size": art.Size, "media_type": art.MediaType, "uri": uri})
		if art.data != nil {
			res.Content = append(res.Content, &sdk.ImageContent{Data: art.data, MIMEType: art.MediaType})
			continue
		}
		size := art.Size
		res.Content = append(res.Content, &sdk.ResourceLink{
			URI: uri, Name: art.Name, MIMEType: art.MediaType, Size: &size,
			Description: "an artifact of execution " + a.ID + " (output/artifacts/" + art.Name + ")",
		})
	}
	// The whole answer, artifacts listed by URI: base64 belongs in image
	// blocks and resources, never in the structured copy a model may read.
	raw, err := json.Marshal(listed)
	if err != nil {
		return nil, err
	}
	whole["artifacts"] = raw
	res.StructuredContent = whole
	return res, nil
}

// decodeAnswer reads an execution's answer as it streams: its fields but
// "artifacts" as JSON text, and its artifacts, each with its bytes only if
// it is inlined as an image (inlineArtifact).
func decodeAnswer(r io.Reader) (map[string]json.RawMessage, []*artifact, error) {
	dec := json.NewDecoder(r)
	if err := wantDelim(dec, '{'); err != nil {
		return nil, nil, err
	}
	whole := map[string]json.RawMessage{}
	var arts []*artifact
	inlined := int64(0)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		key, _ := tok.(string)
		if key != "artifacts" {
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil, nil, err
			}
			whole[key] = v
			continue
		}
		if err := wantDelim(dec, '['); err != nil {
			return nil, nil, fmt.Errorf("artifacts: %w", err)
		}
		for dec.More() {
			art := &artifact{inlined: &inlined}
			if err := dec.Decode(art); err != nil {
				return nil, nil, fmt.Errorf("artifact %d: %w", len(arts), err)
			}
			arts = append(arts, art)
		}
		if err := wantDelim(dec, ']'); err != nil {
			return nil, nil, fmt.Errorf("artifacts: %w", err)
		}
	}
	if err := wantDelim(dec, '}'); err != nil {
		return nil, nil, err
	}
	return whole, arts, nil
}

func wantDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != d {
		return fmt.Errorf("want %q, got %v", d, tok)
	}
	return nil
}

// UnmarshalJSON decodes an artifact's entry and, when it is inlined as an
// image block (inlineArtifact, within the answer's budget *a.inlined), its
// bytes; any other artifact's base64 is looked at in place (the decoder's
// buffer) and dropped, never copied.
func (a *artifact) UnmarshalJSON(b []byte) error {
	var e struct {
		Name          string  `json:"name"`
		Size          int64   `json:"size"`
		MediaType     string  `json:"media_type"`
		ContentBase64 jsonRef `json:"content_base64"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return err
	}
	a.Name, a.Size, a.MediaType = e.Name, e.Size, e.MediaType
	if !inlineArtifact(a.MediaType, a.Size, *a.inlined) {
		return nil
	}
	var s string
	if json.Unmarshal(e.ContentBase64, &s) != nil {
		return nil // not a string: shown as a link
	}
	data, err := base64.StdEncoding.DecodeString(s)
	if err != nil || int64(len(data)) != a.Size {
		return nil // a link to it then; reading it says what is wrong
	}
	a.data = data
	*a.inlined += a.Size
	return nil
}

// inlineArtifact says whether an artifact becomes an image block: a type
// clients show, at most maxInlineImage bytes, within maxInlineImages for
// the whole answer (inlined so far: the bytes already inlined).
func inlineArtifact(mediaType string, size, inlined int64) bool {
	return inlineImageTypes[mediaType] && size <= maxInlineImage && inlined+size <= maxInlineImages
}

// jsonRef keeps a JSON value as a reference into the text being decoded,
// valid only while that text is (UnmarshalJSON of the enclosing value).
type jsonRef []byte

func (r *jsonRef) UnmarshalJSON(b []byte) error {
	*r = b
	return nil
}

// answerText is the answer as a model reads it.
func answerText(a *execAnswer) string {
	var parts []string
	if note := sessionNote(a); note != "" {
		parts = append(parts, note)
	}
	if a.Stdout != "" {
		s := strings.TrimRight(a.Stdout, "\n")
		if a.StdoutOmittedBytes > 0 {
			s += fmt.Sprintf("\n[stdout: %d bytes omitted from the middle]", a.StdoutOmittedBytes)
		} else if a.StdoutTruncated {
			s += "\n[stdout truncated]"
		}
		parts = append(parts, s)
	}
	for _, d := range a.Display {
		if md := d.Mime["text/markdown"]; md != "" {
			parts = append(parts, md)
		} else if t := d.Mime["text/plain"]; t != "" {
			parts = append(parts, t)
		}
	}
	var typed typedError
	hasTyped := len(a.Error) > 0 && a.Error[0] == '{' && json.Unmarshal(a.Error, &typed) == nil && (typed.Text != "" || typed.Type != "")
	switch {
	case hasTyped:
		t := typed.Text
		if t == "" {
			t = typed.Type + ": " + typed.Message
		}
		parts = append(parts, strings.TrimRight(t, "\n"))
		if typed.Hint != "" {
			parts = append(parts, "Hint: "+typed.Hint)
		}
	case a.Stderr != "":
		parts = append(parts, stderrTail(a))
	}
	if s := statusLine(a); s != "" {
		parts = append(parts, s)
	}
	if len(a.Result) > 0 && string(a.Result) != "null" {
		if len(a.Result) <= maxResultShown {
			parts = append(parts, "output/result.json: "+string(a.Result))
		} else {
			parts = append(parts, fmt.Sprintf("output/result.json: %d bytes (in structuredContent.result)", len(a.Result)))
		}
	} else if a.ResultError != nil && !strings.HasSuffix(*a.ResultError, " is missing") {
		// A missing result.json is the common case, not news; one that
		// could not be read (too large, not JSON) is.
		parts = append(parts, "output/result.json: "+*a.ResultError)
	}
	for _, o := range a.ArtifactsOmitted {
		parts = append(parts, fmt.Sprintf("artifact %s not returned: %s", o.Name, o.Reason))
	}
	if len(parts) == 0 {
		return "(no output)"
	}
	return strings.Join(parts, "\n\n")
}

// stderrTail is the end of stderr, where a traceback's last line is.
func stderrTail(a *execAnswer) string {
	s := a.Stderr
	cut := false
	if len(s) > stderrTailBytes {
		i := len(s) - stderrTailBytes
		for i < len(s) && !utf8.RuneStart(s[i]) {
			i++
		}
		s, cut = s[i:], true
	}
	s = strings.TrimRight(s, "\n")
	if cut || a.StderrTruncated || a.StderrOmittedBytes > 0 {
		return "[stderr, last part]\n" + s
	}
	return "[stderr]\n" + s
}

// statusLine says how the run ended when it did not succeed (the text
// above already shows what the code printed or raised).
func statusLine(a *execAnswer) string {
	var sandboxMsg string
	if len(a.Error) > 0 && a.Error[0] == '"' {
		json.Unmarshal(a.Error, &sandboxMsg)
	}
	switch a.Status {
	case "succeeded":
		return ""
	case "failed":
		if a.Signal != nil {
			return fmt.Sprintf("Failed: killed by %s.", *a.Signal)
		}
		return fmt.Sprintf("Failed with exit code %d.", a.ExitCode)
	case "timeout":
		return fmt.Sprintf("Timed out: stopped after %.3g s (the time limit). Make the code faster, work on a sample, or pass a larger timeout_s if the policy allows it.", float64(a.Policy.TimeoutMS)/1000)
	case "oom":
		return fmt.Sprintf("Out of memory: killed at the %d MiB limit. Use less memory (smaller dtypes, chunks, fewer copies).", a.Policy.MemoryMB)
	case "cancelled":
		return "Cancelled before it finished."
	case "interrupted":
		return "Interrupted: the worker restarted while this ran; the code may have run in part. " + sandboxMsg
	default:
		return strings.TrimSpace(fmt.Sprintf("Status %s. %s", a.Status, sandboxMsg))
	}
}

// sessionNote warns that a session's Python state is not what the last
// call left (a restarted kernel), or is lost after this run.
func sessionNote(a *execAnswer) string {
	s := a.Session
	if s == nil {
		return ""
	}
	var notes []string
	if (s.State == "new" || s.State == "restarted") && s.Reason != "" && s.Reason != "first_execution" && s.Reason != "kernel_disabled" {
		notes = append(notes, fmt.Sprintf("Note: this session's Python was restarted before this run (%s): variables from earlier calls are gone, files are kept.", s.Reason))
	}
	if s.KernelEnded != "" {
		notes = append(notes, fmt.Sprintf("Note: this session's Python ended during this run (%s): the next call starts a fresh one, files are kept.", s.KernelEnded))
	}
	return strings.Join(notes, "\n")
}
