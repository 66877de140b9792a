package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// soakGrowthMiB bounds how much the worker's RSS may grow between the end of
// the warm-up and the end of the soak. A leak of one buffer per execution
// (a 3 MB output, a result, a goroutine's stack) grows it by hundreds of MiB
// over the default 2,000 executions; what remains is the Go heap's own
// breathing (the collector lets it reach twice what is live).
const soakGrowthMiB = 32

// soakWorkloads are the mixed executions of the soak, each with the status
// it must end in (or one of them, "|"-separated): everything an agent's
// code does to a worker, in turn.
var soakWorkloads = []struct {
	name, code, status string
	timeoutMS          int
}{
	{"print", "print(1)", "succeeded", 0},
	{"pandas", "import pandas as pd, numpy as np\n" +
		"df = pd.DataFrame({'k': np.arange(100_000) % 7, 'v': np.arange(100_000)})\n" +
		"print(df.groupby('k').v.sum().to_string())", "succeeded", 0},
	{"error", "raise ValueError('soak')", "failed", 0},
	{"timeout", "while True: pass", "timeout", 300},
	{"oom", "b = []\nwhile True: b.append(bytearray(64 << 20))", "oom", 0},
	// Held by the pids limit until its timeout, or ended by the memory
	// limit first: 128 forks of the image's Python, each dirtying its
	// copy-on-write pages, can pass 256 MiB (seen once in CI). Either is
	// the bomb contained; the worker's health is what the soak checks.
	{"forkbomb", "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", "timeout|oom", 1500},
	{"output", "import sys\nsys.stdout.write('x' * 3_000_000)", "succeeded", 0},
}

// SECURITY.md cases 8 and 31: thousands of mixed executions (prints, pandas,
// errors, timeouts, OOMs, fork bombs, 3 MB outputs) through a real
// `sandboxd serve` on the runtime image, warm pool on, leave the worker's
// RSS, fds and threads flat: each is measured after a warm-up fifth of the
// executions and again at the end. SANDBOXD_SOAK_N sets the number (default
// 140 in the suite; the README's numbers are from 2,000).
func TestServeSoakMixed(t *testing.T) {
	if testing.Short() {
		t.Skip("a soak: not with -short")
	}
	nsjailtest.RequireRoot(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	n := 140
	if v := os.Getenv("SANDBOXD_SOAK_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < len(soakWorkloads)*5 {
			t.Fatalf("SANDBOXD_SOAK_N=%q: want a number >= %d", v, len(soakWorkloads)*5)
		}
	}
	// No spare session kernel: it is made from a warm sandbox when one is
	// free, which with a pool of 1 under the soak's two clients happens at
	// a moment of its own, before or after the warm-up's measurement, and
	// holds ~14 fds and 2 threads of the worker's (seen failing the fd
	// bound on CI). The soak measures executions, not sessions.
	w := startWorker(t, "soak", rootfs, "EXECUTION_POOL_SIZE=1", "EXECUTION_MAX_CONCURRENT=2", "EXECUTION_DYNAMIC_MEMORY_MB=256",
		"EXECUTION_SESSION_SPARE_KERNELS=0")
	base := w.base

	var mu sync.Mutex
	statuses := map[string]map[string]int{}
	run := func(i int) {
		w := soakWorkloads[i%len(soakWorkloads)]
		req := map[string]any{"code": w.code}
		if w.timeoutMS > 0 {
			req["timeout_ms"] = w.timeoutMS
		}
		body, _ := json.Marshal(req)
		resp, err := http.Post(base+"/v1/executions", "application/json", bytes.NewReader(body))
		status := ""
		if err != nil {
			status = "http: " + err.Error()
		} else {
			var v struct{ Status string }
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || json.Unmarshal(data, &v) != nil {
				status = fmt.Sprintf("HTTP %d %.200s", resp.StatusCode, data)
			} else {
				status = v.Status
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if statuses[w.name] == nil {
			statuses[w.name] = map[string]int{}
		}
		statuses[w.name][status]++
	}
	soak := func(from, to int) {
		next := make(chan int)
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				for i := range next {
					run(i)
				}
			})
		}
		for i := from; i < to; i++ {
			next <- i
		}
		close(next)
		wg.Wait()
	}

	pid := w.pid()
	warm := n / 5
	start := time.Now()
	soak(0, warm)
	// Both measurements with the pool full and nothing starting: a ready
	// warm sandbox holds fds of the worker's (a template fork's: its
	// channels, pidfds and namespace fds, ~12), so a pool one sandbox
	// short at one measurement and full at the other looks like a leak.
	waitPoolFull(t, base)
	before := procUsage(t, pid)
	soak(warm, n)
	waitPoolFull(t, base)
	after := procUsage(t, pid)
	// The last executions' background work (sandbox removal, the pool's
	// refill, idle connections) holds fds and threads for a moment (seen:
	// +12 fds on a loaded CI machine): let it settle. A leak per execution
	// never settles, and shows as dozens here.
	for settle := time.Now().Add(15 * time.Second); (after.fds > before.fds+8 || after.threads > before.threads+8) && time.Now().Before(settle); {
		time.Sleep(250 * time.Millisecond)
		after = procUsage(t, pid)
	}
	t.Logf("%d executions in %s; worker after warm-up: %s; at the end: %s", n, time.Since(start).Round(time.Second), before, after)

	for _, w := range soakWorkloads {
		for status, count := range statuses[w.name] {
			if !slices.Contains(strings.Split(w.status, "|"), status) {
				t.Errorf("%s: %d ended %q, want %q", w.name, count, status, w.status)
			}
		}
	}
	if grew := after.rss - before.rss; grew > soakGrowthMiB<<20 {
		t.Errorf("RSS grew by %.1f MiB over the soak (bound %d MiB)", float64(grew)/(1<<20), soakGrowthMiB)
	}
	if after.peak > memoryBoundMiB<<20 {
		t.Errorf("peak RSS %.1f MiB is over the %d MiB bound", float64(after.peak)/(1<<20), memoryBoundMiB)
	}
	// A leaked fd or thread per execution would show as dozens here.
	if after.fds > before.fds+8 || after.threads > before.threads+8 {
		t.Errorf("fds %d → %d, threads %d → %d", before.fds, after.fds, before.threads, after.threads)
	}
	w.stop(t)
}

// usage is what the soak measures of the worker process.
type usage struct {
	rss, peak    int64
	fds, threads int
}

func (u usage) String() string {
	return fmt.Sprintf("RSS %.1f MiB (peak %.1f), %d fds, %d threads", float64(u.rss)/(1<<20), float64(u.peak)/(1<<20), u.fds, u.threads)
}

func procUsage(t *testing.T, pid int) usage {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var u usage
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, ":")
		num, _ := strconv.ParseInt(strings.Fields(v + " 0")[0], 10, 64)
		switch k {
		case "VmRSS":
			u.rss = num << 10
		case "VmHWM":
			u.peak = num << 10
		case "Threads":
			u.threads = int(num)
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	u.fds = len(fds)
	return u
}

// waitPoolFull waits (a minute at most) until the worker's warm pool holds
// its size of ready sandboxes for every template and starts none
// (/v1/capacity).
func waitPoolFull(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var c struct {
			WarmPool struct {
				Size, Ready map[string]int
				Starting    int
			} `json:"warm_pool"`
		}
		resp, err := http.Get(base + "/v1/capacity")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&c)
			resp.Body.Close()
		}
		full := err == nil && c.WarmPool.Starting == 0 && len(c.WarmPool.Size) > 0
		for k, n := range c.WarmPool.Size {
			full = full && c.WarmPool.Ready[k] >= n
		}
		if full {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm pool is not full a minute after the soak's executions (%+v, %v)", c.WarmPool, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
