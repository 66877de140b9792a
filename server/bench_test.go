package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
)

// BenchmarkAPIGroupby is one pandas groupby through POST /v1/executions,
// end to end (HTTP, workspace tmpfs, sandbox, collection, cleanup), with the
// warm pool off and on.
func BenchmarkAPIGroupby(b *testing.B) {
	body, _ := json.Marshal(ExecutionRequest{Code: groupbyCode, Input: json.RawMessage(`{"by": "region"}`),
		Files: []File{{Path: "sales.csv", ContentBase64: b64(salesCSV)}}})
	benchAPI(b, body)
}

// BenchmarkAPIPrint is BenchmarkAPIGroupby for print(1): what the request
// path costs around the smallest execution (issue 17's warm round trip).
func BenchmarkAPIPrint(b *testing.B) {
	body, _ := json.Marshal(ExecutionRequest{Code: "print(1)\n"})
	benchAPI(b, body)
}

// benchAPI posts body to /v1/executions b.N times, in process, with the
// pool off and on, a ready warm sandbox waited for before each.
func benchAPI(b *testing.B, body []byte) {
	rootfs := nsjailtest.RuntimeRootfs(b)
	nsjailtest.RequireRoot(b)
	for _, size := range []int{0, 1} {
		name := map[int]string{0: "cold", 1: "warm"}[size]
		b.Run(name, func(b *testing.B) {
			cfg := config.Default()
			cfg.WorkRoot = filepath.Join(b.TempDir(), "work")
			cfg.ResultsDir = filepath.Join(b.TempDir(), "results")
			cfg.SessionsDir = filepath.Join(b.TempDir(), "sessions")
			cfg.StateRoot = testStateRoot
			cfg.PoolSize = size
			cfg.PoolTemplateForks = nsjailtest.TemplateForks(b, cfg.PoolTemplateForks)
			cfg.SessionSpareKernels = 0 // no session here to take a warm sandbox
			cfg.MaxConcurrent = 1
			r := nsjailtest.NewRunner(b, nsjail.Options{StateRoot: cfg.StateRoot, CgroupParent: testCgroupParent, Logger: quietLog})
			srv, err := New(Deps{Config: cfg, Sandbox: r, Logger: quietLog,
				ResolveRootfs: dirRootfs(rootfs)})
			if err != nil {
				b.Fatal(err)
			}
			if err := srv.Prepare(context.Background()); err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			defer srv.Drain(context.Background())
			waitPool := func() {
				for size > 0 && srv.PoolStats().Ready < uint64(len(srv.policies)) {
					time.Sleep(5 * time.Millisecond)
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				waitPool() // a steady state where a warm sandbox is ready
				b.StartTimer()
				start := time.Now()
				rec := httptest.NewRecorder()
				req := httptest.NewRequest("POST", "/v1/executions", bytesReader(body))
				req.Host = "127.0.0.1"
				srv.Handler().ServeHTTP(rec, req)
				lat = append(lat, time.Since(start))
				if rec.Code != 200 {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
			reportBenchLatency(b, lat)
		})
	}
}

// benchSessionServer is a server on the real runtime with the warm pool
// on (one per policy) and sessions, served over loopback HTTP as a client
// sees it; the pool is full when it returns.
func benchSessionServer(b *testing.B) (*Server, *http.Client, string) {
	srv, hs := benchServe(b, nil, nil)
	return srv, hs.Client(), hs.URL
}

// benchServe starts benchSessionServer's server, its config changed by
// with (nil: as it is), served on ln (nil: a new loopback port); the pool
// is full when it returns, and the server drained and closed after b.
func benchServe(b *testing.B, ln net.Listener, with func(*config.Config)) (*Server, *httptest.Server) {
	rootfs := nsjailtest.RuntimeRootfs(b)
	nsjailtest.RequireRoot(b)
	cfg := config.Default()
	cfg.WorkRoot = filepath.Join(b.TempDir(), "work")
	cfg.ResultsDir = filepath.Join(b.TempDir(), "results")
	cfg.SessionsDir = filepath.Join(b.TempDir(), "sessions")
	cfg.StateRoot = testStateRoot
	cfg.PythonImage = "dir:" + rootfs
	cfg.PoolSize = 1
	cfg.PoolTemplateForks = nsjailtest.TemplateForks(b, cfg.PoolTemplateForks)
	if with != nil {
		with(&cfg)
	}
	r := nsjailtest.NewRunner(b, nsjail.Options{StateRoot: cfg.StateRoot, CgroupParent: testCgroupParent, Logger: quietLog})
	srv, err := New(Deps{Config: cfg, Sandbox: r, Logger: quietLog, ResolveRootfs: dirRootfs(rootfs)})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Prepare(context.Background()); err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(nil)
	if ln != nil {
		hs.Listener.Close()
		hs.Listener = ln
	}
	hs.Config = srv.HTTPServer(nil)
	hs.Start()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Drain(ctx)
		hs.Close()
		srv.Close()
	})
	waitBenchPool(b, srv)
	return srv, hs
}

// waitBenchPool waits until a warm sandbox is ready for every policy, and
// the spare session kernels (session_spare_kernels) too.
func waitBenchPool(b *testing.B, srv *Server) {
	deadline := time.Now().Add(2 * time.Minute)
	for srv.PoolStats().Ready < uint64(len(srv.policies)) || srv.SessionStats().SpareKernels < srv.SessionStats().SpareKernelsWanted {
		if time.Now().After(deadline) {
			b.Fatalf("pool never filled: %+v", srv.PoolStats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// benchPost POSTs body to url and checks the status.
func benchPost(b *testing.B, c *http.Client, url string, body any, want int) []byte {
	data, _ := json.Marshal(body)
	resp, err := c.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		b.Fatalf("POST %s = %d %s", url, resp.StatusCode, out)
	}
	return out
}

func benchDelete(b *testing.B, c *http.Client, url string) {
	req, _ := http.NewRequest(http.MethodDelete, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
}

// BenchmarkSessionExecPrint is print(1) in a session's live kernel, the
// HTTP round trip (issue 12: p50 ≤ 2 ms).
func BenchmarkSessionExecPrint(b *testing.B) {
	srv, c, url := benchSessionServer(b)
	benchPost(b, c, url+"/v1/sessions", SessionRequest{ID: "bench"}, http.StatusCreated)
	defer benchDelete(b, c, url+"/v1/sessions/bench")
	benchPost(b, c, url+"/v1/sessions/bench/executions", SessionExecutionRequest{Code: "x = 1"}, http.StatusOK)
	// After the refill of the sandbox the kernel came from (tools/bench
	// measures the same way).
	waitBenchPool(b, srv)
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		out := benchPost(b, c, url+"/v1/sessions/bench/executions", SessionExecutionRequest{Code: "print(1)"}, http.StatusOK)
		lat = append(lat, time.Since(t0))
		if !bytes.Contains(out, []byte(`"stdout":"1\n"`)) {
			b.Fatalf("%s", out)
		}
	}
	reportBenchLatency(b, lat)
}

// BenchmarkSessionCreateFirst is POST /v1/sessions and the first print(1)
// in it, the pool full before each (issue 12: p50 ≤ 5 ms).
func BenchmarkSessionCreateFirst(b *testing.B) {
	srv, c, url := benchSessionServer(b)
	var lat []time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		waitBenchPool(b, srv)
		time.Sleep(20 * time.Millisecond) // the previous session's delete and refills settle
		id := fmt.Sprintf("bench-%d", i)
		i++
		b.StartTimer()
		t0 := time.Now()
		benchPost(b, c, url+"/v1/sessions", SessionRequest{ID: id}, http.StatusCreated)
		out := benchPost(b, c, url+"/v1/sessions/"+id+"/executions", SessionExecutionRequest{Code: "print(1)"}, http.StatusOK)
		lat = append(lat, time.Since(t0))
		b.StopTimer()
		if !bytes.Contains(out, []byte(`"stdout":"1\n"`)) {
			b.Fatalf("%s", out)
		}
		benchDelete(b, c, url+"/v1/sessions/"+id)
		b.StartTimer()
	}
	reportBenchLatency(b, lat)
}

func reportBenchLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// benchPeerServers are two workers on the real runtime, worker-a and
// worker-b, each knowing the other (peers_source = "static"), with the
// warm pool on and sessions, served over loopback HTTP; their base URLs.
func benchPeerServers(b *testing.B) (c *http.Client, urlA, urlB string) {
	nsjailtest.RuntimeRootfs(b) // skips before anything is opened
	nsjailtest.RequireRoot(b)
	ids := []string{"worker-a", "worker-b"}
	lns := map[string]net.Listener{}
	list := map[string]string{}
	for _, id := range ids {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		lns[id], list[id] = ln, "http://"+ln.Addr().String()
	}
	for _, id := range ids {
		benchServe(b, lns[id], func(cfg *config.Config) {
			cfg.WorkerID, cfg.PeersSource, cfg.Peers = id, config.PeersStatic, list
		})
	}
	return &http.Client{}, list["worker-a"], list["worker-b"]
}

// BenchmarkSessionForwarded is what forwarding adds (issue 16): GET
// /v1/sessions/{id} and print(1) in the session's live kernel, each sent
// to the owner (direct) and to the other worker (forwarded), alternately
// in one run; p50 and p99 of each and the forwarded/direct ratios.
func BenchmarkSessionForwarded(b *testing.B) {
	c, urlA, urlB := benchPeerServers(b)
	var sess SessionView
	json.Unmarshal(benchPost(b, c, urlA+"/v1/sessions", SessionRequest{}, http.StatusCreated), &sess)
	defer benchDelete(b, c, urlA+"/v1/sessions/"+sess.ID)
	benchPost(b, c, urlA+"/v1/sessions/"+sess.ID+"/executions", SessionExecutionRequest{Code: "x = 1"}, http.StatusOK)
	get := func(base string) time.Duration {
		t0 := time.Now()
		resp, err := c.Get(base + "/v1/sessions/" + sess.ID)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET via %s: %d", base, resp.StatusCode)
		}
		return time.Since(t0)
	}
	print1 := func(base string) time.Duration {
		t0 := time.Now()
		out := benchPost(b, c, base+"/v1/sessions/"+sess.ID+"/executions", SessionExecutionRequest{Code: "print(1)"}, http.StatusOK)
		d := time.Since(t0)
		if !bytes.Contains(out, []byte(`"stdout":"1\n"`)) {
			b.Fatalf("%s", out)
		}
		return d
	}
	// Warm both paths' connections first.
	get(urlA)
	get(urlB)
	print1(urlB)
	var getA, getB, printA, printB []time.Duration
	for b.Loop() {
		getA = append(getA, get(urlA))
		getB = append(getB, get(urlB))
		printA = append(printA, print1(urlA))
		printB = append(printB, print1(urlB))
	}
	report := func(name string, direct, fwd []time.Duration) {
		slices.Sort(direct)
		slices.Sort(fwd)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		p50d, p50f := direct[len(direct)/2], fwd[len(fwd)/2]
		p99d, p99f := direct[len(direct)*99/100], fwd[len(fwd)*99/100]
		b.ReportMetric(ms(p50d), name+"-direct-p50-ms")
		b.ReportMetric(ms(p99d), name+"-direct-p99-ms")
		b.ReportMetric(ms(p50f), name+"-fwd-p50-ms")
		b.ReportMetric(ms(p99f), name+"-fwd-p99-ms")
		b.ReportMetric(float64(p50f)/float64(p50d), name+"-p50-ratio")
		b.ReportMetric(float64(p99f)/float64(p99d), name+"-p99-ratio")
	}
	report("get", getA, getB)
	report("print", printA, printB)
}
