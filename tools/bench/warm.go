package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// warmScript is "the same work run in an already-warm interpreter": it
// imports the pool's default preload, then execs each workload's code as
// __main__ in a fresh cwd with stdout captured, timing only the exec. The
// first exec of each workload in a process is reported apart from the later
// ones: a pool sandbox is single-use, so it always runs the "first" case
// (e.g. matplotlib loads its fonts on the first figure), while "steady" is the
// best case of an interpreter that is reused (which sandboxd never does).
const warmScript = `
import contextlib, io, json, os, sys, tempfile, time
import numpy, pandas, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot
work = json.loads(sys.argv[1])
steady = int(sys.argv[2])
out = {"first": {}, "steady": {}}
def run(code, want):
    os.chdir(tempfile.mkdtemp(dir="/tmp"))
    buf = io.StringIO()
    c = compile(code, "/workspace/code/main.py", "exec")
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        exec(c, {"__name__": "__main__", "__file__": "/workspace/code/main.py"})
    dt = (time.perf_counter() - t0) * 1000
    if buf.getvalue() != want:
        raise SystemExit("unexpected output %r" % buf.getvalue())
    return dt
for name, (code, want) in work.items():
    out["first"][name] = run(code, want)
for name, (code, want) in work.items():
    out["steady"][name] = [run(code, want) for _ in range(steady)]
sys.__stdout__.write(json.dumps(out) + "\n")
`

// WarmResult is the warm-interpreter baseline per workload.
type WarmResult struct {
	Launcher string `json:"launcher"`
	// First is the first exec after the preload, one per fresh process.
	First map[string]Summary `json:"first"`
	// Steady is every later exec in the same processes.
	Steady  map[string]Summary `json:"steady"`
	Skipped string             `json:"skipped,omitempty"`
	Errors  []string           `json:"errors,omitempty"`
}

// warmBaseline runs warmScript in `procs` fresh sandboxes made by launch
// (sandboxd run, same limits as the API), each doing `steady` repeated execs.
func warmBaseline(ctx context.Context, launcher string, launch func(args []string) *exec.Cmd, procs, steady int) WarmResult {
	res := WarmResult{Launcher: launcher, First: map[string]Summary{}, Steady: map[string]Summary{}}
	work := map[string][2]string{}
	for _, w := range workloads {
		work[w.Name] = [2]string{w.Code, w.Stdout}
	}
	arg, _ := json.Marshal(work)
	first := map[string][]time.Duration{}
	stead := map[string][]time.Duration{}
	fails := 0
	for i := 0; i < procs; i++ {
		cmd := launch([]string{"python3", "-c", warmScript, string(arg), strconv.Itoa(steady)})
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			fails++
			if len(res.Errors) < 3 {
				res.Errors = append(res.Errors, fmt.Sprintf("%v: %s", err, tail(strings.TrimSpace(stderr.String()), 300)))
			}
			continue
		}
		var out struct {
			First  map[string]float64   `json:"first"`
			Steady map[string][]float64 `json:"steady"`
		}
		if err := json.Unmarshal(bytes.TrimSpace(lastLine(stdout.Bytes())), &out); err != nil {
			fails++
			res.Errors = append(res.Errors, fmt.Sprintf("decode %q: %v", tail(stdout.String(), 200), err))
			continue
		}
		for k, v := range out.First {
			first[k] = append(first[k], msToDuration(v))
		}
		for k, vs := range out.Steady {
			for _, v := range vs {
				stead[k] = append(stead[k], msToDuration(v))
			}
		}
	}
	for _, w := range workloads {
		res.First[w.Name] = Summarize(first[w.Name], fails, 0)
		res.Steady[w.Name] = Summarize(stead[w.Name], fails, 0)
	}
	return res
}

func msToDuration(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}

// sandboxdLaunch returns a launch func for warmBaseline that runs args in a
// fresh `sandboxd run` sandbox with the peers' limits and environment.
func sandboxdLaunch(ctx context.Context, e peerEnvironment, workspace string) func(args []string) *exec.Cmd {
	return func(args []string) *exec.Cmd {
		cli := []string{"run", "--rootfs", e.Rootfs, "--workspace", workspace,
			"--memory", strconv.FormatInt(e.Limits.MemoryBytes, 10),
			"--cpus", strconv.FormatFloat(e.Limits.CPUs, 'f', -1, 64),
			"--pids", strconv.FormatInt(e.Limits.Pids, 10), "--timeout", "10m"}
		for _, kv := range peerEnv {
			if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "PATH=") {
				cli = append(cli, "--env", kv)
			}
		}
		cli = append(cli, "--")
		return exec.CommandContext(ctx, e.Sandboxd, append(cli, args...)...)
	}
}
