package server

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
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
			cfg.MaxConcurrent = 1
			r := nsjailtest.NewRunner(b, nsjail.Options{StateRoot: cfg.StateRoot, CgroupParent: testCgroupParent, Logger: quietLog})
			srv, err := New(Deps{Config: cfg, Sandbox: r, Logger: quietLog,
				ResolveRootfs: func(context.Context) (string, error) { return rootfs, nil }})
			if err != nil {
				b.Fatal(err)
			}
			if err := srv.Prepare(context.Background()); err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			defer srv.Drain(context.Background())
			body, _ := json.Marshal(ExecutionRequest{Code: groupbyCode, Input: json.RawMessage(`{"by": "region"}`),
				Files: []File{{Path: "sales.csv", ContentBase64: b64(salesCSV)}}})
			waitPool := func() {
				for size > 0 && srv.PoolStats().Ready < uint64(len(srv.policies)) {
					time.Sleep(5 * time.Millisecond)
				}
			}
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				waitPool() // a steady state where a warm sandbox is ready
				b.StartTimer()
				rec := httptest.NewRecorder()
				req := httptest.NewRequest("POST", "/v1/executions", bytesReader(body))
				req.Host = "127.0.0.1"
				srv.Handler().ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
