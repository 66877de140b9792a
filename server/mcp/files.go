package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// Resource URIs: one place that builds them and one that parses them.
const (
	uriScheme       = "sandboxd://"
	artifactsPrefix = uriScheme + "executions/"
	sessionsPrefix  = uriScheme + "sessions/"
)

// ArtifactURI is the resource URI of an execution's artifact.
func ArtifactURI(execID, name string) string {
	return artifactsPrefix + url.PathEscape(execID) + "/artifacts/" + escapePath(name)
}

// SessionFileURI is the resource URI of a session's file.
func SessionFileURI(sessionID, path string) string {
	return sessionsPrefix + url.PathEscape(sessionID) + "/files/" + escapePath(path)
}

// parseURI splits prefix + ID + "/" + kind + "/" + path, unescaping each
// part; ok is false for anything else.
func parseURI(uri, prefix, kind string) (id, path string, ok bool) {
	rest, found := strings.CutPrefix(uri, prefix)
	if !found {
		return "", "", false
	}
	escID, escPath, found := strings.Cut(rest, "/"+kind+"/")
	if !found || escID == "" || escPath == "" {
		return "", "", false
	}
	id, err := url.PathUnescape(escID)
	if err != nil {
		return "", "", false
	}
	segs := strings.Split(escPath, "/")
	for i, s := range segs {
		if segs[i], err = url.PathUnescape(s); err != nil || segs[i] == "" || strings.Contains(segs[i], "/") {
			return "", "", false
		}
	}
	return id, strings.Join(segs, "/"), true
}

// textLike says whether a file of this media type and content is shown as
// text: a text type, JSON, XML, or any valid UTF-8 without NUL bytes.
func textLike(mediaType string, data []byte) bool {
	mt, _, _ := mime.ParseMediaType(mediaType)
	switch {
	case strings.HasPrefix(mt, "image/") && mt != "image/svg+xml":
		return false
	case strings.HasPrefix(mt, "text/"), mt == "application/json", mt == "application/xml", strings.HasSuffix(mt, "+json"), strings.HasSuffix(mt, "+xml"):
		return true
	}
	return utf8.Valid(data) && !bytes.ContainsRune(data, 0)
}

// readArtifact reads sandboxd://executions/{id}/artifacts/{name}: the one
// artifact, from GET /v1/executions/{id}/artifacts/{name}, never the
// execution's whole answer (SECURITY.md case 55). The id and the name are
// checked before they become a path: an escaped "/" or ".." in them would
// reach another route (x%2Fevents, ..%2F..%2Fmetrics).
func (t tools) readArtifact(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
	uri := req.Params.URI
	id, name, ok := parseURI(uri, artifactsPrefix, "artifacts")
	if !ok || !inside.ValidID(id) || checkRelPath("name", name) != nil {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	resp, err := t.b.do(ctx, http.MethodGet, "/v1/executions/"+url.PathEscape(id)+"/artifacts/"+escapePath(name), nil, nil)
	if err != nil {
		if ae, ok := err.(*apiError); ok && ae.Status == http.StatusConflict {
			return nil, fmt.Errorf("%s: execution %s has not finished yet", uri, id)
		}
		return nil, resourceError(uri, err)
	}
	defer resp.Body.Close()
	if resp.ContentLength > maxResourceBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than an MCP resource carries here (%d): read it with GET /v1/executions/%s/artifacts/%s", uri, resp.ContentLength, maxResourceBytes, id, escapePath(name))
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResourceBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", uri, err)
	}
	if len(data) > maxResourceBytes {
		return nil, fmt.Errorf("%s is more than an MCP resource carries here (%d bytes): read it with GET /v1/executions/%s/artifacts/%s", uri, maxResourceBytes, id, escapePath(name))
	}
	return resourceResult(uri, resp.Header.Get("Content-Type"), data), nil
}

// readSessionFile reads sandboxd://sessions/{id}/files/{path}.
func (t tools) readSessionFile(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
	uri := req.Params.URI
	id, path, ok := parseURI(uri, sessionsPrefix, "files")
	if !ok || checkSessionID(id) != nil || checkRelPath("path", path) != nil {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	data, mediaType, _, err := t.getFile(ctx, id, path, 0, maxResourceBytes)
	if err != nil {
		return nil, resourceError(uri, err)
	}
	if int64(len(data)) >= maxResourceBytes {
		return nil, fmt.Errorf("%s is larger than an MCP resource carries here (%d bytes): read it in parts with read_file", uri, maxResourceBytes)
	}
	return resourceResult(uri, mediaType, data), nil
}

func resourceResult(uri, mediaType string, data []byte) *sdk.ReadResourceResult {
	c := &sdk.ResourceContents{URI: uri, MIMEType: mediaType}
	if textLike(mediaType, data) {
		c.Text = string(data)
	} else {
		c.Blob = data
	}
	return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{c}}
}

// resourceError maps a 404 to the protocol's resource-not-found error.
func resourceError(uri string, err error) error {
	if ae, ok := err.(*apiError); ok && ae.Status == http.StatusNotFound {
		return sdk.ResourceNotFoundError(uri)
	}
	return fmt.Errorf("%s: %w", uri, err)
}

// getFile reads at most n bytes of a session's file from offset, and
// returns them, the media type and the file's whole size (-1 if unknown).
func (t tools) getFile(ctx context.Context, id, path string, offset, n int64) (data []byte, mediaType string, size int64, err error) {
	h := http.Header{"Range": {fmt.Sprintf("bytes=%d-%d", offset, offset+n-1)}}
	resp, err := t.b.do(ctx, http.MethodGet, sessionPath(id, "/files/", escapePath(path)), nil, h)
	if err != nil {
		return nil, "", 0, err
	}
	defer resp.Body.Close()
	data, err = io.ReadAll(io.LimitReader(resp.Body, n))
	if err != nil {
		return nil, "", 0, err
	}
	size = -1
	if cr := resp.Header.Get("Content-Range"); cr != "" {
		if i := strings.LastIndexByte(cr, '/'); i >= 0 {
			if v, perr := strconv.ParseInt(cr[i+1:], 10, 64); perr == nil {
				size = v
			}
		}
	} else if resp.StatusCode == http.StatusOK && resp.ContentLength >= 0 {
		size = resp.ContentLength // the whole file (no Range applied)
	}
	return data, resp.Header.Get("Content-Type"), size, nil
}

// readFile is the read_file tool: text as text (a window of it), an image
// as an image block, another binary file as a resource link.
func (t tools) readFile(ctx context.Context, _ *sdk.CallToolRequest, in readFileArgs) (*sdk.CallToolResult, any, error) {
	if err := checkSessionID(in.SessionID); err != nil {
		return toolError(err)
	}
	if err := checkRelPath("path", in.Path); err != nil {
		return toolError(err)
	}
	n := in.MaxBytes
	if n <= 0 {
		n = 64 << 10
	}
	data, mediaType, size, err := t.getFile(ctx, in.SessionID, in.Path, in.Offset, n)
	if err != nil {
		if ae, ok := err.(*apiError); ok && ae.Status == http.StatusRequestedRangeNotSatisfiable {
			return toolError(argErrorf("offset %d is at or past the end of %s", in.Offset, in.Path))
		}
		return toolError(err)
	}
	mt, _, _ := mime.ParseMediaType(mediaType)
	uri := SessionFileURI(in.SessionID, in.Path)
	info := map[string]any{"path": in.Path, "size": size, "media_type": mediaType, "uri": uri, "offset": in.Offset, "bytes": len(data)}
	if inlineImageTypes[mt] && in.Offset == 0 && size >= 0 && size <= maxInlineImage {
		if int64(len(data)) < size {
			if data, _, _, err = t.getFile(ctx, in.SessionID, in.Path, 0, size); err != nil {
				return toolError(err)
			}
		}
		text := fmt.Sprintf("%s: %s, %d bytes.", in.Path, mt, size)
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}, &sdk.ImageContent{Data: data, MIMEType: mt}}, StructuredContent: info}, nil, nil
	}
	if int64(len(data)) == n {
		data = trimPartialRune(data) // a window may end inside a character
	}
	if !textLike(mediaType, data) {
		text := fmt.Sprintf("%s is a binary file (%s, %d bytes): not shown as text. Process it with run_python in the session, or read the resource %s.", in.Path, mediaType, size, uri)
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}, &sdk.ResourceLink{URI: uri, Name: in.Path, MIMEType: mediaType, Size: &size}},
			StructuredContent: info}, nil, nil
	}
	text := strings.ToValidUTF8(string(data), "\uFFFD")
	if end := in.Offset + int64(len(data)); size >= 0 && end < size {
		text += fmt.Sprintf("\n[bytes %d-%d of %d shown; call read_file with offset=%d for more]", in.Offset, end, size, end)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: info}, nil, nil
}

// trimPartialRune drops an incomplete UTF-8 sequence a byte window may end
// in, so that the window of a text file still reads as text.
func trimPartialRune(b []byte) []byte {
	for i := 1; i <= utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}

func decodeBase64(s string) ([]byte, error) {
	out, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("bad base64 in the answer: %w", err)
	}
	return out, nil
}
