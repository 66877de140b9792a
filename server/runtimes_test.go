package server

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/rootfs"
	"github.com/sandboxd/sandboxd/server/config"
)

// The second runtime of the tests: the default image plus one small layer
// holding testRuntimeMarker, and a package label of its own, made here with
// go-containerregistry and unpacked by package rootfs once per test binary
// into a cache of its own (testRuntimesDir, removed by TestMain).
const (
	testRuntimeMarker = "/etc/sandboxd-test-runtime"
	testRuntimeLabel  = "sandboxd-test-runtime"
)

var (
	testRuntimesOnce sync.Once
	testRuntimesDir  string
	testRuntimeRef   string
	testRuntimeErr   string
)

// testRuntimeImage writes the second runtime's OCI layout, once, and
// returns its reference.
func testRuntimeImage(t *testing.T) string {
	t.Helper()
	base := nsjailtest.RuntimeImageRef(t)
	testRuntimesOnce.Do(func() {
		testRuntimeRef, testRuntimeErr = makeTestRuntime(base)
	})
	if testRuntimeErr != "" {
		t.Fatal(testRuntimeErr)
	}
	return testRuntimeRef
}

func makeTestRuntime(base string) (string, string) {
	dir, err := os.MkdirTemp("", "sandboxd-test-runtimes-")
	if err != nil {
		return "", err.Error()
	}
	testRuntimesDir = dir
	// The sandbox's mapped root must reach the rootfs cache below it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err.Error()
	}
	img, err := rootfs.Resolve(context.Background(), base)
	if err != nil {
		return "", "base image: " + err.Error()
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := []byte("the tests' second runtime\n")
	tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(testRuntimeMarker, "/"), Mode: 0o644, Size: int64(len(body)),
		Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)})
	tw.Write(body)
	tw.Close()
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return "", err.Error()
	}
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return "", err.Error()
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err.Error()
	}
	cf = cf.DeepCopy()
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	cf.Config.Labels[packageLabel+testRuntimeLabel] = "1.0"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err.Error()
	}
	out := filepath.Join(dir, "test-runtime.oci")
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return "", err.Error()
	}
	if err := p.AppendImage(img); err != nil {
		return "", err.Error()
	}
	return "oci-layout:" + out, ""
}

// removeTestRuntimes removes the second runtime's layout and cache.
func removeTestRuntimes() {
	if testRuntimesDir != "" {
		os.RemoveAll(testRuntimesDir)
	}
}

// testResolver resolves runtimes as `serve` does: a dir: reference is that
// tree; an image found in the cache that holds $SANDBOXD_RUNTIME_ROOTFS
// (the default image, unpacked by make) is taken from there, read only;
// anything else is unpacked into the tests' own cache.
func testResolver(t *testing.T, defaultRootfs string) func(context.Context, string, string) (rootfs.Image, error) {
	shared := filepath.Dir(filepath.Dir(filepath.Dir(defaultRootfs))) // CACHE/images/sha256-X/rootfs
	return func(ctx context.Context, _, ref string) (rootfs.Image, error) {
		if dir, ok := strings.CutPrefix(ref, "dir:"); ok {
			return rootfs.Image{RootfsPath: dir, Ref: ref, Labels: map[string]string{}}, nil
		}
		img, err := rootfs.Resolve(ctx, ref)
		if err != nil {
			return rootfs.Image{}, err
		}
		d, err := img.Digest()
		if err != nil {
			return rootfs.Image{}, err
		}
		if _, err := os.Stat(filepath.Join(shared, "images")); err == nil {
			if c, err := rootfs.Open(shared); err == nil {
				if _, ok := c.Lookup(d.String()); ok {
					return c.UnpackImage(ctx, ref, img) // found: nothing is written
				}
			}
		}
		c, err := rootfs.Open(filepath.Join(testRuntimesDir, "cache"))
		if err != nil {
			return rootfs.Image{}, err
		}
		start := time.Now()
		got, err := c.UnpackImage(ctx, ref, img)
		t.Logf("%s: cached %v, %d entries, %d bytes, in %s", ref, got.Cached, got.Entries, got.Bytes, time.Since(start))
		return got, err
	}
}

// Named runtimes end to end, on real sandboxes: a second image made from
// the default one is chosen per request, per session and per policy
// (skill_runtime); each (policy, runtime) with a pool size is served warm
// from its own template; an unknown name is a 400 that starts nothing;
// GET /v1/runtimes lists both with their versions from the labels.
func TestNamedRuntimes(t *testing.T) {
	nsjailtest.RequireRoot(t)
	if testing.Short() {
		t.Skip("-short: unpacks a second runtime image")
	}
	root := nsjailtest.RuntimeRootfs(t)
	testRef := testRuntimeImage(t)
	defaultRef := nsjailtest.RuntimeImageRef(t)
	start := time.Now()
	e := newEnvWith(t, root, func(c *config.Config) {
		c.PythonImage = defaultRef
		c.Runtimes = map[string]string{"test": testRef}
		c.SkillRuntime = "test"
		c.PoolSize = 1
		c.RuntimePoolSize = map[string]int{"test": 1}
		c.PoolPreload = []string{"json"} // the templates are the point, not the preload
	}, func(s *Server) { s.resolve = testResolver(t, root) })

	// Templates: dynamic on default (pool_size) and on test
	// (runtime_pool_size), skill on test (its own: pool_size); none of
	// skill on default.
	deadline := time.Now().Add(3 * time.Minute)
	for e.srv.PoolStats().Ready < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", e.srv.PoolStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("two runtimes prepared and three templates warm in %s", time.Since(start))
	if st := e.srv.PoolStats(); len(st.TakenBy) != 3 {
		t.Fatalf("templates %v, want dynamic/default, dynamic/test and skill/test", st.TakenBy)
	}

	// GET /v1/runtimes: both, their versions from the labels.
	code, _, body := e.do("GET", "/v1/runtimes", nil)
	var rl runtimesResponse
	if code != http.StatusOK || json.Unmarshal(body, &rl) != nil || len(rl.Runtimes) != 2 {
		t.Fatalf("GET /v1/runtimes = %d %s", code, body)
	}
	def, tst := rl.Runtimes[0], rl.Runtimes[1]
	if def.Name != "default" || !def.Default || def.Image != defaultRef || tst.Name != "test" || tst.Default || tst.Image != testRef {
		t.Fatalf("runtimes: %s", body)
	}
	if !strings.HasPrefix(tst.Digest, "sha256:") || tst.Digest == def.Digest || tst.Packages[testRuntimeLabel] != "1.0" ||
		tst.Python == "" || tst.Packages["python3-pandas"] == "" || tst.Packages["python3"] != tst.Python {
		t.Fatalf("the test runtime's versions: %s", body)
	}
	if strings.HasPrefix(def.Image, "oci-layout:") && (def.Python != tst.Python || def.Packages[testRuntimeLabel] != "" ||
		def.Packages["python3-pandas"] != tst.Packages["python3-pandas"]) {
		t.Fatalf("the default runtime's versions: %s", body)
	}
	code, _, body = e.do("GET", "/v1/policies", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"skill":{"timeout_ms":120000,"memory_mb":2048,"cpus":1,"pids":128,"runtime":"test"}`) {
		t.Fatalf("GET /v1/policies = %d %s", code, body)
	}

	const probe = "import os\nprint(os.path.exists('" + testRuntimeMarker + "'))\n"
	taken := func(tmpl string) uint64 { return e.srv.PoolStats().TakenBy[tmpl] }
	for _, tc := range []struct {
		name           string
		req            ExecutionRequest
		runtime, out   string
		template       string
		warmFromTmpl   bool
		coldFromNoTmpl bool
	}{
		{"default", ExecutionRequest{Code: probe}, "default", "False\n", "dynamic/default", true, false},
		{"per request", ExecutionRequest{Code: probe, Runtime: "test"}, "test", "True\n", "dynamic/test", true, false},
		{"per policy", ExecutionRequest{Code: probe, Type: TypeSkill}, "test", "True\n", "skill/test", true, false},
		{"per request over the policy's", ExecutionRequest{Code: probe, Type: TypeSkill, Runtime: "default"}, "default", "False\n", "", false, true},
	} {
		before, cold := taken(tc.template), e.sandbox.started.Load()
		resp := e.execute(tc.req)
		if resp.Status != "succeeded" || resp.Stdout != tc.out || resp.Runtime != tc.runtime {
			t.Fatalf("%s: status %s runtime %q stdout %q stderr %q", tc.name, resp.Status, resp.Runtime, resp.Stdout, resp.Stderr)
		}
		if tc.warmFromTmpl && taken(tc.template) != before+1 {
			t.Errorf("%s: not served by the warm template %s: %+v", tc.name, tc.template, e.srv.PoolStats())
		}
		if tc.coldFromNoTmpl && e.sandbox.started.Load() != cold+1 {
			t.Errorf("%s: no template, so a cold run: %d cold runs", tc.name, e.sandbox.started.Load()-cold)
		}
		// Each warm sandbox is single-use: wait for the refill.
		for e.srv.PoolStats().Ready < 3 {
			time.Sleep(20 * time.Millisecond)
		}
	}

	// A name the config lacks, or anything but a name: 400, nothing run.
	stats, cold := e.srv.PoolStats(), e.sandbox.started.Load()
	for _, name := range []string{"nope", "../test", "oci-layout:/tmp/x", testRef} {
		code, _, body := e.do("POST", "/v1/executions", ExecutionRequest{Code: probe, Runtime: name})
		if code != http.StatusBadRequest || !strings.Contains(string(body), `unknown runtime \"`) || !strings.Contains(string(body), `want one of [default test]`) {
			t.Errorf("runtime %q: %d %s", name, code, body)
		}
		code, _, body = e.do("POST", "/v1/sessions", SessionRequest{Runtime: name})
		if code != http.StatusBadRequest || !strings.Contains(string(body), "unknown runtime") {
			t.Errorf("session runtime %q: %d %s", name, code, body)
		}
	}
	if st := e.srv.PoolStats(); st.Taken != stats.Taken || e.sandbox.started.Load() != cold {
		t.Errorf("a refused runtime started something: %+v, %d cold", st, e.sandbox.started.Load()-cold)
	}
	if code, _, body := e.do("GET", "/v1/sessions", nil); code != http.StatusOK || strings.Contains(string(body), `"id"`) {
		t.Errorf("a refused session was created: %s", body)
	}

	// A session on the test runtime: its kernel (warm, dynamic/test) and
	// every execution run there; the view and GET say so.
	before := taken("dynamic/test")
	s := e.createSession(SessionRequest{ID: "on-test", Runtime: "test"})
	// The session's policy is its limits; its runtime is the session's
	// (the policy's default runtime is not shown there: it would
	// contradict it).
	if s.Runtime != "test" || s.Policy.Runtime != "" {
		t.Fatalf("session %+v", s)
	}
	for i := range 2 {
		r := e.sessionExec("on-test", SessionExecutionRequest{Code: probe})
		if r.Status != "succeeded" || r.Stdout != "True\n" || r.Runtime != "test" {
			t.Fatalf("session execution %d: %s %q %q %q", i, r.Status, r.Runtime, r.Stdout, r.Stderr)
		}
	}
	if got := taken("dynamic/test"); got != before+1 {
		t.Errorf("the session's kernel was not the dynamic/test template's: taken %d → %d", before, got)
	}
	code, _, body = e.do("GET", "/v1/sessions/on-test", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"runtime":"test"`) {
		t.Errorf("GET session = %d %s", code, body)
	}
	// The default session stays on the default runtime.
	e.createSession(SessionRequest{ID: "on-default"})
	if r := e.sessionExec("on-default", SessionExecutionRequest{Code: probe}); r.Stdout != "False\n" || r.Runtime != "default" {
		t.Errorf("default session: %q %q", r.Runtime, r.Stdout)
	}
	for _, id := range []string{"on-test", "on-default"} {
		if code, _, body := e.do("DELETE", "/v1/sessions/"+id, nil); code != http.StatusOK && code != http.StatusNoContent {
			t.Errorf("DELETE %s = %d %s", id, code, body)
		}
	}
}

// A session whose runtime a restarted worker's config no longer has: its
// executions and profiles are refused 409 runtime_gone (not a 503 to
// retry) before anything is claimed: no sandbox, no slot, the id free and
// the kernel generation in session.json unchanged. Its files stay
// readable and it can be deleted.
func TestSessionOnAGoneRuntime(t *testing.T) {
	root := nsjailtest.RuntimeRootfs(t)
	dir := filepath.Join(t.TempDir(), "sessions")
	e1 := newEnv(t, root, func(c *config.Config) {
		c.SessionsDir = dir
		c.Runtimes = map[string]string{"old": "dir:" + root}
	})
	if v := e1.createSession(SessionRequest{ID: "orphan", Runtime: "old"}); v.Runtime != "old" {
		t.Fatalf("session %+v", v)
	}
	if r := e1.sessionExec("orphan", SessionExecutionRequest{Code: "print(1)"}); r.Status != "succeeded" || r.Runtime != "old" {
		t.Fatalf("on old: %s %q %q", r.Status, r.Runtime, r.Stderr)
	}
	if code, body := e1.put("orphan", "t.csv", []byte("a,b\n1,2\n")); code != http.StatusOK {
		t.Fatalf("PUT = %d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e1.srv.Drain(ctx)
	e1.http.Close()
	if err := e1.srv.Close(); err != nil {
		t.Fatal(err)
	}

	e2 := newEnv(t, root, func(c *config.Config) { c.SessionsDir = dir })
	generation := func() int64 {
		var rec struct{ Generation int64 }
		data, err := os.ReadFile(filepath.Join(dir, "orphan", "session.json"))
		if err != nil || json.Unmarshal(data, &rec) != nil {
			t.Fatalf("session.json: %v %s", err, data)
		}
		return rec.Generation
	}
	gen := generation()
	if gen != 1 {
		t.Fatalf("generation %d after one kernel", gen)
	}
	wantGone := func(what string, code int, body []byte) {
		t.Helper()
		var eb errorBody
		if code != http.StatusConflict || json.Unmarshal(body, &eb) != nil || eb.Code != "runtime_gone" ||
			!strings.Contains(eb.Error, `runtime "old" is not configured`) {
			t.Fatalf("%s = %d %s, want 409 runtime_gone", what, code, body)
		}
	}
	for _, hdr := range [][]string{nil, {"Prefer", "respond-async"}} {
		code, h, body := e2.do("POST", "/v1/sessions/orphan/executions", SessionExecutionRequest{ID: "ex-gone", Code: "print(1)"}, hdr...)
		wantGone("execution", code, body)
		if h.Get("Retry-After") != "" {
			t.Errorf("Retry-After %q on a refusal that a retry cannot cure", h.Get("Retry-After"))
		}
		e2.wantNoExecution("ex-gone")
	}
	code, _, body := e2.do("GET", "/v1/sessions/orphan/files/t.csv?profile=1", nil)
	wantGone("profile", code, body)
	if st := e2.srv.PoolStats(); st.Taken != 0 || e2.sandbox.started.Load() != 0 || generation() != gen {
		t.Errorf("a refusal started something: pool %+v, %d cold, generation %d → %d", st, e2.sandbox.started.Load(), gen, generation())
	}
	if code, _, body := e2.do("GET", "/v1/sessions/orphan/files/t.csv", nil); code != http.StatusOK || string(body) != "a,b\n1,2\n" {
		t.Errorf("GET file = %d %q", code, body)
	}
	if code, _, body := e2.do("DELETE", "/v1/sessions/orphan", nil); code != http.StatusNoContent {
		t.Errorf("DELETE = %d %s", code, body)
	}
}
