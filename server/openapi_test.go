package server

import (
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/runner"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/volume"
)

type openapiDoc struct {
	OpenAPI string `json:"openapi"`
	Paths   map[string]map[string]struct {
		RequestBody *struct {
			Content map[string]struct {
				Schema struct {
					Ref string `json:"$ref"`
				} `json:"schema"`
			} `json:"content"`
		} `json:"requestBody"`
		Responses map[string]json.RawMessage `json:"responses"`
	} `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		} `json:"schemas"`
	} `json:"components"`
}

// TestOpenAPIMatchesHandlers keeps /openapi.json honest: the same routes and
// methods as the router, and every schema the same fields (and required
// fields) as the Go type the handlers encode or decode.
func TestOpenAPIMatchesHandlers(t *testing.T) {
	var doc openapiDoc
	dec := json.NewDecoder(strings.NewReader(string(openapiJSON)))
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi version %q", doc.OpenAPI)
	}
	s := &Server{}
	var fromRouter, fromDoc []string
	for _, r := range s.routes() {
		p := r.path
		for _, seg := range strings.Split(p, "/") {
			if strings.HasPrefix(seg, ":") || strings.HasPrefix(seg, "*") {
				p = strings.Replace(p, seg, "{"+seg[1:]+"}", 1)
			}
		}
		fromRouter = append(fromRouter, r.method+" "+p)
	}
	for p, ops := range doc.Paths {
		for m := range ops {
			fromDoc = append(fromDoc, strings.ToUpper(m)+" "+p)
		}
	}
	sort.Strings(fromRouter)
	sort.Strings(fromDoc)
	if !slices.Equal(fromRouter, fromDoc) {
		t.Errorf("routes differ:\nrouter:  %v\nopenapi: %v", fromRouter, fromDoc)
	}

	types := map[string]any{
		"Error": errorBody{}, "File": File{}, "ExecutionRequest": ExecutionRequest{}, "Policy": Policy{}, "PolicyView": policyView{},
		"Usage": nsjail.Usage{}, "Artifact": Artifact{}, "Omitted": Omitted{}, "ExecutionResponse": ExecutionResponse{},
		"ExecutionPending": runningView{}, "ExecutionAccepted": accepted{}, "Policies": policiesResponse{}, "LegacyRequest": LegacyRequest{},
		"LegacyResponse": LegacyResponse{},
		"SessionRequest": SessionRequest{}, "Session": SessionView{}, "SessionKernel": session.KernelInfo{},
		"SessionWorkspace": session.WorkspaceInfo{}, "SessionList": sessionList{},
		"SessionExecutionRequest": SessionExecutionRequest{}, "SessionExecInfo": session.ExecInfo{},
		"FileInfo": FileInfo{}, "FileEntry": volume.Entry{}, "FileList": FileList{},
		"TypedError": runner.Error{}, "TracebackFrame": runner.Frame{}, "Display": runner.Display{},
		"Runtime": RuntimeView{}, "RuntimeList": runtimesResponse{},
	}
	for name, v := range types {
		sc, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("schema %s missing", name)
			continue
		}
		fields, required := jsonFields(reflect.TypeOf(v))
		var props []string
		for p := range sc.Properties {
			props = append(props, p)
		}
		sort.Strings(props)
		if !slices.Equal(props, fields) {
			t.Errorf("schema %s: properties %v, Go type %T has %v", name, props, v, fields)
		}
		req := slices.Clone(sc.Required)
		sort.Strings(req)
		for _, r := range req {
			if !slices.Contains(fields, r) {
				t.Errorf("schema %s requires unknown field %s", name, r)
			}
		}
		// Fields always encoded (no omitempty) must be required in responses.
		if strings.HasSuffix(name, "Response") || name == "ExecutionPending" || name == "ExecutionAccepted" || name == "Artifact" || name == "Omitted" ||
			name == "TypedError" || name == "TracebackFrame" || name == "Display" || strings.HasPrefix(name, "Runtime") ||
			strings.HasPrefix(name, "Session") && !strings.HasSuffix(name, "Request") || strings.HasPrefix(name, "File") {
			for _, f := range required {
				if !slices.Contains(req, f) {
					t.Errorf("schema %s: %s is always present but not required", name, f)
				}
			}
		}
	}
	// Both ways to run code stream events and answer asynchronously.
	for _, op := range []string{"/v1/executions", "/v1/sessions/{id}/executions"} {
		got := doc.Paths[op]["post"]
		var ok200 struct {
			Content map[string]json.RawMessage `json:"content"`
		}
		json.Unmarshal(got.Responses["200"], &ok200)
		if _, ok := ok200.Content["text/event-stream"]; !ok {
			t.Errorf("POST %s does not document its event stream", op)
		}
		if _, ok := got.Responses["202"]; !ok {
			t.Errorf("POST %s does not document 202 (respond-async)", op)
		}
	}
	for _, op := range []string{"/v1/executions", "/execute"} {
		got := doc.Paths[op]["post"]
		for _, code := range []int{200, 400, 401, 403, 413, 429, 503, 507} {
			if _, ok := got.Responses[strconv.Itoa(code)]; !ok {
				t.Errorf("POST %s does not document %d", op, code)
			}
		}
	}
}

// jsonFields lists the JSON names of t's fields, sorted, and those without
// omitempty.
func jsonFields(t reflect.Type) (all, always []string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if f.Anonymous && tag == "" {
			// Embedded: its fields are the outer object's.
			a, b := jsonFields(f.Type)
			all, always = append(all, a...), append(always, b...)
			continue
		}
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		all = append(all, name)
		if !strings.Contains(opts, "omitempty") {
			always = append(always, name)
		}
	}
	sort.Strings(all)
	sort.Strings(always)
	return all, always
}

// The served document is the embedded one.
func TestOpenAPIServed(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	code, h, body := e.do("GET", "/openapi.json", nil)
	if code != 200 || h.Get("Content-Type") != "application/json" || string(body) != string(openapiJSON) {
		t.Fatalf("GET /openapi.json = %d %s", code, h.Get("Content-Type"))
	}
}

// The document's id and runtime patterns are the rules (nsjail/inside,
// server/config), not copies that could drift from them.
func TestOpenAPIIDPatternIsTheRule(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Pattern string `json:"pattern"`
				} `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openapiJSON, &doc); err != nil {
		t.Fatal(err)
	}
	got := doc.Components.Schemas["ExecutionRequest"].Properties["id"].Pattern
	if want := "^" + inside.IDRule + "$"; got != want {
		t.Fatalf("openapi.json id pattern %q, want %q", got, want)
	}
	// And the runtime name's is the config's rule.
	for _, sc := range []string{"ExecutionRequest", "SessionRequest"} {
		if got, want := doc.Components.Schemas[sc].Properties["runtime"].Pattern, "^"+config.RuntimeNameRule+"$"; got != want {
			t.Errorf("openapi.json %s runtime pattern %q, want %q", sc, got, want)
		}
	}
}

// Every operation behind the guard (all but those marked open: security
// []) documents its 401.
func TestOpenAPIDocuments401(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]struct {
			Security  *[]any                     `json:"security"`
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(openapiJSON, &doc); err != nil {
		t.Fatal(err)
	}
	for path, ops := range doc.Paths {
		for m, op := range ops {
			if _, ok := op.Responses["401"]; !ok && (op.Security == nil || len(*op.Security) > 0) {
				t.Errorf("%s %s does not document its 401", strings.ToUpper(m), path)
			}
		}
	}
}
