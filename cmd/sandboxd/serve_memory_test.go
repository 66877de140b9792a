package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// memoryBoundMiB bounds the peak RSS (VmHWM) of `sandboxd serve` in
// TestServeMemoryWithLargeResults. Why 100 MiB (server/README.md, "Result
// store"): the worker idles at about 17 MiB; an answer streams through two
// buffers of 24 and 32 KiB and the HTTP server's 4 KiB, so 50 streams add
// ~3 MiB, and collecting an artifact copies it through one 32 KiB buffer;
// Go's collector lets the heap grow to twice what is live. Measured: 24 MiB.
// One answer of this test held in memory is 64 MiB of base64, and encoding
// it as JSON doubles that: the bound fails as soon as any path buffers one
// answer whole (before the result store, 10 executions and 10 GETs peaked at
// 2.3 GiB).
const memoryBoundMiB = 100

// SECURITY.md case 31 (a client fills the worker's memory with large
// results): 200 executions each return 48 MiB of artifacts, then 50
// parallel GETs read their answers in full. Answers are streamed from the
// result store, which keeps results_max_bytes on disk, so the worker's peak
// RSS stays below memoryBoundMiB.
func TestServeMemoryWithLargeResults(t *testing.T) {
	if testing.Short() {
		t.Skip("heavy (200 × 48 MiB through the worker, ~50 s): not with -short")
	}
	nsjailtest.RequireRoot(t)
	const (
		executions = 200
		readers    = 50
		budget     = 1 << 30 // results_max_bytes: ~21 of these results
		fileBytes  = 16 << 20
	)
	w := startWorker(t, "memory", shimRootfs(t), "EXECUTION_MAX_CONCURRENT=2", fmt.Sprintf("EXECUTION_RESULTS_MAX_BYTES=%d", budget))
	base := w.base
	idle := vmHWM(t, w.pid())

	// Each execution writes three 16 MiB files of random bytes: 48 MiB, the
	// default max_artifacts_bytes. Its POST answer (64 MiB of base64) is read
	// in full, two at a time (max_concurrent).
	code := fmt.Sprintf("cd /workspace/output/artifacts && head -c %d /dev/urandom > r1.bin && cat r1.bin > r2.bin && cat r1.bin > r3.bin", fileBytes)
	start := time.Now()
	ids := make(chan int)
	var wg sync.WaitGroup
	var errs sync.Map
	for range 2 {
		wg.Go(func() {
			for i := range ids {
				body := fmt.Sprintf(`{"id": "big-%d", "code": %q}`, i, code)
				if err := readAnswer(http.Post(base+"/v1/executions", "application/json", strings.NewReader(body))); err != nil {
					errs.Store(i, err)
				}
			}
		})
	}
	for i := range executions {
		ids <- i
	}
	close(ids)
	wg.Wait()
	errs.Range(func(k, v any) bool { t.Errorf("POST big-%d: %v", k, v); return true })
	if t.Failed() {
		t.FailNow()
	}
	posted := time.Since(start)

	// The results kept fit the budget; the newest are there, whole.
	kept := 0
	for i := executions - 1; i >= 0; i-- {
		resp, err := http.Get(fmt.Sprintf("%s/v1/executions/big-%d", base, i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			break
		}
		kept++
	}
	if kept < 5 || kept*48<<20 > budget {
		t.Fatalf("%d results kept within %d bytes", kept, budget)
	}
	oldest, err := http.Get(base + "/v1/executions/big-0")
	if err != nil {
		t.Fatal(err)
	}
	oldest.Body.Close()
	if oldest.StatusCode != 404 {
		t.Fatalf("the oldest result: GET = %d, want 404 (evicted)", oldest.StatusCode)
	}
	checkNewest(t, fmt.Sprintf("%s/v1/executions/big-%d", base, executions-1), 3*fileBytes)

	// 50 parallel GETs of the kept results, each read in full.
	start = time.Now()
	for r := range readers {
		wg.Go(func() {
			id := executions - 1 - r%kept
			if err := readAnswer(http.Get(fmt.Sprintf("%s/v1/executions/big-%d", base, id))); err != nil {
				errs.Store(id, err)
			}
		})
	}
	wg.Wait()
	errs.Range(func(k, v any) bool { t.Errorf("GET big-%d: %v", k, v); return true })
	read := time.Since(start)

	peak := vmHWM(t, w.pid())
	t.Logf("VmHWM: %.1f MiB idle, %.1f MiB peak after %d executions × 48 MiB (%s) and %d parallel GETs (%s); %d results kept",
		float64(idle)/(1<<20), float64(peak)/(1<<20), executions, posted.Round(time.Second), readers, read.Round(time.Second), kept)
	if peak > memoryBoundMiB<<20 {
		t.Errorf("peak RSS %.1f MiB is over the %d MiB bound", float64(peak)/(1<<20), memoryBoundMiB)
	}
	w.stop(t)
}

// readAnswer reads a 200 answer in full, checks that it is a succeeded
// execution of the length announced, and closes it.
func readAnswer(resp *http.Response, err error) error {
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 4096)
	head, _ := br.Peek(4096)
	if resp.StatusCode != 200 || !bytes.Contains(head, []byte(`"status":"succeeded"`)) {
		return fmt.Errorf("%d %.300s", resp.StatusCode, head)
	}
	n, err := io.Copy(io.Discard, br)
	if err != nil || n != resp.ContentLength {
		return fmt.Errorf("read %d bytes of %d: %v", n, resp.ContentLength, err)
	}
	return nil
}

// checkNewest decodes one answer and checks its artifacts' sizes and hashes.
func checkNewest(t *testing.T, url string, total int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Artifacts []struct {
			Size          int
			SHA256        string
			ContentBase64 string `json:"content_base64"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, a := range v.Artifacts {
		data, err := base64.StdEncoding.DecodeString(a.ContentBase64)
		h := sha256.Sum256(data)
		if err != nil || len(data) != a.Size || hex.EncodeToString(h[:]) != a.SHA256 {
			t.Fatalf("artifact: %v, %d bytes, size %d", err, len(data), a.Size)
		}
		sum += a.Size
	}
	if len(v.Artifacts) != 3 || sum != total {
		t.Fatalf("%d artifacts, %d bytes", len(v.Artifacts), sum)
	}
}

// vmHWM is the peak resident set size of pid, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}
