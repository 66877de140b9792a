package server

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// artifactPath is the route of one artifact, its name escaped per segment.
func artifactPath(id, name string) string {
	segs := strings.Split(name, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "/v1/executions/" + url.PathEscape(id) + "/artifacts/" + strings.Join(segs, "/")
}

// GET /v1/executions/{id}/artifacts/{name} serves each artifact's own bytes
// (SECURITY.md case 55), found by its entry in the stored answer even when
// names and the answer's text hold what an entry looks like, with Range;
// unknown names and executions are 404, an unfinished execution 409. No
// root: the fake sandbox leaves the files (the real one: TestArtifactRoute).
func TestUnitArtifactRoute(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	files := map[string]string{
		"a.txt":                   "alpha",
		`0 {"name":"a.txt".bin`:   "bravo",
		"dir/é x.csv":             "x,y\n1,2\n",
		"empty.txt":               "",
		`q\"quote{"name":"z".txt`: "zulu",
	}
	u.fake.result = func(_ context.Context, spec nsjail.Spec) *nsjail.Result {
		dir := filepath.Join(spec.Workspace, inside.ArtifactsDir)
		for name, data := range files {
			os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
			os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644)
		}
		now := time.Now()
		return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusSucceeded, LimitsHit: []string{},
			Stdout: []byte(`{"name":"a.txt","content_base64":"` + "\n"), StartedAt: now, FinishedAt: now}
	}
	code, _, body := u.do("POST", "/v1/executions", `{"id": "arts", "code": "x"}`)
	if code != http.StatusOK {
		t.Fatalf("POST = %d %s", code, body)
	}
	for name, want := range files {
		code, h, body := u.do("GET", artifactPath("arts", name), nil)
		if code != http.StatusOK || string(body) != want {
			t.Errorf("GET %s = %d %q, want 200 %q", name, code, body, want)
			continue
		}
		if h.Get("Content-Disposition") != "attachment" || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("ETag") == "" {
			t.Errorf("GET %s: headers %v", name, h)
		}
	}
	code, h, body := u.do("GET", artifactPath("arts", "dir/é x.csv"), nil, "Range", "bytes=2-4")
	if code != http.StatusPartialContent || string(body) != "y\n1" || h.Get("Content-Type") != "text/csv" {
		t.Errorf("ranged GET = %d %q %v", code, body, h)
	}
	code, _, body = u.do("GET", artifactPath("arts", "missing.txt"), nil)
	wantError(t, code, body, http.StatusNotFound, "no artifact")
	code, _, body = u.do("GET", artifactPath("nope", "a.txt"), nil)
	wantError(t, code, body, http.StatusNotFound, "no execution")

	// An answer without artifacts (kept inline in the store's database).
	u.fake.result = nil
	code, _, body = u.do("POST", "/v1/executions", `{"id": "plain", "code": "x"}`)
	if code != http.StatusOK {
		t.Fatalf("POST = %d %s", code, body)
	}
	code, _, body = u.do("GET", artifactPath("plain", "a.txt"), nil)
	wantError(t, code, body, http.StatusNotFound, "no artifact")

	release := u.blockRuns(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		u.postCtx(context.Background(), ExecutionRequest{ID: "slow", Code: "x"})
	}()
	u.waitStatus("slow", StatusRunning)
	code, _, body = u.do("GET", artifactPath("slow", "a.txt"), nil)
	wantError(t, code, body, http.StatusConflict, "has not finished")
	release()
	<-done
}

func TestUnitCheckArtifactName(t *testing.T) {
	for _, ok := range []string{"a.png", "d/e/f.csv", "..x", "x.."} {
		if err := checkArtifactName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/a", "a//b", "./a", "a/..", "../../metrics", "a\x00b", strings.Repeat("a", 4097)} {
		if err := checkArtifactName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
