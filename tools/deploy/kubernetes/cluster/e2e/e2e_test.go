// Package e2e proves the Kubernetes deployment on a real cluster: the one
// `make test-k8s` stands up (../cluster.sh) with three nodes, the worker
// image and the manifests deployed. It skips unless SANDBOXD_TEST_K8S names
// that cluster's state directory; test.sh runs it in node 1's network
// namespace, where the Service's ClusterIP is routed (kube-proxy), as a pod
// or a node-local client would reach it.
//
// The steps run in order on one cluster, the destructive ones last; each
// says in its name what issue 16 asks it to prove. Numbers (throughput,
// forwarding cost, rollout time) are printed as "MEASURE name value" lines
// for test.sh to collect: measured, never asserted.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

type cluster struct {
	t       *testing.T
	state   string // cluster.sh's STATE
	bin     string // the components' bin directory (kubectl)
	script  string // cluster.sh
	repo    string
	token   string
	service string // http://CLUSTER-IP:3100
	// byNameURL is the Service by its name (byName resolves it).
	byNameURL string
	port      string // the Service's (and the pods') port
	slots     int    // max_concurrent per worker, from the deployed config
	sandboxd  string // the sandboxd binary: its MCP bridge
	mark      string // this run's mark in execution ids: a rerun on the same cluster names new ones
	http      *http.Client
	// viaService is the client of requests to the Service: a connection
	// each, as kube-proxy balances connections, not requests (kept-alive
	// connections would pin each client to the worker it drew first).
	viaService *http.Client
}

func TestCluster(t *testing.T) {
	state := os.Getenv("SANDBOXD_TEST_K8S")
	if state == "" {
		t.Skip("SANDBOXD_TEST_K8S is not set: run `make test-k8s`")
	}
	c := newCluster(t, state)
	steps := []struct {
		name string
		run  func(*cluster, *testing.T)
	}{
		{"ExecutionsSpreadThroughTheService", (*cluster).spread},
		{"SessionUsedThroughAnotherWorker", (*cluster).sessionAcrossWorkers},
		{"SaturatedClusterCompletesEveryRequest", (*cluster).saturation},
		{"KilledWorkerRestartedExecutionInterrupted", (*cluster).killedWorker},
		{"RollingUpdateUnderLoadFailsNothing", (*cluster).rollingUpdate},
		{"ThroughputWithOneTwoThreeNodes", (*cluster).scaling},
		{"RemovedNodeSessionsAreGone", (*cluster).nodeRemoved},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) { s.run(c, t) }) {
			t.Fatalf("%s failed: the later steps need the cluster as it leaves it", s.name)
		}
	}
}

func newCluster(t *testing.T, state string) *cluster {
	token, err := os.ReadFile(filepath.Join(state, "token"))
	if err != nil {
		t.Fatal(err)
	}
	repo, err := filepath.Abs("../../../../..")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, state: state, repo: repo, token: strings.TrimSpace(string(token)),
		mark:       strconv.FormatInt(time.Now().Unix(), 36),
		bin:        os.Getenv("SANDBOXD_TEST_K8S_BIN"),
		script:     filepath.Join(repo, "tools/deploy/kubernetes/cluster/cluster.sh"),
		http:       &http.Client{Timeout: 120 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		viaService: &http.Client{Timeout: 120 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	if c.bin == "" {
		c.bin = filepath.Join(filepath.Dir(state), "bin")
	}
	if nodes := strings.Fields(c.kubectl(t, "get", "nodes", "-o", "name")); len(nodes) != 3 {
		t.Fatalf("the steps are written for 3 nodes (cluster.sh NODES=3), the cluster has %v", nodes)
	}
	svc := strings.Fields(c.kubectl(t, "-n", "sandboxd", "get", "service", "sandboxd", "-o", "jsonpath={.spec.clusterIP} {.spec.ports[0].port}"))
	if len(svc) != 2 {
		t.Fatalf("service sandboxd: %v", svc)
	}
	c.port = svc[1]
	c.service = "http://" + svc[0] + ":" + c.port
	c.byNameURL = "http://sandboxd.sandboxd.svc:" + c.port
	cfg, err := os.ReadFile(filepath.Join(state, "overlay/sandboxd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(cfg), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == "max_concurrent" {
			c.slots, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if c.slots == 0 {
		t.Fatalf("no max_concurrent in the deployed overlay/sandboxd.toml")
	}
	if c.sandboxd = os.Getenv("SANDBOXD_TEST_K8S_SANDBOXD"); c.sandboxd == "" {
		c.sandboxd = filepath.Join(repo, "bin/sandboxd-worker") // make worker-image's
	}
	return c
}

func (c *cluster) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.bin, "kubectl"), append([]string{"--kubeconfig", filepath.Join(c.state, "pki/admin.kubeconfig")}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// --- the workers -----------------------------------------------------------

type worker struct {
	Pod, Node, IP string
	Ready         bool
	Restarts      int
}

func (w worker) url(c *cluster) string { return "http://" + w.IP + ":" + c.port }

func (c *cluster) workers(t *testing.T) []worker {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string  `json:"name"`
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
			Spec   struct{ NodeName string } `json:"spec"`
			Status struct {
				PodIP             string `json:"podIP"`
				ContainerStatuses []struct {
					Ready        bool `json:"ready"`
					RestartCount int  `json:"restartCount"`
				} `json:"containerStatuses"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(c.kubectl(t, "-n", "sandboxd", "get", "pods", "-l", "app.kubernetes.io/name=sandboxd", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	var ws []worker
	for _, p := range list.Items {
		if p.Metadata.DeletionTimestamp != nil {
			continue
		}
		w := worker{Pod: p.Metadata.Name, Node: p.Spec.NodeName, IP: p.Status.PodIP}
		for _, s := range p.Status.ContainerStatuses {
			w.Ready, w.Restarts = s.Ready, s.RestartCount
		}
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b worker) int { return strings.Compare(a.Node, b.Node) })
	return ws
}

// readyWorkers waits until n workers are ready (and no more exist), up to
// limit, and returns them by node.
func (c *cluster) readyWorkers(t *testing.T, n int, limit time.Duration) []worker {
	t.Helper()
	end := time.Now().Add(limit)
	for {
		ws := c.workers(t)
		ready := 0
		for _, w := range ws {
			if w.Ready {
				ready++
			}
		}
		if ready == n && len(ws) == n {
			return ws
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d workers ready after %s: %+v", ready, n, limit, ws)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// routed waits until kube-proxy's rules in this network namespace (node
// 1's, where the test runs) send the Service's traffic to exactly n
// workers: a worker ready in the API is routed a moment later.
func (c *cluster) routed(t *testing.T, n int) {
	t.Helper()
	var got int
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		out, err := exec.Command("iptables-save", "-t", "nat").Output()
		if err != nil {
			t.Fatalf("iptables-save: %v", err)
		}
		got = 0
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "-A KUBE-SVC-") && strings.Contains(line, `"sandboxd/sandboxd:http -> `) && strings.Contains(line, "-j KUBE-SEP-") {
				got++
			}
		}
		if got == n {
			return
		}
	}
	t.Fatalf("kube-proxy routes the Service to %d workers after a minute, want %d", got, n)
}

// --- HTTP ------------------------------------------------------------------

type answer struct {
	Status int
	Header http.Header
	Body   []byte
}

func (a answer) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.Body, v); err != nil {
		t.Fatalf("answer %d %s: %v", a.Status, a.Body, err)
	}
}

// do sends one request (the Service's name as Host: the workers accept
// only their allowed hosts, a defence against DNS rebinding).
func (c *cluster) do(base, method, path string, body any) (answer, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return answer{}, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return answer{}, err
	}
	req.Host = "sandboxd.sandboxd.svc"
	req.Header.Set("Authorization", "Bearer "+c.token)
	if _, ok := body.([]byte); !ok && body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	client := c.http
	if base == c.service {
		client = c.viaService
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}, err
}

func (c *cluster) must(t *testing.T, base, method, path string, body any, want int) answer {
	t.Helper()
	a, err := c.do(base, method, path, body)
	if err != nil {
		t.Fatalf("%s %s%s: %v", method, base, path, err)
	}
	if a.Status != want {
		t.Fatalf("%s %s%s: %d %s, want %d", method, base, path, a.Status, a.Body, want)
	}
	return a
}

// retry503 is must, with 503 retried after its Retry-After for up to 30 s,
// as the clients do.
func (c *cluster) retry503(t *testing.T, base, method, path string, body any, want int) answer {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); ; {
		a, err := c.do(base, method, path, body)
		if err != nil {
			t.Fatalf("%s %s%s: %v", method, base, path, err)
		}
		if a.Status != http.StatusServiceUnavailable || time.Now().After(end) {
			if a.Status != want {
				t.Fatalf("%s %s%s: %d %s, want %d", method, base, path, a.Status, a.Body, want)
			}
			return a
		}
		wait := time.Second
		if s, err := strconv.Atoi(a.Header.Get("Retry-After")); err == nil {
			wait = time.Duration(s) * time.Second
		}
		t.Logf("%s %s: 503 %s: retried after %s", method, path, a.Body, wait)
		time.Sleep(wait)
	}
}

type execution struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Stdout  string `json:"stdout"`
	Stderr  string `json:"stderr"`
	Session *struct {
		State string `json:"state"`
	} `json:"session"`
}

// run sends one execution through base with the clients' policy (the
// Python client's, tools/clients/python): a named id, so a retry is the
// same execution, never a second one; 429 and 503 retried after their
// Retry-After, a connection refused or reset retried after 200 ms, up to
// a minute. It returns the execution and how many retries it took.
func (c *cluster) run(base, id, code string) (execution, int, error) {
	var e execution
	end := time.Now().Add(time.Minute)
	for retries := 0; ; retries++ {
		a, err := c.do(base, "POST", "/v1/executions", map[string]any{"id": id, "code": code})
		wait := 200 * time.Millisecond
		switch {
		case err != nil:
		case a.Status == http.StatusTooManyRequests || a.Status == http.StatusServiceUnavailable:
			if s, err := strconv.Atoi(a.Header.Get("Retry-After")); err == nil {
				wait = time.Duration(s) * time.Second
			}
			err = fmt.Errorf("%d %s", a.Status, a.Body)
		case a.Status != http.StatusOK:
			return e, retries, fmt.Errorf("%d %s", a.Status, a.Body)
		default:
			if err := json.Unmarshal(a.Body, &e); err != nil {
				return e, retries, err
			}
			return e, retries, nil
		}
		if time.Now().After(end) {
			return e, retries, fmt.Errorf("execution %s: still refused after a minute: %v", id, err)
		}
		time.Sleep(wait)
	}
}

// metric sums the samples of a counter on one worker's /metrics.
func (c *cluster) metric(t *testing.T, w worker, name string) float64 {
	t.Helper()
	a := c.must(t, w.url(c), "GET", "/metrics", nil, http.StatusOK)
	sum := 0.0
	for _, line := range strings.Split(string(a.Body), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("%s: %q", name, line)
			}
			sum += v
		}
	}
	return sum
}

// frozenKernel says whether a cgroup with processes in it is frozen below
// node's cgroups (cluster.sh's cgroupRoot), on the v1 freezer hierarchy.
func (c *cluster) frozenKernel(t *testing.T, node string) bool {
	t.Helper()
	root, err := os.ReadFile(filepath.Join(c.state, "cgroot"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	filepath.WalkDir(filepath.Join("/sys/fs/cgroup/freezer", strings.TrimSpace(string(root)), node), func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		state, _ := os.ReadFile(filepath.Join(p, "freezer.state"))
		procs, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if strings.TrimSpace(string(state)) == "FROZEN" && len(bytes.TrimSpace(procs)) > 0 {
			found = true
		}
		return nil
	})
	return found
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func measure(t *testing.T, name string, format string, args ...any) {
	t.Helper()
	fmt.Printf("MEASURE %s %s\n", name, fmt.Sprintf(format, args...))
	t.Logf("%s: %s", name, fmt.Sprintf(format, args...))
}

// load runs n executions of code through the Service, conc at a time, and
// returns their wall time and the failures (each one named).
func (c *cluster) load(prefix string, n, conc int, code string) (time.Duration, []string) {
	var (
		next     atomic.Int64
		mu       sync.Mutex
		failures []string
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				id := fmt.Sprintf("%s-%s-%d", prefix, c.mark, i)
				e, _, err := c.run(c.service, id, code)
				if err == nil && e.Status != "succeeded" {
					err = fmt.Errorf("status %s, stderr %q", e.Status, e.Stderr)
				}
				if err != nil {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s: %v", id, err))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), failures
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// --- the steps -------------------------------------------------------------

// Executions through the Service land on every worker.
func (c *cluster) spread(t *testing.T) {
	ws := c.readyWorkers(t, 3, 5*time.Minute)
	c.routed(t, 3)
	before := make([]float64, len(ws))
	for i, w := range ws {
		before[i] = c.metric(t, w, "sandboxd_executions_total")
	}
	_, failures := c.load("spread", 30, 6, "print(6 * 7)")
	if len(failures) > 0 {
		t.Fatalf("failed executions: %v", failures)
	}
	for i, w := range ws {
		got := c.metric(t, w, "sandboxd_executions_total") - before[i]
		t.Logf("worker on %s ran %v of 30", w.Node, got)
		if got == 0 {
			t.Errorf("no execution reached the worker on %s through the Service", w.Node)
		}
	}
}

// A session created on one worker is used, and its files read, through the
// others; the cost of the forwarding hop is measured.
func (c *cluster) sessionAcrossWorkers(t *testing.T) {
	ws := c.readyWorkers(t, 3, time.Minute)
	owner, other, third := ws[0], ws[1], ws[2]
	var s struct {
		ID string `json:"id"`
	}
	c.must(t, owner.url(c), "POST", "/v1/sessions", map[string]any{}, http.StatusCreated).json(t, &s)
	defer c.do(owner.url(c), "DELETE", "/v1/sessions/"+s.ID, nil)
	c.must(t, other.url(c), "PUT", "/v1/sessions/"+s.ID+"/files/data.csv", []byte("x,y\n1,2\n3,4\n"), http.StatusOK)
	var e execution
	c.must(t, other.url(c), "POST", "/v1/sessions/"+s.ID+"/executions",
		map[string]any{"code": "import pandas as pd\ndf = pd.read_csv('data.csv')\ndf['y'].sum()"}, http.StatusOK).json(t, &e)
	if e.Status != "succeeded" {
		t.Fatalf("first execution through %s: %+v", other.Node, e)
	}
	c.must(t, third.url(c), "POST", "/v1/sessions/"+s.ID+"/executions",
		map[string]any{"code": "open('sum.txt', 'w').write(str(df['x'].sum()))\nprint(len(df))"}, http.StatusOK).json(t, &e)
	if e.Status != "succeeded" || e.Stdout != "2\n" || e.Session == nil || e.Session.State != "preserved" {
		t.Fatalf("second execution through %s (the kernel's state kept?): %+v", third.Node, e)
	}
	if a := c.must(t, other.url(c), "GET", "/v1/sessions/"+s.ID+"/files/sum.txt", nil, http.StatusOK); string(a.Body) != "4" {
		t.Fatalf("sum.txt through %s: %q", other.Node, a.Body)
	}
	// The session lives on its owner only: its list has it, the others' not.
	if a := c.must(t, owner.url(c), "GET", "/v1/sessions", nil, http.StatusOK); !bytes.Contains(a.Body, []byte(s.ID)) {
		t.Fatalf("the owner %s does not list %s: %s", owner.Node, s.ID, a.Body)
	}
	if a := c.must(t, other.url(c), "GET", "/v1/sessions", nil, http.StatusOK); bytes.Contains(a.Body, []byte(s.ID)) {
		t.Fatalf("%s lists %s, owned by %s", other.Node, s.ID, owner.Node)
	}
	// The forwarding hop: the same calls direct and through another worker,
	// alternated so that both see the same noise.
	const n = 200
	var get, getFwd, exe, exeFwd []time.Duration
	timed := func(into *[]time.Duration, base, method, path string, body any) {
		t0 := time.Now()
		c.must(t, base, method, path, body, http.StatusOK)
		*into = append(*into, time.Since(t0))
	}
	for range n {
		timed(&get, owner.url(c), "GET", "/v1/sessions/"+s.ID, nil)
		timed(&getFwd, other.url(c), "GET", "/v1/sessions/"+s.ID, nil)
	}
	for range n / 4 {
		timed(&exe, owner.url(c), "POST", "/v1/sessions/"+s.ID+"/executions", map[string]any{"code": "print(1)"})
		timed(&exeFwd, other.url(c), "POST", "/v1/sessions/"+s.ID+"/executions", map[string]any{"code": "print(1)"})
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	measure(t, "forward_get_session_ms", "p50 %.2f direct %.2f (+%.2f), p99 %.2f direct %.2f (+%.2f)",
		ms(percentile(getFwd, .5)), ms(percentile(get, .5)), ms(percentile(getFwd, .5)-percentile(get, .5)),
		ms(percentile(getFwd, .99)), ms(percentile(get, .99)), ms(percentile(getFwd, .99)-percentile(get, .99)))
	measure(t, "forward_print1_ms", "p50 %.2f direct %.2f (+%.2f), p99 %.2f direct %.2f (+%.2f)",
		ms(percentile(exeFwd, .5)), ms(percentile(exe, .5)), ms(percentile(exeFwd, .5)-percentile(exe, .5)),
		ms(percentile(exeFwd, .99)), ms(percentile(exe, .99)), ms(percentile(exeFwd, .99)-percentile(exe, .99)))
}

// Three times the cluster's capacity at once, through the clients agents
// use, both of which retry 429 after its Retry-After: the Python client
// (12 executions, one thread each) and the MCP bridge (`sandboxd mcp`, 6
// bridges with one run_python call each). Every execution completes, and
// the workers did refuse some (so the retries were exercised).
func (c *cluster) saturation(t *testing.T) {
	ws := c.readyWorkers(t, 3, time.Minute)
	c.routed(t, 3)
	rejected := 0.0
	for _, w := range ws {
		rejected -= c.metric(t, w, "sandboxd_requests_rejected_total")
	}
	// 3x the cluster's slots: two thirds through the Python client, one
	// third through MCP bridges.
	slots := 3 * c.slots
	python, bridges := 2*slots, slots
	script := `
import sys, threading, sandboxd
base, token, n, run = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
client = sandboxd.Client(base, token=token, retries=30, max_retry_wait=5)
failures, lock = [], threading.Lock()
def one(i):
    try:
        r = client.run("import time\ntime.sleep(2)\nprint(%d)" % i, id="sat-%s-%d" % (run, i))
        if r.status != "succeeded" or r.stdout != "%d\n" % i:
            raise RuntimeError("status %s stdout %r" % (r.status, r.stdout))
    except Exception as e:
        with lock:
            failures.append("sat-%d: %r" % (i, e))
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for th in threads: th.start()
for th in threads: th.join()
print("\n".join(failures))
sys.exit(1 if failures else 0)
`
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 1+bridges)
	wg.Add(1)
	go func() {
		defer wg.Done()
		cmd := c.byName(t, "python3", "-c", script, c.byNameURL, c.token, strconv.Itoa(python), c.mark)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(c.repo, "tools/clients/python"))
		if out, err := cmd.CombinedOutput(); err != nil {
			errs <- fmt.Errorf("python client: %v\n%s", err, out)
		}
	}()
	for i := range bridges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.bridgeRun(t, fmt.Sprintf("import time\ntime.sleep(2)\nprint('mcp-%d')", i), fmt.Sprintf("mcp-%d", i)); err != nil {
				errs <- fmt.Errorf("MCP bridge %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	for _, w := range ws {
		rejected += c.metric(t, w, "sandboxd_requests_rejected_total")
	}
	measure(t, "saturation", "%d executions of 2 s (%d by the Python client, %d by MCP bridges) on %d slots in %.1f s, %v refusals retried, 0 failed",
		python+bridges, python, bridges, slots, time.Since(t0).Seconds(), rejected)
	if rejected == 0 {
		t.Fatalf("no request was refused: the cluster was not saturated, the retries not exercised")
	}
}

// byName is a command run where the Service's name resolves, as in a pod:
// the clients reach the workers by it (the workers accept only their
// allowed Host names), and there is no cluster DNS here, so an /etc/hosts
// naming the ClusterIP is bound in a mount namespace of the command's own.
func (c *cluster) byName(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	hosts := filepath.Join(c.state, "e2e-hosts")
	ip := strings.TrimSuffix(strings.TrimPrefix(c.service, "http://"), ":"+c.port)
	// Replaced whole (a new file renamed over it), never rewritten in
	// place: the commands started before read it while later ones are
	// started (the saturation step's bridges), and a lookup that met it
	// truncated went to the host's DNS, which does not know the name
	// (seen once: "lookup sandboxd.sandboxd.svc ... network is
	// unreachable").
	tmp, err := os.CreateTemp(c.state, "e2e-hosts-*")
	if err == nil {
		_, err = tmp.WriteString(ip + " sandboxd.sandboxd.svc\n")
		err = errors.Join(err, tmp.Chmod(0o644), tmp.Close())
	}
	if err == nil {
		err = os.Rename(tmp.Name(), hosts)
	}
	if err != nil {
		t.Fatal(err)
	}
	return exec.Command("unshare", append([]string{"-m", "--", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hosts, name}, args...)...)
}

// bridgeRun runs code through a `sandboxd mcp` bridge of its own (stdio,
// the go-sdk's client) pointed at the Service, and checks its stdout.
func (c *cluster) bridgeRun(t *testing.T, code, want string) error {
	cmd := c.byName(t, c.sandboxd, "mcp", "--url", c.byNameURL)
	cmd.Env = append(os.Environ(), "EXECUTION_WORKER_TOKEN="+c.token)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "sandboxd-e2e", Version: "1"}, nil).Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return err
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": code}})
	if err != nil {
		return err
	}
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	if res.IsError || !strings.Contains(strings.Join(text, "\n"), want) {
		return fmt.Errorf("isError %v, text %q", res.IsError, text)
	}
	return nil
}

// The worker process of one node killed (as the OOM killer would) during an
// execution: the container is restarted, the execution is answered
// interrupted, the session's files are intact.
func (c *cluster) killedWorker(t *testing.T) {
	ws := c.readyWorkers(t, 3, time.Minute)
	w := ws[1]
	var s struct {
		ID string `json:"id"`
	}
	c.must(t, w.url(c), "POST", "/v1/sessions", map[string]any{}, http.StatusCreated).json(t, &s)
	c.must(t, w.url(c), "PUT", "/v1/sessions/"+s.ID+"/files/keep.txt", []byte("kept"), http.StatusOK)
	c.must(t, w.url(c), "POST", "/v1/sessions/"+s.ID+"/executions", map[string]any{"code": "x = 1"}, http.StatusOK)
	killed := "killed-" + c.mark
	done := make(chan answer, 1)
	go func() {
		a, _ := c.do(w.url(c), "POST", "/v1/executions", map[string]any{"id": killed, "code": "import time\nprint('started', flush=True)\ntime.sleep(60)"})
		done <- a
	}()
	end := time.Now().Add(30 * time.Second)
	for {
		a, err := c.do(w.url(c), "GET", "/v1/executions/"+killed, nil)
		if err == nil && a.Status == http.StatusOK && bytes.Contains(a.Body, []byte(`"running"`)) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%s not running after 30 s: %v %d %s", killed, err, a.Status, a.Body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The session's kernel idles frozen (the case the supervisor is for:
	// on cgroup v1 a frozen task cannot die, and would hold the container).
	if !c.frozenKernel(t, w.Node) {
		t.Fatalf("no frozen cgroup with processes below %s's cgroups: the session's kernel is not idling frozen", w.Node)
	}
	out, err := exec.Command(c.script, "kill-worker", strings.TrimPrefix(w.Node, "n")).CombinedOutput()
	if err != nil {
		t.Fatalf("kill-worker %s: %v\n%s", w.Node, err, out)
	}
	t.Logf("%s", out)
	t0 := time.Now()
	if a := <-done; a.Status == http.StatusOK {
		t.Fatalf("the execution answered %s though its worker was killed", a.Body)
	}
	var back worker
	for end := time.Now().Add(3 * time.Minute); ; {
		for _, x := range c.workers(t) {
			if x.Node == w.Node && x.Ready && x.Restarts > w.Restarts {
				back = x
			}
		}
		if back.Pod != "" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the worker on %s was not restarted and ready in 3 minutes: %+v", w.Node, c.workers(t))
		}
		time.Sleep(500 * time.Millisecond)
	}
	measure(t, "worker_restart_s", "%.1f (SIGKILL to ready again)", time.Since(t0).Seconds())
	// The supervisor (pid 1) swept what serve left, the frozen kernel
	// included, before the container ended.
	prev := c.kubectl(t, "-n", "sandboxd", "logs", back.Pod, "--previous")
	if !strings.Contains(prev, "worker ended without its drain") || !regexp.MustCompile(`"msg":"swept orphans"[^\n]*"sandboxes":[1-9]`).MatchString(prev) {
		t.Fatalf("the previous container's log shows no sweep of serve's sandboxes by the supervisor:\n%s", lastLines(prev, 20))
	}
	var e execution
	c.must(t, back.url(c), "GET", "/v1/executions/"+killed, nil, http.StatusOK).json(t, &e)
	if e.Status != "interrupted" {
		t.Fatalf("%s after the restart: %+v", killed, e)
	}
	if a := c.must(t, back.url(c), "GET", "/v1/sessions/"+s.ID+"/files/keep.txt", nil, http.StatusOK); string(a.Body) != "kept" {
		t.Fatalf("keep.txt after the restart: %q", a.Body)
	}
	// Through another worker too (the session's owner is in its id); it
	// answers 503 owner_unavailable + Retry-After until its list of
	// peers has the restarted owner ready, and clients retry that.
	c.retry503(t, ws[0].url(c), "POST", "/v1/sessions/"+s.ID+"/executions", map[string]any{"code": "print(open('keep.txt').read())"}, http.StatusOK).json(t, &e)
	if e.Status != "succeeded" || e.Stdout != "kept\n" || e.Session == nil || e.Session.State != "restarted" {
		t.Fatalf("the session after the restart: %+v", e)
	}
	c.must(t, back.url(c), "DELETE", "/v1/sessions/"+s.ID, nil, http.StatusNoContent)
}

// A rolling update of the DaemonSet while executions run through the
// Service: every execution succeeds (with the clients' retries).
func (c *cluster) rollingUpdate(t *testing.T) {
	c.readyWorkers(t, 3, time.Minute)
	var (
		stop     atomic.Bool
		mu       sync.Mutex
		failures []string
		count    atomic.Int64
		retried  atomic.Int64
		wg       sync.WaitGroup
	)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("roll-%s-%d-%d", c.mark, g, i)
				e, r, err := c.run(c.service, id, "import time\ntime.sleep(0.5)\nprint('ok')")
				retried.Add(int64(r))
				if err == nil && (e.Status != "succeeded" || e.Stdout != "ok\n") {
					err = fmt.Errorf("status %s stdout %q stderr %q", e.Status, e.Stdout, e.Stderr)
				}
				count.Add(1)
				if err != nil {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s: %v", id, err))
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(3 * time.Second)
	t0 := time.Now()
	c.kubectl(t, "-n", "sandboxd", "rollout", "restart", "daemonset/sandboxd")
	c.kubectl(t, "-n", "sandboxd", "rollout", "status", "daemonset/sandboxd", "--timeout", "10m")
	took := time.Since(t0)
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	measure(t, "rolling_update_s", "%.1f for 3 workers under load (%d executions, %d retries, %d failed)", took.Seconds(), count.Load(), retried.Load(), len(failures))
	if len(failures) > 0 {
		t.Fatalf("%d of %d executions failed during the rollout: %v", len(failures), count.Load(), failures)
	}
}

// Executions per second through the Service with 1, 2 and 3 workers (the
// others' nodes unlabelled: the DaemonSet takes their pods away).
func (c *cluster) scaling(t *testing.T) {
	label := func(node string, on bool) {
		if on {
			c.kubectl(t, "label", "node", node, "sandboxd.io/worker=true", "--overwrite")
		} else {
			c.kubectl(t, "label", "node", node, "sandboxd.io/worker-")
		}
	}
	defer func() {
		label("n2", true)
		label("n3", true)
		c.readyWorkers(t, 3, 3*time.Minute)
	}()
	rate := map[int]float64{}
	for _, n := range []int{1, 2, 3} {
		label("n2", n >= 2)
		label("n3", n >= 3)
		c.readyWorkers(t, n, 3*time.Minute)
		c.routed(t, n)
		const execs = 60
		took, failures := c.load(fmt.Sprintf("scale%d", n), execs, 2*n, "print(1)")
		if len(failures) > 0 {
			t.Fatalf("%d workers: failures %v", n, failures)
		}
		rate[n] = execs / took.Seconds()
	}
	measure(t, "executions_per_s", "1 node %.1f, 2 nodes %.1f (%.0f%% of 2x), 3 nodes %.1f (%.0f%% of 3x)",
		rate[1], rate[2], 100*rate[2]/(2*rate[1]), rate[3], 100*rate[3]/(3*rate[1]))
}

// A node removed: its sessions are answered 410 owner_gone by the other
// workers, once it has been missing for a minute.
func (c *cluster) nodeRemoved(t *testing.T) {
	ws := c.readyWorkers(t, 3, time.Minute)
	gone, asked := ws[2], ws[0]
	var s struct {
		ID string `json:"id"`
	}
	c.must(t, gone.url(c), "POST", "/v1/sessions", map[string]any{}, http.StatusCreated).json(t, &s)
	c.must(t, asked.url(c), "GET", "/v1/sessions/"+s.ID, nil, http.StatusOK)
	out, err := exec.Command(c.script, "stop-node", strings.TrimPrefix(gone.Node, "n")).CombinedOutput()
	if err != nil {
		t.Fatalf("stop-node: %v\n%s", err, out)
	}
	c.kubectl(t, "delete", "node", gone.Node, "--wait=true")
	t0 := time.Now()
	var last answer
	// The worker's 60 s of absence, after the node's pod is gone (the pod
	// GC follows the node's deletion), on a loaded machine: 5 minutes.
	for time.Since(t0) < 5*time.Minute {
		last, err = c.do(asked.url(c), "GET", "/v1/sessions/"+s.ID, nil)
		if err == nil && last.Status == http.StatusGone {
			break
		}
		if err == nil && last.Status != http.StatusServiceUnavailable {
			t.Fatalf("session of the removed node: %d %s (want 503 then 410)", last.Status, last.Body)
		}
		time.Sleep(time.Second)
	}
	var body struct{ Error, Code string }
	last.json(t, &body)
	if last.Status != http.StatusGone || body.Code != "owner_gone" {
		t.Fatalf("session of the removed node after %s: %d %s", time.Since(t0), last.Status, last.Body)
	}
	measure(t, "node_removed_to_410_s", "%.0f", time.Since(t0).Seconds())
	t.Logf("410: %s", body.Error)
}
