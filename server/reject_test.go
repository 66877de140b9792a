package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/server/config"
)

// SECURITY.md cases 20 and 21, and every other 4xx path: a clear message, the
// right status, the rejection counted, and no sandbox started.
func TestRejections(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) {
		c.MaxCodeBytes = 1000
		c.MaxInputBytes = 2000
		c.MaxInputFiles = 3
	})
	big := strings.Repeat("x", 1001)
	cases := []struct {
		name, method, path string
		body               any
		hdr                []string
		status             int
		msg                string
	}{
		{"code too large", "POST", "/v1/executions", ExecutionRequest{Code: big}, nil, 413, "max_code_bytes"},
		{"input too large", "POST", "/v1/executions", ExecutionRequest{Code: "true", Input: json.RawMessage(`"` + strings.Repeat("y", 2001) + `"`)}, nil, 413, "max_input_bytes"},
		{"files too large", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "a", ContentBase64: b64(strings.Repeat("z", 2001))}}}, nil, 413, "max_input_bytes"},
		{"body too large", "POST", "/v1/executions", `{"code":"` + strings.Repeat("w", 100000) + `"}`, nil, 413, "request body"},
		{"bad json", "POST", "/v1/executions", `{"code": "true",`, nil, 400, "invalid JSON"},
		{"not an object", "POST", "/v1/executions", `[1,2]`, nil, 400, "invalid JSON"},
		{"unknown field", "POST", "/v1/executions", `{"code":"true","cmd":"x"}`, nil, 400, "unknown field"},
		{"trailing data", "POST", "/v1/executions", `{"code":"true"} {}`, nil, 400, "trailing data"},
		{"empty body", "POST", "/v1/executions", ``, nil, 400, "empty"},
		{"no code", "POST", "/v1/executions", ExecutionRequest{Code: " "}, nil, 400, "code is required"},
		{"unknown type", "POST", "/v1/executions", ExecutionRequest{Code: "true", Type: "root"}, nil, 400, `unknown type "root"`},
		{"timeout above max", "POST", "/v1/executions", ExecutionRequest{Code: "true", TimeoutMS: 30001}, nil, 400, "timeout_ms must be <= 30000"},
		{"negative timeout", "POST", "/v1/executions", ExecutionRequest{Code: "true", TimeoutMS: -1}, nil, 400, "timeout_ms must be > 0"},
		{"file path ..", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "../../etc/cron.d/x", ContentBase64: ""}}}, nil, 400, "contains .."},
		{"file path inner ..", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "a/../../b", ContentBase64: ""}}}, nil, 400, "contains .."},
		{"file path absolute", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "/etc/passwd", ContentBase64: ""}}}, nil, 400, "absolute"},
		{"file path unclean", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "a//b", ContentBase64: ""}}}, nil, 400, "not a clean"},
		{"file path reserved", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "request.json", ContentBase64: ""}}}, nil, 400, "reserved"},
		// These three failed with 500 when the workspace was written (or,
		// without input, made request.json a directory).
		{"file path dot", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "."}}}, nil, 400, "names the directory itself"},
		{"file path dot slash", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "./"}}}, nil, 400, "not a clean"},
		{"file under reserved", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "request.json/x"}}}, nil, 400, "reserved"},
		{"file under reserved with input", "POST", "/v1/executions", ExecutionRequest{Code: "true", Input: json.RawMessage(`{}`), Files: []File{{Path: "request.json/a/b"}}}, nil, 400, "reserved"},
		{"too many files", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "a"}, {Path: "b"}, {Path: "c"}, {Path: "d"}}}, nil, 413, "4 files, more than max_input_files (3)"},
		{"too many entries", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "a/b/c"}, {Path: "a/d"}}}, nil, 413, "4 entries under input/ (2 files, 2 directories)"},
		{"file duplicate", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "a"}, {Path: "a"}}}, nil, 400, "duplicate"},
		{"file and dir", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "a"}, {Path: "a/b"}}}, nil, 400, "both a file and a directory"},
		{"bad base64", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: "a", ContentBase64: "!!"}}}, nil, 400, "not valid base64"},
		{"env not allowed", "POST", "/v1/executions", ExecutionRequest{Code: "true", Env: map[string]string{"LD_PRELOAD": "/x.so"}}, nil, 400, "not allowed"},
		{"bad id", "POST", "/v1/executions", ExecutionRequest{Code: "true", ID: "../x"}, nil, 400, "id"},
		{"foreign host", "POST", "/v1/executions", ExecutionRequest{Code: "true"}, []string{"Host", "evil.example"}, 403, "DNS-rebinding"},
		{"foreign host with port", "GET", "/v1/policies", nil, []string{"Host", "attacker.test:3100"}, 403, "not allowed"},
		{"origin", "POST", "/v1/executions", ExecutionRequest{Code: "true"}, []string{"Origin", "http://127.0.0.1:3100"}, 403, "Origin"},
		{"origin on GET", "GET", "/v1/policies", nil, []string{"Origin", "null"}, 403, "Origin"},
		{"referer", "POST", "/execute", LegacyRequest{Code: "true"}, []string{"Referer", "http://evil.example/"}, 403, "CSRF"},
		{"legacy bad json", "POST", "/execute", `{"code":`, nil, 400, "invalid JSON"},
		{"legacy negative timeout", "POST", "/execute", `{"code":"true","timeout":-1}`, nil, 400, "timeout"},
		{"legacy too large", "POST", "/execute", LegacyRequest{Code: big}, nil, 413, "max_code_bytes"},
		{"get unknown", "GET", "/v1/executions/nope", nil, nil, 404, "no execution"},
		{"delete unknown", "DELETE", "/v1/executions/nope", nil, nil, 404, "no execution"},
		{"no such endpoint", "GET", "/v2/x", nil, nil, 404, "no such endpoint"},
		{"wrong method", "PUT", "/v1/executions", nil, nil, 405, "method not allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, body := e.do(c.method, c.path, c.body, c.hdr...)
			var eb errorBody
			if code != c.status || json.Unmarshal(body, &eb) != nil || !strings.Contains(eb.Error, c.msg) {
				t.Fatalf("%s %s = %d %s; want %d with %q", c.method, c.path, code, body, c.status, c.msg)
			}
		})
	}
	if n := e.sandbox.started.Load(); n != 0 {
		t.Fatalf("%d sandboxes started for rejected requests", n)
	}
	e.wantNoWorkspaces()
	_, _, metrics := e.do("GET", "/metrics", nil)
	for _, want := range []string{`reason="too_large"} 7`, `reason="forbidden"} 5`, `reason="bad_request"} 25`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// A duplicate id with another request is a conflict, not a second run
	// (the same request is a retry: TestRetryGetsTheSameExecution).
	wantExecStatus(t, e.execute(ExecutionRequest{ID: "once", Code: "true"}), "succeeded")
	if code, _, body := e.do("POST", "/v1/executions", ExecutionRequest{ID: "once", Code: "true "}); code != http.StatusConflict ||
		!strings.Contains(string(body), "taken by a different request") {
		t.Fatalf("duplicate id = %d %s", code, body)
	}
	if code, _, _ := e.do("DELETE", "/v1/executions/once", nil); code != http.StatusConflict {
		t.Fatalf("DELETE of a finished execution = %d", code)
	}
	if n := e.sandbox.started.Load(); n != 1 {
		t.Fatalf("%d sandboxes started, want 1", n)
	}
}

func TestBearerToken(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) { c.WorkerToken = "s3cret-token" })
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"Authorization", "s3cret-token"}, {"Authorization", "Basic czNjcmV0LXRva2Vu"}} {
		code, h, body := e.do("POST", "/v1/executions", ExecutionRequest{Code: "true"}, hdr...)
		if code != http.StatusUnauthorized || !strings.Contains(h.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("with %v: %d %s", hdr, code, body)
		}
		if code, _, _ := e.do("GET", "/v1/executions/x", nil, hdr...); code != http.StatusUnauthorized {
			t.Fatalf("GET with %v: %d", hdr, code)
		}
	}
	if n := e.sandbox.started.Load(); n != 0 {
		t.Fatalf("%d sandboxes started without the token", n)
	}
	// The probes stay open for the service manager.
	if code, _, _ := e.do("GET", "/healthz", nil); code != 200 {
		t.Fatalf("healthz = %d", code)
	}
	code, _, body := e.do("POST", "/v1/executions", ExecutionRequest{Code: "echo ok"}, "Authorization", "Bearer s3cret-token")
	if code != 200 || !strings.Contains(string(body), `"stdout":"ok\n"`) {
		t.Fatalf("with the token: %d %s", code, body)
	}
}
