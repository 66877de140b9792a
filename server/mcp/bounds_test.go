package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// SECURITY.md case 55 (and the review's injection): an artifact URI whose
// id or name, unescaped, would leave the artifact route (x%2Fevents,
// ..%2F..%2Fmetrics) is not found, and no API call is made for it.
func TestArtifactURIInjectionRefused(t *testing.T) {
	api := &fakeAPI{}
	cs := connect(t, InProcess(api))
	for _, uri := range []string{
		"sandboxd://executions/x%2Fevents/artifacts/a.txt",
		"sandboxd://executions/..%2F..%2Fmetrics/artifacts/a.txt",
		"sandboxd://executions/ok/artifacts/..%2F..%2Fmetrics",
		"sandboxd://executions/ok/artifacts/a/%2E%2E/%2E%2E/%2E%2E/metrics",
		"sandboxd://executions/ok/artifacts/.",
		"sandboxd://executions/a%20b/artifacts/x.png",
	} {
		_, err := cs.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: uri})
		if err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("read %s: %v, want resource not found", uri, err)
		}
	}
	if calls := api.seen(); len(calls) != 0 {
		t.Fatalf("API calls made: %v", calls)
	}
}

// A redirect is answered, never followed, on both backends: the API never
// redirects a tool's call, and httprouter's cleaned-path redirect would
// reach another route.
func TestRedirectsNotFollowed(t *testing.T) {
	var followed atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			followed.Add(1)
			io.WriteString(w, "secret_metric 1\n")
			return
		}
		http.Redirect(w, r, "/metrics", http.StatusMovedPermanently)
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	remote, err := Remote(srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*Backend{"in-process": InProcess(h), "remote": remote} {
		_, err := b.do(context.Background(), http.MethodGet, "/v1/executions/x/artifacts/a", nil, nil)
		var ae *apiError
		if !errors.As(err, &ae) || ae.Status != http.StatusMovedPermanently {
			t.Errorf("%s: %v, want a 301 apiError", name, err)
		}
	}
	if n := followed.Load(); n != 0 {
		t.Fatalf("a redirect was followed %d times", n)
	}
}

// answerWith is an execution's answer with these artifacts (name → media
// type and size; the bytes are a repeated letter).
func answerWith(arts [][3]any) []byte {
	var list []map[string]any
	for _, a := range arts {
		data := bytes.Repeat([]byte{'x'}, a[2].(int))
		list = append(list, map[string]any{"name": a[0], "media_type": a[1], "size": a[2], "sha256": "s",
			"content_base64": base64.StdEncoding.EncodeToString(data)})
	}
	out, _ := json.Marshal(map[string]any{"id": "e1", "status": "succeeded", "stdout": "hi\n", "artifacts": list, "display": []any{}})
	return out
}

// Images are inlined as clients take them: PNG, JPEG, GIF, WebP (never
// SVG), each at most maxInlineImage, at most maxInlineImages per answer;
// the rest are links. No base64 is left in the structured copy.
func TestRunPythonImageCaps(t *testing.T) {
	const mb = 1 << 20
	raw := answerWith([][3]any{
		{"a.png", "image/png", 5 * mb}, {"b.jpg", "image/jpeg", 5 * mb}, {"c.svg", "image/svg+xml", 100},
		{"big.png", "image/png", 5*mb + 1}, {"d.webp", "image/webp", 5 * mb}, {"e.gif", "image/gif", 2 * mb},
		{"f.gif", "image/gif", 1 * mb}, {"t.csv", "text/csv", 10},
	})
	res, err := executionResult(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range res.Content[1:] {
		switch c := c.(type) {
		case *sdk.ImageContent:
			got = append(got, "image "+c.MIMEType+fmt.Sprint(len(c.Data)))
		case *sdk.ResourceLink:
			got = append(got, "link "+c.Name)
		}
	}
	// 5+5+5 = 15 MiB inlined; e.gif (2 MiB) would pass 16 MiB, f.gif fits.
	want := []string{"image image/png5242880", "image image/jpeg5242880", "link c.svg", "link big.png",
		"image image/webp5242880", "link e.gif", "image image/gif1048576", "link t.csv"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("blocks:\n got %v\nwant %v", got, want)
	}
	data, _ := json.Marshal(res.StructuredContent)
	if bytes.Contains(data, []byte("content_base64")) || bytes.Contains(data, []byte("eHh4")) {
		t.Fatal("base64 left in structuredContent")
	}
}

// SECURITY.md case 55: run_python reads the answer once, as it streams,
// holding one artifact's base64 at a time: an answer of four 8 MiB
// artifacts (43 MiB of base64) allocates less than the answer's size in
// all (the decoder's buffer, grown by doubling to one artifact's base64
// and reused), where reading it whole alone would allocate more.
func TestRunPythonAnswerMemory(t *testing.T) {
	const n = 8 << 20
	raw := answerWith([][3]any{{"a.bin", "application/octet-stream", n}, {"b.bin", "application/octet-stream", n},
		{"c.bin", "application/octet-stream", n}, {"d.bin", "application/octet-stream", n}})
	oneB64 := uint64(base64.StdEncoding.EncodedLen(n))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, err := executionResult(bytes.NewReader(raw))
	runtime.ReadMemStats(&after)
	if err != nil || len(res.Content) != 5 {
		t.Fatalf("%v %v", err, res)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc >= uint64(len(raw)) || alloc > 4*oneB64 {
		t.Fatalf("parsing a %d-byte answer allocated %d bytes, want less than the answer (one artifact's base64: %d)", len(raw), alloc, oneB64)
	}
}
