package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/workspace"
	"golang.org/x/sys/unix"
)

// post runs a POST in the background and delivers its decoded response.
func (e *testEnv) post(req ExecutionRequest) <-chan *ExecutionResponse {
	ch := make(chan *ExecutionResponse, 1)
	go func() {
		code, _, body := e.do("POST", "/v1/executions", req)
		var r ExecutionResponse
		if code != 200 || json.Unmarshal(body, &r) != nil {
			r.Status = "http-" + http.StatusText(code) + ": " + string(body)
		}
		ch <- &r
	}()
	return ch
}

func wantNoProcess(t *testing.T, marker string) {
	t.Helper()
	if pids := nsjailtest.ProcessesMatching(marker); len(pids) > 0 {
		t.Fatalf("processes %q survived: %v", marker, pids)
	}
}

func TestTimeout(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	resp := e.execute(ExecutionRequest{Code: "echo start; trap '' TERM; sleep 1001", TimeoutMS: 300})
	wantExecStatus(t, resp, "timeout")
	if !hasLimit(resp, "timeout") || resp.Stdout != "start\n" || resp.Policy.TimeoutMS != 300 || resp.Signal == nil {
		t.Fatalf("limits %v stdout %q policy %+v signal %v", resp.LimitsHit, resp.Stdout, resp.Policy, resp.Signal)
	}
	wantNoProcess(t, "sleep 1001")
}

// SECURITY.md case 24: DELETE during the run kills it; the POST answers
// cancelled, GET too, and nothing is left.
func TestCancelRunning(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	done := e.post(ExecutionRequest{ID: "cancel-me", Code: "echo up; sleep 1002"})
	e.waitStatus("cancel-me", StatusRunning)
	waitFor(t, func() bool { return len(nsjailtest.ProcessesMatching("sleep 1002")) > 0 })
	code, _, body := e.do("DELETE", "/v1/executions/cancel-me", nil)
	if code != 200 || !strings.Contains(string(body), `"status":"cancelled"`) {
		t.Fatalf("DELETE = %d %s", code, body)
	}
	resp := <-done
	wantExecStatus(t, resp, "cancelled")
	if resp.Stdout != "up\n" {
		t.Errorf("stdout %q", resp.Stdout)
	}
	e.waitStatus("cancel-me", "cancelled")
	wantNoProcess(t, "sleep 1002")
	e.wantNoWorkspaces()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition never met")
		}
	}
}

// SECURITY.md case 21: beyond the slots and the queue, 429 with Retry-After and
// nothing started; a queued execution can be cancelled before it starts.
func TestOverCapacity(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) { c.MaxConcurrent = 1; c.MaxQueued = 1 })
	running := e.post(ExecutionRequest{ID: "run-1", Code: "sleep 1003"})
	e.waitStatus("run-1", StatusRunning)
	waitFor(t, func() bool { return e.sandbox.started.Load() == 1 }) // running is reported just before the start
	queued := e.post(ExecutionRequest{ID: "queued-1", Code: "echo never"})
	e.waitStatus("queued-1", StatusQueued)
	code, h, body := e.do("POST", "/v1/executions", ExecutionRequest{Code: "true"})
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" || !strings.Contains(string(body), "over capacity") {
		t.Fatalf("over capacity = %d %q %s", code, h.Get("Retry-After"), body)
	}
	if code, h, _ := e.do("POST", "/execute", LegacyRequest{Code: "true"}); code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("legacy over capacity = %d", code)
	}
	_, _, m := e.do("GET", "/metrics", nil)
	for _, want := range []string{"sandboxd_executions_in_flight 1\n", "sandboxd_executions_queued 1\n", `reason="over_capacity"} 2`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if n := e.sandbox.started.Load(); n != 1 {
		t.Fatalf("%d sandboxes started, want 1 (the running one)", n)
	}
	if code, _, _ := e.do("DELETE", "/v1/executions/queued-1", nil); code != 200 {
		t.Fatalf("DELETE queued = %d", code)
	}
	if r := <-queued; r.Status != "cancelled" || r.Stdout != "" {
		t.Fatalf("queued execution: %+v", r)
	}
	e.do("DELETE", "/v1/executions/run-1", nil)
	wantExecStatus(t, <-running, "cancelled")
	if n := e.sandbox.started.Load(); n != 1 {
		t.Fatalf("%d sandboxes started, want 1", n)
	}
	wantExecStatus(t, e.execute(ExecutionRequest{Code: "true"}), "succeeded")
}

// The contract of the Flask worker: {code, timeout} → {output, error, status}.
func TestLegacyExecute(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	cases := []struct {
		req  LegacyRequest
		want LegacyResponse
	}{
		{LegacyRequest{Code: "echo hello"}, LegacyResponse{Output: "hello\n", Error: "", Status: LegacySuccess}},
		{LegacyRequest{Code: "echo out; echo warn >&2"}, LegacyResponse{Output: "out\n", Error: "warn\n", Status: LegacyError}},
		{LegacyRequest{Code: "exit 4"}, LegacyResponse{Status: LegacyError}},
		{LegacyRequest{Code: "echo a; sleep 1004", Timeout: 0.3}, LegacyResponse{Output: "a\n", Error: "execution timed out after 300 ms", Status: LegacyCriticalError}},
		// A timeout above the policy is capped, as the Flask worker did.
		{LegacyRequest{Code: "echo capped", Timeout: 1e6}, LegacyResponse{Output: "capped\n", Status: LegacySuccess}},
	}
	for _, c := range cases {
		code, _, body := e.do("POST", "/execute", c.req)
		var got LegacyResponse
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if code != 200 || dec.Decode(&got) != nil || got != c.want {
			t.Errorf("POST /execute %+v = %d %s, want %+v", c.req, code, body, c.want)
		}
	}
	wantNoProcess(t, "sleep 1004")
}

// SECURITY.md case 17 on the runtime image: symlinks (to a host file, to a
// directory, dangling), a hardlink, a FIFO nobody writes, a listening unix
// socket, a sparse 900 MB file, too many and too large files; result.json a
// symlink to a host secret. Nothing is followed, nothing blocks, each refusal
// has its reason, the limits hold.
func TestArtifactsHostile(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), func(c *config.Config) {
		c.MaxArtifactBytes = 1000
		c.MaxArtifactsBytes = 1500
		c.MaxArtifacts = 3
	})
	resp := e.execute(ExecutionRequest{Code: `import os, socket
os.chdir("/workspace/output/artifacts")
os.symlink("/etc/shadow", "/workspace/output/result.json")
os.symlink("/etc/passwd", "a-link")
os.symlink("/", "b-dirlink")
os.symlink("/nonexistent", "c-dangling")
open("d-ok.txt", "w").write("x" * 600)
os.link("d-ok.txt", "e-hardlink")
os.mkfifo("f-fifo")
s = socket.socket(socket.AF_UNIX); s.bind("g-sock"); s.listen()
with open("h-sparse.bin", "wb") as f: f.truncate(900 * 1024 * 1024)
open("i-big.bin", "wb").write(b"y" * 1001)
open("j-ok.csv", "w").write("a,b\n" * 100)
os.makedirs("k/deeper"); open("k/deeper/l.json", "w").write("{}")
open("m-total.txt", "w").write("z" * 600)
open("n-count.txt", "w").write("1")
print("done")
`})
	wantExecStatus(t, resp, "succeeded")
	if resp.ResultError == nil || !strings.Contains(*resp.ResultError, "not a regular file (symlink)") {
		t.Fatalf("result.json symlink: result %s error %v", resp.Result, resp.ResultError)
	}
	var names []string
	for _, a := range resp.Artifacts {
		names = append(names, a.Name+":"+a.MediaType)
	}
	// d-ok.txt has two links (e-hardlink): both are refused.
	if want := "j-ok.csv:text/csv k/deeper/l.json:application/json m-total.txt:text/plain"; strings.Join(names, " ") != want {
		t.Errorf("artifacts = %v, want %s", names, want)
	}
	got := map[string]string{}
	for _, o := range resp.ArtifactsOmitted {
		got[o.Name] = o.Reason
	}
	want := map[string]string{
		"a-link": workspace.ReasonSymlink, "b-dirlink": workspace.ReasonSymlink, "c-dangling": workspace.ReasonSymlink,
		"d-ok.txt": workspace.ReasonHardlink, "e-hardlink": workspace.ReasonHardlink, "f-fifo": workspace.ReasonFIFO, "g-sock": workspace.ReasonSocket,
		"h-sparse.bin": workspace.ReasonTooLarge, "i-big.bin": workspace.ReasonTooLarge, "n-count.txt": workspace.ReasonCountLimit,
	}
	for n, r := range want {
		if got[n] != r {
			t.Errorf("omitted %s: reason %q, want %q", n, got[n], r)
		}
	}
	if len(got) != len(want) {
		t.Errorf("omitted = %v", resp.ArtifactsOmitted)
	}
	// The total limit: with a third file of 600 bytes the total would pass 1500.
	resp = e.execute(ExecutionRequest{Code: `import os
for n in "abc": open("/workspace/output/artifacts/" + n, "w").write("q" * 600)
`})
	if len(resp.Artifacts) != 2 || len(resp.ArtifactsOmitted) != 1 || resp.ArtifactsOmitted[0] != (Omitted{Name: "c", Reason: workspace.ReasonTotalLimit}) {
		t.Errorf("total limit: %d artifacts, omitted %v", len(resp.Artifacts), resp.ArtifactsOmitted)
	}
}

// SECURITY.md case 18: what run 1 wrote (workspace, /tmp, /dev/shm) is not in
// run 2, and concurrent runs see only their own files.
func TestIsolationBetweenRuns(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	wantExecStatus(t, e.execute(ExecutionRequest{Code: `echo s > /workspace/output/secret1; echo s > /tmp/secret1; echo s > /dev/shm/secret1
mkdir -p /workspace/output/artifacts/d; echo s > /workspace/input/secret1`}), "succeeded")
	resp := e.execute(ExecutionRequest{Code: "ls -aR /workspace /tmp /dev/shm"})
	wantExecStatus(t, resp, "succeeded")
	if strings.Contains(resp.Stdout, "secret1") {
		t.Fatalf("run 2 sees run 1's files:\n%s", resp.Stdout)
	}
	var wg sync.WaitGroup
	out := make([]*ExecutionResponse, 2)
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := "echo " + string(rune('A'+i)) + " > /workspace/output/me; touch /tmp/mine-" + string(rune('A'+i)) +
				"; sleep 0.5; cat /workspace/output/me; ls /tmp /workspace/output; cat /workspace/input/who"
			out[i] = e.execute(ExecutionRequest{Code: code, Files: []File{{Path: "who", ContentBase64: b64(string(rune('a' + i)))}}})
		}()
	}
	wg.Wait()
	for i, r := range out {
		wantExecStatus(t, r, "succeeded")
		// Each sees exactly its own files and input, nothing of the other.
		me, who := string(rune('A'+i)), string(rune('a'+i))
		if want := me + "\n/tmp:\nmine-" + me + "\n\n/workspace/output:\nartifacts\nme\n" + who; r.Stdout != want {
			t.Errorf("run %d saw %q, want %q", i, r.Stdout, want)
		}
	}
}

// SECURITY.md case 18 on warm sandboxes, zygotes ("import") and template
// forks (TEMPLATE.md plan step 8): TestIsolationBetweenRuns's checks, in
// Python on the runtime image (the shell rootfs cannot run a warm
// sandbox), each run served by the pool, and each answer the one a
// pool-off server gives: what run 1 wrote (workspace, /tmp, /dev/shm) is
// not in run 2, and two concurrent runs see only their own files.
func TestIsolationBetweenWarmRuns(t *testing.T) {
	for _, forks := range []bool{false, true} {
		t.Run(map[bool]string{false: "import", true: "forks"}[forks], func(t *testing.T) {
			testIsolationBetweenWarmRuns(t, forks)
		})
	}
}

func testIsolationBetweenWarmRuns(t *testing.T, forks bool) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	cold := newEnv(t, rootfs, noPool)
	warm := newEnv(t, rootfs, func(c *config.Config) {
		c.PoolSize = 2 // the concurrent pair
		c.PoolTemplateForks = forks
	})
	// Two per policy (dynamic and skill), so both of a pair are warm.
	ready := func() {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); warm.srv.PoolStats().Ready < 4; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("pool never filled: %+v", warm.srv.PoolStats())
			}
		}
	}
	const write = `import os
for p in ("/workspace/output/secret1", "/tmp/secret1", "/dev/shm/secret1", "/workspace/input/secret1"):
    open(p, "w").write("s")
os.makedirs("/workspace/output/artifacts/d")
`
	const list = `import os
for top in ("/workspace", "/tmp", "/dev/shm"):
    for root, dirs, files in sorted(os.walk(top)):
        print(root, sorted(dirs), sorted(files))
`
	both := func(req ExecutionRequest, n int) (c, w []*ExecutionResponse) {
		t.Helper()
		ready()
		before := warm.srv.PoolStats().Taken
		c, w = make([]*ExecutionResponse, n), make([]*ExecutionResponse, n)
		var wg sync.WaitGroup
		for i := range n {
			r := req
			if n > 1 {
				me, who := string(rune('A'+i)), string(rune('a'+i))
				r.Code = strings.ReplaceAll(req.Code, "ME", me)
				r.Files = []File{{Path: "who", ContentBase64: b64(who)}}
			}
			for _, run := range []struct {
				e   *testEnv
				out []*ExecutionResponse
			}{{cold, c}, {warm, w}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					run.out[i] = run.e.execute(r)
				}()
			}
		}
		wg.Wait()
		if st := warm.srv.PoolStats(); st.Taken != before+uint64(n) {
			t.Fatalf("the pool served %d of %d runs: %+v", st.Taken-before, n, st)
		}
		for i := range n {
			wantExecStatus(t, c[i], "succeeded")
			wantExecStatus(t, w[i], "succeeded")
		}
		return c, w
	}
	both(ExecutionRequest{Code: write}, 1)
	c, w := both(ExecutionRequest{Code: list}, 1)
	if strings.Contains(w[0].Stdout, "secret1") || w[0].Stdout != c[0].Stdout {
		t.Fatalf("run 2 on the pool saw:\n%s\ncold:\n%s", w[0].Stdout, c[0].Stdout)
	}
	c, w = both(ExecutionRequest{Code: `import os, time
open("/workspace/output/me", "w").write("ME")
open("/tmp/mine-ME", "w").close()
time.sleep(0.5)
print(open("/workspace/output/me").read(), sorted(os.listdir("/tmp")), sorted(os.listdir("/workspace/output")),
    open("/workspace/input/who").read())
`}, 2)
	// Each sees exactly its own files and input, nothing of the other's;
	// /tmp holds what the image's interpreter start put there (its
	// matplotlib font cache), as cold.
	for i := range w {
		me, who, other := string(rune('A'+i)), string(rune('a'+i)), string(rune('B'-i))
		if !strings.HasPrefix(w[i].Stdout, me+" [") || !strings.Contains(w[i].Stdout, "'mine-"+me+"'") ||
			strings.Contains(w[i].Stdout, "mine-"+other) || !strings.HasSuffix(w[i].Stdout, "['artifacts', 'me'] "+who+"\n") ||
			w[i].Stdout != c[i].Stdout {
			t.Errorf("run %d saw %q on the pool, %q cold", i, w[i].Stdout, c[i].Stdout)
		}
	}
}

// SECURITY.md case 3 for the workspace: filling it ends in ENOSPC at
// workspace_bytes, the result is still collected, the host disk untouched.
func TestWorkspaceFull(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) {
		c.WorkspaceBytes = 4 << 20
		c.MaxCodeBytes = 64 << 10
		c.MaxInputBytes = 1 << 20
	})
	resp := e.execute(ExecutionRequest{Code: `dd if=/dev/zero of=/workspace/output/fill bs=1M count=64; echo "dd=$?"
echo '{"ok":true}' > /workspace/output/result.json || rm /workspace/output/fill
echo '{"ok":true}' > /workspace/output/result.json; df -k /workspace | tail -1`})
	wantExecStatus(t, resp, "succeeded")
	if !strings.Contains(resp.Stderr, "No space left on device") || !strings.Contains(resp.Stdout, "dd=1") {
		t.Fatalf("stdout %q stderr %q", resp.Stdout, resp.Stderr)
	}
	if f := strings.Fields(resp.Stdout); len(f) < 2 || f[len(f)-1] != "/workspace" || f[len(f)-5] != "4096" {
		t.Errorf("df of /workspace: %q", resp.Stdout)
	}
	if string(resp.Result) != `{"ok":true}` {
		t.Errorf("result %s %v", resp.Result, resp.ResultError)
	}
}

// SECURITY.md case 23: the work root itself is full (a small tmpfs with no
// inodes or bytes left): a clear 507 with Retry-After, nothing started; once
// space returns the worker serves again.
func TestWorkRootFull(t *testing.T) {
	nsjailtest.RequireRoot(t)
	root := t.TempDir()
	if err := unix.Mount("sandboxd-test-workroot", root, "tmpfs", 0, "size=256k,nr_inodes=64,mode=0755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	work := filepath.Join(root, "work")
	e := newEnv(t, shellRootfs(t), func(c *config.Config) { c.WorkRoot = work })
	wantExecStatus(t, e.execute(ExecutionRequest{Code: "true"}), "succeeded")
	// Its workspace is removed after the answer: a removal after the fill
	// below would free an inode for the next one.
	e.wantNoWorkspaces()
	fill := filepath.Join(root, "fill")
	os.Mkdir(fill, 0o700)
	// Bytes first, then inodes: both are gone.
	for _, size := range []int{16 << 10, 0} {
		for i := 0; ; i++ {
			err := os.WriteFile(filepath.Join(fill, fmt.Sprintf("f%d-%d", size, i)), make([]byte, size), 0o600)
			if errors.Is(err, syscall.ENOSPC) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
		}
	}
	before := e.sandbox.started.Load()
	code, h, body := e.do("POST", "/v1/executions", ExecutionRequest{Code: "echo hi"})
	if code != http.StatusInsufficientStorage || h.Get("Retry-After") == "" || !strings.Contains(string(body), "work root is full") {
		t.Fatalf("full work root: %d %q %s", code, h.Get("Retry-After"), body)
	}
	if code, _, body := e.do("POST", "/execute", LegacyRequest{Code: "echo hi"}); code != http.StatusInsufficientStorage {
		t.Fatalf("legacy on a full work root: %d %s", code, body)
	}
	if e.sandbox.started.Load() != before {
		t.Fatal("a sandbox started on a full work root")
	}
	os.RemoveAll(fill)
	resp := e.execute(ExecutionRequest{Code: "echo back"})
	wantExecStatus(t, resp, "succeeded")
	if resp.Stdout != "back\n" {
		t.Fatalf("stdout %q", resp.Stdout)
	}
}

// SIGTERM drain: live executions finish within the grace period, the rest
// are cancelled, new ones are refused, readyz turns 503, nothing is left.
func TestDrain(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	quick := e.post(ExecutionRequest{ID: "quick", Code: "sleep 0.3; echo finished"})
	slow := e.post(ExecutionRequest{ID: "slow", Code: "sleep 1005"})
	e.waitStatus("quick", StatusRunning)
	e.waitStatus("slow", StatusRunning)
	// "running" is reported once admitted, a moment before the sandbox
	// starts: wait for both sandboxes, so the drain sees them in flight.
	waitFor(t, func() bool { return e.sandbox.started.Load() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	drained := make(chan int, 1)
	go func() { drained <- e.srv.Drain(ctx) }()
	waitFor(t, func() bool { code, _, _ := e.do("GET", "/readyz", nil); return code == http.StatusServiceUnavailable })
	if code, _, body := e.do("POST", "/v1/executions", ExecutionRequest{Code: "true"}); code != http.StatusServiceUnavailable {
		t.Fatalf("POST while draining = %d %s", code, body)
	}
	if n := e.sandbox.started.Load(); n != 2 {
		t.Fatalf("%d sandboxes started, want the 2 in flight", n)
	}
	if r := <-quick; r.Status != "succeeded" || r.Stdout != "finished\n" {
		t.Fatalf("in-flight run: %+v", r)
	}
	wantExecStatus(t, <-slow, "cancelled")
	if n := <-drained; n != 1 {
		t.Fatalf("drain cancelled %d, want 1", n)
	}
	wantNoProcess(t, "sleep 1005")
	e.wantNoWorkspaces()
}

// /workspace is nosuid, nodev and noexec inside the sandbox too: a binary
// dropped there does not run (the code itself is read by the interpreter).
func TestWorkspaceMountFlags(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	resp := e.execute(ExecutionRequest{Code: `cp /bin/busybox /workspace/output/bb && chmod +x /workspace/output/bb
/workspace/output/bb true && echo "exec: allowed" || echo "exec: refused"
grep ' /workspace ' /proc/self/mounts; rm /workspace/output/bb`})
	wantExecStatus(t, resp, "succeeded")
	if !strings.Contains(resp.Stdout, "exec: refused") {
		t.Fatalf("a binary ran from /workspace: %q %q", resp.Stdout, resp.Stderr)
	}
	for _, opt := range []string{"nosuid", "nodev", "noexec"} {
		if !strings.Contains(resp.Stdout, opt) {
			t.Errorf("/workspace mount lacks %s: %q", opt, resp.Stdout)
		}
	}
}
