package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

const mcpTestToken = "mcp-test-token"

// TestMCP drives a real `sandboxd serve` (runtime image, token set) with
// the MCP SDK's own client over both transports: Streamable HTTP at /mcp,
// and stdio through a real `sandboxd mcp` child process forwarding to the
// worker. Each runs the same agent scenario; the guard is checked on /mcp.
func TestMCP(t *testing.T) {
	nsjailtest.RequireRoot(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	sessions := filepath.Join(t.TempDir(), "sessions")
	t.Cleanup(func() { unmountBelow(t, sessions) })
	// Short connection timeouts: a tool call that runs longer than
	// read_timeout and write_timeout must still be answered (they bound
	// what the client does, never how long code runs).
	w := startWorker(t, "mcp", rootfs, "EXECUTION_WORKER_TOKEN="+mcpTestToken, "EXECUTION_SESSIONS_DIR="+sessions,
		"EXECUTION_READ_HEADER_TIMEOUT=1s", "EXECUTION_READ_TIMEOUT=1s", "EXECUTION_WRITE_TIMEOUT=2s")
	bin := buildCLI(t)

	t.Run("http", func(t *testing.T) {
		hc := &http.Client{Transport: headerTransport{"Authorization": "Bearer " + mcpTestToken}}
		cs := connectMCP(t, &sdk.StreamableClientTransport{Endpoint: w.base + "/mcp", HTTPClient: hc, MaxRetries: -1})
		mcpScenario(t, cs)
		res := callTool(t, cs, "run_python", map[string]any{"code": "import time\ntime.sleep(2.5)\nprint('slept')"})
		if res.IsError || !strings.Contains(text(res), "slept") {
			t.Fatalf("a run outliving read_timeout: isError %v, text %q", res.IsError, text(res))
		}
	})
	t.Run("stdio", func(t *testing.T) {
		cmd := exec.Command(bin, "mcp", "--url", w.base)
		cmd.Env = append(os.Environ(), "EXECUTION_WORKER_TOKEN="+mcpTestToken)
		cmd.Stderr = os.Stderr
		cs := connectMCP(t, &sdk.CommandTransport{Command: cmd})
		mcpScenario(t, cs)
	})
	t.Run("guard", func(t *testing.T) {
		initialize := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`
		for _, c := range []struct {
			name string
			hdr  map[string]string
			want int
		}{
			{"origin", map[string]string{"Authorization": "Bearer " + mcpTestToken, "Origin": "https://evil.example"}, http.StatusForbidden},
			{"referer", map[string]string{"Authorization": "Bearer " + mcpTestToken, "Referer": "https://evil.example/x"}, http.StatusForbidden},
			{"no token", nil, http.StatusUnauthorized},
			{"wrong token", map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
		} {
			req, _ := http.NewRequest("POST", w.base+"/mcp", strings.NewReader(initialize))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			for k, v := range c.hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("%s: POST /mcp = %d, want %d", c.name, resp.StatusCode, c.want)
			}
		}
		// The SDK's client from a browser-like origin cannot even connect.
		hc := &http.Client{Transport: headerTransport{"Authorization": "Bearer " + mcpTestToken, "Origin": "https://evil.example"}}
		client := sdk.NewClient(&sdk.Implementation{Name: "sandboxd-test", Version: "1"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: w.base + "/mcp", HTTPClient: hc, MaxRetries: -1}, nil); err == nil {
			_, err = cs.ListTools(ctx, nil)
			cs.Close()
			if err == nil {
				t.Fatal("an MCP client sending Origin was served")
			}
		}
		// Stateless: no standalone stream, no session to delete.
		req, _ := http.NewRequest("GET", w.base+"/mcp", nil)
		req.Header.Set("Authorization", "Bearer "+mcpTestToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("GET /mcp = %d, want 405", resp.StatusCode)
		}
	})
	w.stop(t)
}

// headerTransport adds headers to every request.
type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func connectMCP(t *testing.T, tr sdk.Transport) *sdk.ClientSession {
	t.Helper()
	client := sdk.NewClient(&sdk.Implementation{Name: "sandboxd-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// callTool calls a tool and fails the test on a protocol error.
func callTool(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

// text is a result's text blocks joined.
func text(res *sdk.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// structured decodes a result's structuredContent.
func structured(t *testing.T, res *sdk.CallToolResult, v any) {
	t.Helper()
	data, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("structuredContent: %v\n%s", err, data)
	}
}

func mcpScenario(t *testing.T, cs *sdk.ClientSession) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil {
			t.Errorf("tool %s lacks a description or schema", tool.Name)
		}
	}
	slices.Sort(names)
	if want := []string{"close_session", "create_session", "list_files", "read_file", "run_python", "upload_file"}; !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	// Pandas, one-off.
	res := callTool(t, cs, "run_python", map[string]any{
		"code": "import pandas as pd\ndf = pd.DataFrame({'city': ['a', 'b', 'a'], 'n': [1, 2, 3]})\nprint(df.groupby('city').n.sum().to_dict())",
	})
	if res.IsError || !strings.Contains(text(res), "{'a': 4, 'b': 2}") {
		t.Fatalf("pandas run: isError %v, text %q", res.IsError, text(res))
	}

	// A chart saved under output/artifacts/ is an image block; another
	// artifact is a resource link the client reads back.
	res = callTool(t, cs, "run_python", map[string]any{
		"code": "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n" +
			"plt.plot([1, 2, 3], [3, 1, 2])\nplt.savefig('output/artifacts/chart.png')\n" +
			"open('output/artifacts/table.csv', 'w').write('x,y\\n1,2\\n')\nprint('saved')",
	})
	if res.IsError {
		t.Fatalf("chart run failed: %s", text(res))
	}
	var image *sdk.ImageContent
	var link *sdk.ResourceLink
	for _, c := range res.Content {
		switch c := c.(type) {
		case *sdk.ImageContent:
			image = c
		case *sdk.ResourceLink:
			link = c
		}
	}
	if image == nil || image.MIMEType != "image/png" || !bytes.HasPrefix(image.Data, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("no PNG image block in %d blocks (text %q)", len(res.Content), text(res))
	}
	if strings.Contains(text(res), "iVBORw0KGgo") {
		t.Fatal("base64 of the PNG in the text")
	}
	var answer struct {
		ID        string           `json:"id"`
		Status    string           `json:"status"`
		Artifacts []map[string]any `json:"artifacts"`
	}
	structured(t, res, &answer)
	if answer.Status != "succeeded" || len(answer.Artifacts) != 2 {
		t.Fatalf("structuredContent: %+v", answer)
	}
	for _, a := range answer.Artifacts {
		if _, ok := a["content_base64"]; ok || a["uri"] == nil {
			t.Fatalf("structured artifact %v: want a uri and no base64", a)
		}
	}
	if link == nil || link.Name != "table.csv" {
		t.Fatalf("no resource link for table.csv: %+v", link)
	}
	rr, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: link.URI})
	if err != nil {
		t.Fatalf("read %s: %v", link.URI, err)
	}
	if len(rr.Contents) != 1 || rr.Contents[0].Text != "x,y\n1,2\n" {
		t.Fatalf("read %s: %+v", link.URI, rr.Contents)
	}

	// A failing run is a tool result with isError and the traceback.
	res = callTool(t, cs, "run_python", map[string]any{"code": "x = 1\nprint('before')\n1 / 0"})
	if !res.IsError || !strings.Contains(text(res), "ZeroDivisionError") || !strings.Contains(text(res), "before") {
		t.Fatalf("failing run: isError %v, text %q", res.IsError, text(res))
	}

	// A session keeps Python state and files across calls.
	res = callTool(t, cs, "create_session", map[string]any{})
	var sess struct {
		ID string `json:"id"`
	}
	structured(t, res, &sess)
	if res.IsError || sess.ID == "" {
		t.Fatalf("create_session: %q", text(res))
	}
	defer func() {
		if res := callTool(t, cs, "close_session", map[string]any{"session_id": sess.ID}); res.IsError {
			t.Errorf("close_session: %s", text(res))
		}
	}()
	res = callTool(t, cs, "upload_file", map[string]any{"session_id": sess.ID, "path": "input/sales.csv", "text": "region,amount\nnorth,10\nsouth,32\n"})
	if res.IsError {
		t.Fatalf("upload_file: %s", text(res))
	}
	res = callTool(t, cs, "run_python", map[string]any{"session_id": sess.ID,
		"code": "import pandas as pd\ndf = pd.read_csv('input/sales.csv')\ntotal = int(df.amount.sum())\ndf.to_csv('output/copy.csv', index=False)"})
	if res.IsError {
		t.Fatalf("session run 1: %s", text(res))
	}
	res = callTool(t, cs, "run_python", map[string]any{"session_id": sess.ID, "code": "print(total, len(df))"})
	if res.IsError || !strings.Contains(text(res), "42 2") {
		t.Fatalf("session run 2 (state kept): isError %v, text %q", res.IsError, text(res))
	}
	res = callTool(t, cs, "list_files", map[string]any{"session_id": sess.ID, "prefix": "output/"})
	if res.IsError || !strings.Contains(text(res), "output/copy.csv") {
		t.Fatalf("list_files: %q", text(res))
	}
	res = callTool(t, cs, "read_file", map[string]any{"session_id": sess.ID, "path": "output/copy.csv"})
	if res.IsError || text(res) != "region,amount\nnorth,10\nsouth,32\n" {
		t.Fatalf("read_file: %q", text(res))
	}
	rr, err = cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "sandboxd://sessions/" + sess.ID + "/files/input/sales.csv"})
	if err != nil || len(rr.Contents) != 1 || !strings.HasPrefix(rr.Contents[0].Text, "region,amount") {
		t.Fatalf("read session file resource: %v %+v", err, rr)
	}
	// A bad argument is a tool error the model can read, not a protocol error.
	res = callTool(t, cs, "read_file", map[string]any{"session_id": sess.ID, "path": "../etc/passwd"})
	if !res.IsError {
		t.Fatalf("read_file ../etc/passwd: %q", text(res))
	}
}
