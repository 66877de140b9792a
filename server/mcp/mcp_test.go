package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/config"
)

// These tests need no root: the tools run against a fake of the HTTP API
// (an http.Handler, through the in-process backend, or an httptest server
// for the remote one), driven by the SDK's own client over its in-memory
// transport. The real worker and both real transports: cmd/sandboxd
// TestMCP.

// connect serves NewServer(b) to an SDK client over in-memory transports.
func connect(t *testing.T, b *Backend) *sdk.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := sdk.NewInMemoryTransports()
	ss, err := NewServer(b, nil).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Close() })
	return cs
}

// tools.json is the one definition: every tool has a description and a
// schema that resolves, its properties are exactly the Go arguments' JSON
// fields, and the server lists exactly these tools.
func TestToolsJSON(t *testing.T) {
	args := map[string]any{
		"run_python": runPythonArgs{}, "create_session": createSessionArgs{}, "close_session": closeSessionArgs{},
		"upload_file": uploadFileArgs{}, "read_file": readFileArgs{}, "list_files": listFilesArgs{},
	}
	var names []string
	for _, d := range Tools() {
		names = append(names, d.Name)
		if d.Description == "" || d.Title == "" {
			t.Errorf("%s: no description or title", d.Name)
		}
		var s jsonschema.Schema
		if err := json.Unmarshal(d.InputSchema, &s); err != nil {
			t.Fatalf("%s: %v", d.Name, err)
		}
		if _, err := s.Resolve(nil); err != nil {
			t.Errorf("%s: schema does not resolve: %v", d.Name, err)
		}
		if s.Type != "object" || s.AdditionalProperties == nil {
			t.Errorf("%s: want an object schema that refuses unknown properties", d.Name)
		}
		v, ok := args[d.Name]
		if !ok {
			t.Errorf("tools.json defines %s, which has no arguments type", d.Name)
			continue
		}
		wantFields(t, d.Name, &s, reflect.TypeOf(v))
	}
	if len(names) != len(args) {
		t.Errorf("tools.json has %v, the handlers %d tools", names, len(args))
	}
	// The session id rule is the worker's (nsjail/inside), not a copy.
	def, _ := Tool("create_session")
	var s jsonschema.Schema
	json.Unmarshal(def.InputSchema, &s)
	if got, want := s.Properties["session_id"].Pattern, "^"+inside.IDRule+"$"; got != want {
		t.Errorf("create_session session_id pattern %q, want %q", got, want)
	}
	// So is the runtime name's (server/config).
	for _, name := range []string{"run_python", "create_session"} {
		def, _ := Tool(name)
		var s jsonschema.Schema
		json.Unmarshal(def.InputSchema, &s)
		if got, want := s.Properties["runtime"].Pattern, "^"+config.RuntimeNameRule+"$"; got != want {
			t.Errorf("%s runtime pattern %q, want %q", name, got, want)
		}
	}

	cs := connect(t, InProcess(http.NotFoundHandler()))
	listed, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tool := range listed.Tools {
		got = append(got, tool.Name)
		def, _ := Tool(tool.Name)
		schema, _ := json.Marshal(tool.InputSchema)
		var a, b any
		json.Unmarshal(schema, &a)
		json.Unmarshal(def.InputSchema, &b)
		if !reflect.DeepEqual(a, b) || tool.Description != def.Description {
			t.Errorf("%s: listed schema or description differs from tools.json", tool.Name)
		}
	}
	sort.Strings(got)
	sort.Strings(names)
	if !slices.Equal(got, names) {
		t.Errorf("listed %v, tools.json %v", got, names)
	}
}

// wantFields checks that schema s has exactly typ's JSON fields as
// properties (recursively for arrays of objects), and requires only
// fields typ has without omitempty.
func wantFields(t *testing.T, where string, s *jsonschema.Schema, typ reflect.Type) {
	t.Helper()
	var fields, always []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		fields = append(fields, name)
		if !strings.Contains(opts, "omitempty") {
			always = append(always, name)
		}
		if p := s.Properties[name]; p != nil && p.Type == "array" && f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct {
			wantFields(t, where+"."+name+"[]", p.Items, f.Type.Elem())
		}
	}
	var props []string
	for p := range s.Properties {
		props = append(props, p)
	}
	sort.Strings(fields)
	sort.Strings(props)
	if !slices.Equal(fields, props) {
		t.Errorf("%s: schema properties %v, Go fields %v", where, props, fields)
	}
	req := slices.Clone(s.Required)
	sort.Strings(req)
	sort.Strings(always)
	if !slices.Equal(req, always) {
		t.Errorf("%s: schema requires %v, Go type has %v without omitempty", where, req, always)
	}
}

var pngBytes = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDRfake")

// failedAnswer is an execution's answer in the typed-results shape:
// stdout, a typed error with its text and a hint, a figure and a CSV.
func failedAnswer(id string) map[string]any {
	return map[string]any{
		"id": id, "type": "dynamic", "status": "failed", "exit_code": 1, "signal": nil,
		"stdout": "rows: 3\n", "stderr": "Traceback (most recent call last):\n  File \"/workspace/code/main.py\", line 2\nKeyError: 'revenue'\n",
		"stdout_truncated": false, "stderr_truncated": false, "result": nil, "result_error": "output/result.json is missing",
		"artifacts": []map[string]any{
			{"name": "figure-1.png", "size": len(pngBytes), "media_type": "image/png", "sha256": "x", "content_base64": base64.StdEncoding.EncodeToString(pngBytes), "width": 640, "height": 480},
			{"name": "out/table.csv", "size": 8, "media_type": "text/csv", "sha256": "y", "content_base64": base64.StdEncoding.EncodeToString([]byte("a,b\n1,2\n"))},
		},
		"artifacts_omitted": []any{}, "limits_hit": []any{},
		"policy": map[string]any{"timeout_ms": 30000, "memory_mb": 1024},
		"error": map[string]any{"type": "KeyError", "message": "'revenue'", "line": 2,
			"text": "Traceback (most recent call last):\n  File \"/workspace/code/main.py\", line 2, in <module>\n    df['revenue']\nKeyError: 'revenue'\n",
			"hint": "columns: region, amount"},
		"display": []any{},
	}
}

// fakeAPI answers POST /v1/executions and GET /v1/executions/{id} with
// failedAnswer, recording the requests.
type fakeAPI struct {
	mu    sync.Mutex
	calls []string
	post  func(w http.ResponseWriter, r *http.Request, body map[string]any)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	switch {
	case r.Method == "POST" && (r.URL.Path == "/v1/executions" || strings.HasPrefix(r.URL.Path, "/v1/sessions/") && strings.HasSuffix(r.URL.Path, "/executions")):
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		if f.post != nil {
			f.post(w, r, body)
			return
		}
		json.NewEncoder(w).Encode(failedAnswer(body["id"].(string)))
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/v1/executions/") && strings.Contains(r.URL.Path, "/artifacts/"):
		id, name, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/executions/"), "/artifacts/")
		for _, a := range failedAnswer(id)["artifacts"].([]map[string]any) {
			if a["name"] == name {
				data, _ := base64.StdEncoding.DecodeString(a["content_base64"].(string))
				w.Header().Set("Content-Type", a["media_type"].(string))
				w.Write(data)
				return
			}
		}
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error": "no artifact"}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error": "no such endpoint"}`)
	}
}

func (f *fakeAPI) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// run_python's result: the traceback as Python prints it (not stderr
// again), the hint, isError, the PNG as an image block (no base64 in any
// text), the CSV as a resource link that reads back, and the whole answer
// as structuredContent with artifacts by URI.
func TestRunPythonResult(t *testing.T) {
	cs := connect(t, InProcess(&fakeAPI{}))
	ctx := context.Background()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "df['revenue']"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError {
		t.Error("a failed run must be isError")
	}
	tc, ok := res.Content[0].(*sdk.TextContent)
	if !ok {
		t.Fatalf("first block %T, want text", res.Content[0])
	}
	for _, want := range []string{"rows: 3", "    df['revenue']\nKeyError: 'revenue'", "Hint: columns: region, amount", "exit code 1"} {
		if !strings.Contains(tc.Text, want) {
			t.Errorf("text lacks %q:\n%s", want, tc.Text)
		}
	}
	if strings.Contains(tc.Text, "[stderr") || strings.Contains(tc.Text, "result.json") {
		t.Errorf("text repeats stderr or a missing result.json:\n%s", tc.Text)
	}
	if strings.Index(tc.Text, "rows: 3") > strings.Index(tc.Text, "Traceback") {
		t.Errorf("stdout must come before the error:\n%s", tc.Text)
	}
	if len(res.Content) != 3 {
		t.Fatalf("%d blocks, want text, image, link", len(res.Content))
	}
	img, ok := res.Content[1].(*sdk.ImageContent)
	if !ok || img.MIMEType != "image/png" || !bytes.Equal(img.Data, pngBytes) {
		t.Fatalf("block 1: %#v", res.Content[1])
	}
	link, ok := res.Content[2].(*sdk.ResourceLink)
	if !ok || link.Name != "out/table.csv" || link.MIMEType != "text/csv" || link.Size == nil || *link.Size != 8 {
		t.Fatalf("block 2: %#v", res.Content[2])
	}
	var answer struct {
		ID        string           `json:"id"`
		Error     map[string]any   `json:"error"`
		Display   []any            `json:"display"`
		Artifacts []map[string]any `json:"artifacts"`
	}
	data, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(data, &answer); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(answer.ID, "mcp-") || answer.Error["type"] != "KeyError" || answer.Display == nil || len(answer.Artifacts) != 2 {
		t.Fatalf("structuredContent: %s", data)
	}
	if bytes.Contains(data, []byte("content_base64")) || answer.Artifacts[1]["uri"] != link.URI {
		t.Fatalf("structured artifacts: %v (link %s)", answer.Artifacts, link.URI)
	}
	if want := "sandboxd://executions/" + answer.ID + "/artifacts/out/table.csv"; link.URI != want {
		t.Errorf("link %s, want %s", link.URI, want)
	}
	rr, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: link.URI})
	if err != nil || rr.Contents[0].Text != "a,b\n1,2\n" || rr.Contents[0].MIMEType != "text/csv" {
		t.Fatalf("read %s: %v %+v", link.URI, err, rr)
	}
	rr, err = cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: ArtifactURI(answer.ID, "figure-1.png")})
	if err != nil || !bytes.Equal(rr.Contents[0].Blob, pngBytes) {
		t.Fatalf("read the figure: %v %+v", err, rr)
	}
	if _, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: ArtifactURI(answer.ID, "nope.txt")}); err == nil {
		t.Fatal("reading an artifact the execution does not have succeeded")
	}
}

// Without a typed error (a worker before typed results, or a crash that
// raised none), the end of stderr is shown.
func TestAnswerTextStderrTail(t *testing.T) {
	long := strings.Repeat("warning line\n", 1000) + "RuntimeError: boom\n"
	a := &execAnswer{Status: "failed", ExitCode: 1, Stderr: long}
	got := answerText(a)
	if !strings.Contains(got, "[stderr, last part]") || !strings.Contains(got, "RuntimeError: boom") || len(got) > stderrTailBytes+200 {
		t.Fatalf("text (%d bytes):\n%s", len(got), got)
	}
	a = &execAnswer{Status: "timeout", Policy: struct {
		TimeoutMS int64 `json:"timeout_ms"`
		MemoryMB  int64 `json:"memory_mb"`
	}{TimeoutMS: 2000}}
	if got := answerText(a); !strings.Contains(got, "Timed out") || !strings.Contains(got, "2 s") {
		t.Fatalf("timeout text: %q", got)
	}
	if got := answerText(&execAnswer{Status: "succeeded"}); got != "(no output)" {
		t.Fatalf("empty run: %q", got)
	}
}

// The stdio bridge retries 429 and 503 after the worker's Retry-After,
// sending the same request (the same execution id) again, with the token.
func TestRemoteRetriesHonourRetryAfter(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		data, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(data))
		n := len(bodies)
		mu.Unlock()
		switch n {
		case 1:
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error": "over capacity"}`)
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable) // no Retry-After: backoff
			io.WriteString(w, `{"error": "not ready"}`)
		default:
			var body map[string]any
			json.Unmarshal(data, &body)
			a := failedAnswer(body["id"].(string))
			a["status"], a["error"], a["exit_code"] = "succeeded", nil, 0
			json.NewEncoder(w).Encode(a)
		}
	}))
	defer hs.Close()
	b, err := Remote(hs.URL, "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	var waits []time.Duration
	b.sleep = func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	res, err := connect(t, b).CallTool(context.Background(), &sdk.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(1)"}})
	if err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}
	if !slices.Equal(waits, []time.Duration{3 * time.Second, 2 * time.Second}) {
		t.Errorf("waits %v, want [3s 2s] (Retry-After, then backoff)", waits)
	}
	if len(bodies) != 3 || bodies[0] != bodies[1] || bodies[1] != bodies[2] {
		t.Errorf("retries must resend the same request: %q", bodies)
	}

	// Out of retries: the refusal is a tool error the model reads.
	b.retries = 0
	mu.Lock()
	bodies = nil
	mu.Unlock()
	res, err = connect(t, b).CallTool(context.Background(), &sdk.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "print(1)"}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*sdk.TextContent).Text, "429") {
		t.Fatalf("no retries left: %v %+v", err, res)
	}
}

// A call the client cancels cancels its execution (DELETE by the id the
// POST named), as the run would otherwise outlive its connection; a
// session's execution by its session route, which reaches the session's
// owner through any worker (forwarding).
func TestCancelledCallCancelsExecution(t *testing.T) {
	for _, c := range []struct {
		name, prefix string
		args         map[string]any
	}{
		{"single-shot", "/v1/executions/", map[string]any{}},
		{"session", "/v1/sessions/se-1/executions/", map[string]any{"session_id": "se-1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			posted := make(chan string, 1)
			api := &fakeAPI{post: func(w http.ResponseWriter, r *http.Request, body map[string]any) {
				posted <- body["id"].(string)
				<-r.Context().Done()
			}}
			cs := connect(t, InProcess(api))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			args := map[string]any{"code": "import time; time.sleep(60)"}
			maps.Copy(args, c.args)
			go func() {
				_, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_python", Arguments: args})
				done <- err
			}()
			id := <-posted
			cancel()
			<-done
			want := "DELETE " + c.prefix + id
			for deadline := time.Now().Add(10 * time.Second); !slices.Contains(api.seen(), want); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("calls %v, want %s", api.seen(), want)
				}
			}
		})
	}
}

// Bad arguments are tool errors (isError, a message for the model), and
// nothing reaches the API: a session id or a path that would change the
// URL's meaning never becomes part of one.
func TestBadArgumentsAreToolErrors(t *testing.T) {
	api := &fakeAPI{}
	cs := connect(t, InProcess(api))
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_python", map[string]any{"code": "1", "session_id": "x/files/y"}, "not a session id"},
		{"run_python", map[string]any{"code": "1", "files": []any{map[string]any{"path": "a.csv"}}}, "text or content_base64"},
		{"run_python", map[string]any{"code": "1", "files": []any{map[string]any{"path": "../a", "text": "x"}}}, "clean relative path"},
		{"upload_file", map[string]any{"session_id": "s", "path": "a", "text": "x", "content_base64": "eA=="}, "not both"},
		{"upload_file", map[string]any{"session_id": "s", "path": "a", "content_base64": "!!"}, "not valid base64"},
		{"read_file", map[string]any{"session_id": "s", "path": "/etc/passwd"}, "relative path"},
		{"close_session", map[string]any{"session_id": ".."}, "not a session id"},
		{"run_python", map[string]any{}, "code"}, // schema: required
		{"run_python", map[string]any{"code": "1", "bogus": 1}, "bogus"},
	} {
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Errorf("%s %v: protocol error %v, want a tool error", c.tool, c.args, err)
			continue
		}
		if text := res.Content[0].(*sdk.TextContent).Text; !res.IsError || !strings.Contains(text, c.want) {
			t.Errorf("%s %v: isError %v, text %q, want %q", c.tool, c.args, res.IsError, text, c.want)
		}
	}
	if calls := api.seen(); len(calls) > 0 {
		t.Errorf("bad arguments reached the API: %v", calls)
	}
}

func TestResourceURIs(t *testing.T) {
	for _, name := range []string{"chart.png", "sub dir/a%b#c?.csv", "ü/x.json"} {
		uri := ArtifactURI("exec-1", name)
		id, got, ok := parseURI(uri, artifactsPrefix, "artifacts")
		if !ok || id != "exec-1" || got != name {
			t.Errorf("%q → %s → %q %q %v", name, uri, id, got, ok)
		}
	}
	for _, uri := range []string{
		"sandboxd://sessions/s/files/", "sandboxd://sessions//files/a", "sandboxd://sessions/s/files/a//b",
		"sandboxd://sessions/s/other/a", "file:///etc/passwd", "sandboxd://sessions/s/files/a%2Fb",
	} {
		if _, _, ok := parseURI(uri, sessionsPrefix, "files"); ok {
			t.Errorf("%s parsed", uri)
		}
	}
}

// The in-process transport hands over status, headers and the body as the
// handler streams it, and turns a handler's panic into an error.
func TestHandlerTransport(t *testing.T) {
	c := &http.Client{Transport: handlerTransport{http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic("boom")
		}
		w.Header().Set("X-Path", r.URL.Path)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "part 1,")
		w.(http.Flusher).Flush()
		io.WriteString(w, "part 2")
	})}}
	resp, err := c.Get("http://sandboxd.internal/v1/x?y=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("X-Path") != "/v1/x" || string(body) != "part 1,part 2" {
		t.Fatalf("%d %v %q", resp.StatusCode, resp.Header, body)
	}
	resp, err = c.Get("http://sandboxd.internal/panic")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode < 500 {
			t.Fatalf("a panicking handler answered %d without an error", resp.StatusCode)
		}
	}
}

// Over Streamable HTTP, a client that goes away (its request cancelled, the
// connection closed) cancels the tool call and so its execution.
func TestHTTPClientGoneCancelsExecution(t *testing.T) {
	posted := make(chan string, 1)
	api := &fakeAPI{post: func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		posted <- body["id"].(string)
		<-r.Context().Done()
	}}
	hs := httptest.NewServer(Handler(InProcess(api), 1<<20, nil))
	defer hs.Close()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
		&sdk.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "import time; time.sleep(60)"}})
		done <- err
	}()
	id := <-posted
	cancel()
	<-done
	want := "DELETE /v1/executions/" + id
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(api.seen(), want); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("calls %v, want %s", api.seen(), want)
		}
	}
}
