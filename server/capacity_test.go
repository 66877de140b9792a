package server

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
)

// getCapacity GETs /v1/capacity (with hdr) and decodes the 200.
func (e *testEnv) getCapacity(hdr ...string) Capacity {
	e.t.Helper()
	code, _, body := e.do("GET", "/v1/capacity", nil, hdr...)
	if code != http.StatusOK {
		e.t.Fatalf("GET /v1/capacity = %d: %s", code, body)
	}
	var c Capacity
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		e.t.Fatalf("decode capacity: %v\n%s", err, body)
	}
	return c
}

// The admission state through GET /v1/capacity on a fake sandbox: behind
// the token, before Prepare (not ready), with one execution running and one
// queued, and once draining.
func TestUnitCapacity(t *testing.T) {
	u := newUnitEnv(t, false, func(c *config.Config) {
		c.MaxConcurrent, c.MaxQueued, c.WorkerToken, c.WorkerID = 1, 2, "tok", "node-a"
	})
	auth := []string{"Authorization", "Bearer tok"}
	code, _, body := u.do("GET", "/v1/capacity", nil)
	wantError(t, code, body, 401, "bearer token")

	c := u.getCapacity(auth...)
	want := Capacity{WorkerID: "node-a",
		Executions: CapacityExecutions{Slots: 1, FreeSlots: 1, MaxQueued: 2},
		WarmPool:   CapacityWarmPool{Size: map[string]int{}, Ready: map[string]int{}},
		Sessions:   CapacitySessions{Max: u.cfg.MaxSessions, IdleMemoryLimitBytes: u.cfg.SessionIdleMemoryBytes},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("before Prepare:\n got %+v\nwant %+v", c, want)
	}
	if err := u.srv.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	c = u.getCapacity(auth...)
	// Without root the sessions may not open (no loop devices): the
	// worker is ready either way, and says whether they are available.
	_, _, readyBody := u.do("GET", "/readyz", nil)
	if !c.Ready || !strings.Contains(string(readyBody), `"ready"`) {
		t.Fatalf("after Prepare: capacity ready %v, /readyz %s", c.Ready, readyBody)
	}
	if c.Sessions.Available != (u.srv.SessionStats().KernelStarts != nil) {
		t.Errorf("sessions available %v, but the manager's stats are %+v", c.Sessions.Available, u.srv.SessionStats())
	}

	release := make(chan struct{})
	u.fake.result = func(ctx context.Context, spec nsjail.Spec) *nsjail.Result {
		<-release
		now := time.Now()
		return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusSucceeded, LimitsHit: []string{}, StartedAt: now, FinishedAt: now}
	}
	var done []<-chan *ExecutionResponse
	for _, id := range []string{"cap-1", "cap-2"} {
		ch := make(chan *ExecutionResponse, 1)
		go func() {
			code, _, body := u.do("POST", "/v1/executions", ExecutionRequest{ID: id, Code: "x"}, auth...)
			var r ExecutionResponse
			if code != 200 || json.Unmarshal(body, &r) != nil {
				r.Status = "http-" + http.StatusText(code) + ": " + string(body)
			}
			ch <- &r
		}()
		done = append(done, ch)
		if id == "cap-1" {
			waitFor(t, func() bool { return u.fake.started.Load() == 1 })
		}
	}
	waitFor(t, func() bool { return u.getCapacity(auth...).Executions.Queued == 1 })
	c = u.getCapacity(auth...)
	if e := c.Executions; e != (CapacityExecutions{Slots: 1, Running: 1, FreeSlots: 0, Queued: 1, MaxQueued: 2}) {
		t.Fatalf("one running, one queued: %+v", e)
	}
	close(release)
	for _, ch := range done {
		wantExecStatus(t, <-ch, "succeeded")
	}
	waitFor(t, func() bool { return u.getCapacity(auth...).Executions.Running == 0 })
	if e := u.getCapacity(auth...).Executions; e != (CapacityExecutions{Slots: 1, FreeSlots: 1, MaxQueued: 2}) {
		t.Fatalf("after both: %+v", e)
	}

	u.srv.Drain(context.Background())
	if c := u.getCapacity(auth...); c.Ready || !c.Draining {
		t.Fatalf("draining: ready %v draining %v", c.Ready, c.Draining)
	}
}

// The warm pool is reported per template with its own size, also when
// pool_size is 0 and only runtime_pool_size sizes templates (the fake
// sandbox never readies one: ready stays 0).
func TestUnitCapacityRuntimePoolSize(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) {
		c.PoolSize = 0
		c.Runtimes = map[string]string{"geo": "dir:/"}
		c.RuntimePoolSize = map[string]int{"geo": 2}
	})
	c := u.getCapacity().WarmPool
	want := map[string]int{"dynamic/geo": 2, "skill/geo": 2}
	if !maps.Equal(c.Size, want) || !maps.Equal(c.Ready, map[string]int{"dynamic/geo": 0, "skill/geo": 0}) {
		t.Fatalf("warm pool %+v, want sizes %v", c, want)
	}
}

// Without worker_id the field is left out, not "".
func TestUnitCapacityNoWorkerID(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	code, _, body := u.do("GET", "/v1/capacity", nil)
	if code != 200 || strings.Contains(string(body), "worker_id") {
		t.Fatalf("GET /v1/capacity = %d %s", code, body)
	}
}

// The Capacity schemas in openapi.json have the Go types' fields, and every
// field always encoded is required.
func TestOpenAPICapacitySchemas(t *testing.T) {
	var doc openapiDoc
	if err := json.Unmarshal(openapiJSON, &doc); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{
		"Capacity": Capacity{}, "CapacityExecutions": CapacityExecutions{},
		"CapacityWarmPool": CapacityWarmPool{}, "CapacitySessions": CapacitySessions{},
	} {
		sc, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("schema %s missing", name)
			continue
		}
		fields, always := jsonFields(reflect.TypeOf(v))
		props := slices.Sorted(maps.Keys(sc.Properties))
		if !slices.Equal(props, fields) {
			t.Errorf("schema %s: properties %v, Go type has %v", name, props, fields)
		}
		req := slices.Clone(sc.Required)
		sort.Strings(req)
		if !slices.Equal(req, always) {
			t.Errorf("schema %s: required %v, always encoded %v", name, req, always)
		}
	}
}

// The real worker: warm sandboxes ready per template (one taken while an
// execution runs in it), a running execution's slot, and a session's idle
// kernel with the memory it holds against the budget.
func TestCapacityReal(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	e := newSessionEnv(t, rootfs, func(c *config.Config) {
		c.PoolSize, c.PoolPreload = 1, nil
		c.MaxConcurrent, c.MaxQueued = 2, 1
		c.WorkerID = "node-1.cluster.local"
	})
	// One template per policy, on its own runtime: the keys are the
	// template names, built here by hand (not by templateName) so that a
	// change of the naming breaks this test.
	allReady := map[string]int{}
	for _, n := range e.srv.policies.Names() {
		allReady[n+"/"+e.srv.policies[n].Runtime] = 1
	}
	if len(allReady) != 2 || allReady["dynamic/default"] != 1 {
		t.Fatalf("templates %v, want dynamic/default and skill/default", allReady)
	}
	// Filling the pool starts a Python per template: minutes on a busy
	// machine, as in TestPoolThroughAPI.
	for deadline := time.Now().Add(2 * time.Minute); !maps.Equal(e.getCapacity().WarmPool.Ready, allReady); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", e.getCapacity().WarmPool)
		}
	}
	c := e.getCapacity()
	if c.WorkerID != "node-1.cluster.local" || !c.Ready || c.Draining || !maps.Equal(c.WarmPool.Size, allReady) ||
		c.Executions != (CapacityExecutions{Slots: 2, FreeSlots: 2, MaxQueued: 1}) {
		t.Fatalf("idle worker: %+v", c)
	}

	done := e.post(ExecutionRequest{ID: "cap-run", Code: "import time\nprint('up', flush=True)\ntime.sleep(1004)"})
	e.waitStatus("cap-run", StatusRunning)
	// The pool refills only once the execution is done: the dynamic
	// template's sandbox is taken, the others stay ready.
	dyn := TypeDynamic + "/" + config.DefaultRuntime
	waitFor(t, func() bool {
		n, ok := e.getCapacity().WarmPool.Ready[dyn]
		if !ok {
			t.Fatalf("no template %s: %+v", dyn, e.getCapacity().WarmPool)
		}
		return n == 0
	})
	c = e.getCapacity()
	if c.Executions.Running != 1 || c.Executions.FreeSlots != 1 {
		t.Fatalf("one running: %+v", c.Executions)
	}
	wantReady := maps.Clone(allReady)
	wantReady[dyn] = 0
	if !maps.Equal(c.WarmPool.Ready, wantReady) {
		t.Fatalf("ready while one runs warm: %v, want %v", c.WarmPool.Ready, wantReady)
	}
	if code, _, body := e.do("DELETE", "/v1/executions/cap-run", nil); code != 200 {
		t.Fatalf("DELETE = %d %s", code, body)
	}
	wantExecStatus(t, <-done, "cancelled")
	waitFor(t, func() bool { return e.getCapacity().Executions.Running == 0 })

	s := e.createSession(SessionRequest{})
	wantExecStatus(t, e.sessionExec(s.ID, SessionExecutionRequest{Code: "x = list(range(100000))"}), "succeeded")
	c = e.getCapacity()
	if ss := c.Sessions; !ss.Available || ss.Active != 1 || ss.Busy != 0 || ss.Idle != 1 || ss.Max != e.cfg.MaxSessions ||
		ss.IdleMemoryBytes <= 0 || ss.IdleMemoryLimitBytes != e.cfg.SessionIdleMemoryBytes {
		t.Fatalf("one session with an idle kernel: %+v", ss)
	}
	t.Logf("capacity: %+v", c)
}
