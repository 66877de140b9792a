// Command bench measures sandboxd against its targets and its peers.
//
// It drives the HTTP API on loopback (starting `sandboxd serve` itself on a
// free 127.0.0.1 port with a temporary work root, or targeting -url) with two
// workloads, print(1) and a pandas groupby over 100k rows plus one matplotlib
// PNG, at several concurrencies with the warm pool off and on. On the same
// rootfs it launches the same workloads cold with `sandboxd run`, runc, crun,
// bubblewrap and `docker run` (each where installed, the others noted as
// skipped), measures the same work in an already-warm interpreter, the idle
// memory of a pool sandbox, and nsjail's BenchmarkExecTrue. It writes a
// Markdown report (with ratios against the fastest peer), JSON, and a
// latency-distribution chart (PNG).
//
// Usage (as root, from the repository root, after `make build`):
//
//	go run -tags seccomp ./tools/bench -rootfs DIR [-quick]
//
// or `make bench`. Run `go run ./tools/bench -h` for every flag.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	URL         string
	Sandboxd    string
	Rootfs      string
	Image       string
	ImageTar    string
	Out         string
	Results     string
	Quick       bool
	Conc        []int
	Workloads   []Workload
	Pools       []string
	PoolSize    int
	NPrint      int
	NPandas     int
	CellTime    time.Duration
	WarmN       int
	PoolWait    time.Duration
	Peers       []string
	PeerRuns    map[string]int
	PeerTime    time.Duration
	WarmProcs   int
	WarmSteady  int
	ExecTrue    int
	ServerEnv   []string
	DockerImp   bool
	KeepImage   bool
	SkipAPI     bool
	SkipPeers   bool
	SkipSess    bool
	SessN       int
	SessCSVMB   int
	SessMemN    int
	SessLatOnly bool
	// SessIdleN sessions measured idle before they load data (issue 17's
	// M2); SessIdleOnly: only that in the sessions section.
	SessIdleN    int
	SessIdleOnly bool
	From         string
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&c.URL, "url", "", "benchmark a running server at this base URL instead of starting one (pool on/off and memory are then not controlled)")
	fs.StringVar(&c.Sandboxd, "sandboxd", "bin/sandboxd", "sandboxd binary (make build)")
	fs.StringVar(&c.Rootfs, "rootfs", os.Getenv("SANDBOXD_RUNTIME_ROOTFS"), "unpacked python-runtime rootfs, shared read-only by every launcher (default $SANDBOXD_RUNTIME_ROOTFS)")
	fs.StringVar(&c.Image, "image", "", "EXECUTION_PYTHON_IMAGE for the started server (default dir:<rootfs>)")
	fs.StringVar(&c.ImageTar, "image-tar", "build/python-runtime.tar", "docker-archive of the runtime image, for the docker peer")
	fs.StringVar(&c.Out, "out", "build/bench", "output directory (report.md, results.json, latency.png, server logs)")
	fs.StringVar(&c.Results, "results", "tools/bench/RESULTS.md", "also copy the Markdown report here (empty: don't)")
	fs.BoolVar(&c.Quick, "quick", false, "few requests per cell (~2 minutes): a smoke run, not numbers to publish")
	conc := fs.String("concurrency", "1,2,4,8", "API concurrency levels")
	wls := fs.String("workloads", "print,pandas", "API workloads to run")
	pools := fs.String("pools", "off,on", "pool settings to run: off (EXECUTION_POOL_SIZE=0), on (=-pool-size, the server's default kind of warm sandbox), zygotes and forks (pool on with EXECUTION_POOL_TEMPLATE_FORKS=false/true: issue 17's comparison in one run)")
	fs.IntVar(&c.PoolSize, "pool-size", 4, "EXECUTION_POOL_SIZE for the pool-on runs")
	fs.IntVar(&c.NPrint, "n-print", 60, "requests per API cell, print(1)")
	fs.IntVar(&c.NPandas, "n-pandas", 30, "requests per API cell, pandas")
	fs.DurationVar(&c.CellTime, "cell-time", 60*time.Second, "time bound per API cell (stops sending after it)")
	fs.IntVar(&c.WarmN, "warm-n", 20, "requests in the pool-on 'warm' cells (pool refilled before each request)")
	fs.DurationVar(&c.PoolWait, "pool-wait", 90*time.Second, "longest wait for the pool to (re)fill")
	peers := fs.String("peers", "sandboxd,runc,crun,bwrap,docker", "cold launchers to compare")
	peerRuns := fs.String("peer-runs", "true=30,print=20,pandas=10", "sequential cold runs per launcher and kind")
	fs.DurationVar(&c.PeerTime, "peer-time", 40*time.Second, "time bound per launcher and kind")
	fs.IntVar(&c.WarmProcs, "warm-procs", 5, "fresh warm interpreters for the warm-interpreter baseline")
	fs.IntVar(&c.WarmSteady, "warm-steady", 10, "repeated execs per warm interpreter")
	fs.IntVar(&c.ExecTrue, "exectrue", 200, "runs of nsjail's BenchmarkExecTrue (0: skip)")
	fs.BoolVar(&c.DockerImp, "docker-import", true, "without a docker-archive, make the docker peer's image by `docker import` of the rootfs")
	fs.BoolVar(&c.KeepImage, "keep-docker-image", false, "leave the loaded image in Docker afterwards")
	fs.BoolVar(&c.SkipAPI, "skip-api", false, "skip the HTTP API matrix")
	fs.BoolVar(&c.SkipPeers, "skip-peers", false, "skip the cold launchers, the warm-interpreter baseline and BenchmarkExecTrue")
	fs.BoolVar(&c.SkipSess, "skip-sessions", false, "skip the sessions section (create + first execution, live kernel, ten-step CSV analysis, idle session memory)")
	fs.IntVar(&c.SessN, "sessions-n", 30, "sessions: create+first samples (and 4x as many live-kernel executions)")
	fs.IntVar(&c.SessCSVMB, "sessions-csv-mb", 50, "sessions: size of the ten-step analysis CSV (MB)")
	fs.IntVar(&c.SessMemN, "sessions-mem-n", 4, "sessions: idle sessions with the CSV loaded whose memory is measured")
	fs.BoolVar(&c.SessLatOnly, "sessions-latency-only", false, "sessions: measure only create + first print(1) and print(1) in a live kernel (no ten-step analysis, no idle memory): for comparing builds")
	fs.IntVar(&c.SessIdleN, "sessions-idle-n", 20, "sessions: idle sessions measured before they load data (pandas imported, one print(1) cell; 0: skip)")
	fs.BoolVar(&c.SessIdleOnly, "sessions-idle-only", false, "sessions: measure only the idle sessions before data (-sessions-idle-n), nothing else of the section")
	fs.StringVar(&c.From, "from", "", "measure nothing: re-render report.md, latency.png (and -results) from this results.json")
	var env multiFlag
	fs.Var(&env, "server-env", "KEY=VALUE added to the started server's environment (repeatable)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	c.ServerEnv = env
	var err error
	if c.Conc, err = parseInts(*conc); err != nil {
		return c, fmt.Errorf("-concurrency: %w", err)
	}
	for _, name := range splitList(*wls) {
		w, ok := workloadByName(name)
		if !ok {
			return c, fmt.Errorf("-workloads: unknown workload %q (know print, pandas)", name)
		}
		c.Workloads = append(c.Workloads, w)
	}
	if len(c.Workloads) == 0 {
		return c, fmt.Errorf("-workloads: empty list")
	}
	for _, p := range splitList(*pools) {
		if _, ok := poolSettingEnv[p]; !ok {
			return c, fmt.Errorf("-pools: want off, on, zygotes or forks, got %q", p)
		}
		c.Pools = append(c.Pools, p)
	}
	c.Peers = splitList(*peers)
	for _, p := range c.Peers {
		if !slices.Contains([]string{"sandboxd", "runc", "crun", "bwrap", "docker"}, p) {
			return c, fmt.Errorf("-peers: unknown launcher %q (know sandboxd, runc, crun, bwrap, docker)", p)
		}
	}
	c.PeerRuns = map[string]int{}
	for _, kv := range splitList(*peerRuns) {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 || !slices.Contains(peerKinds, k) {
			return c, fmt.Errorf("-peer-runs: want KIND=N with KIND in %v, got %q", peerKinds, kv)
		}
		c.PeerRuns[k] = n
	}
	if c.Quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		quick := func(name string, p *int, v int) {
			if !set[name] {
				*p = v
			}
		}
		quick("n-print", &c.NPrint, 16)
		quick("sessions-n", &c.SessN, 8)
		quick("sessions-csv-mb", &c.SessCSVMB, 10)
		quick("sessions-mem-n", &c.SessMemN, 2)
		quick("sessions-idle-n", &c.SessIdleN, 4)
		quick("n-pandas", &c.NPandas, 6)
		quick("warm-n", &c.WarmN, 6)
		quick("warm-procs", &c.WarmProcs, 2)
		quick("warm-steady", &c.WarmSteady, 3)
		quick("exectrue", &c.ExecTrue, 50)
		if !set["peer-runs"] {
			c.PeerRuns = map[string]int{kindTrue: 10, kindPrint: 5, kindPandas: 3}
		}
	}
	for name, v := range map[string]int{"n-print": c.NPrint, "n-pandas": c.NPandas, "pool-size": c.PoolSize} {
		if v <= 0 {
			return c, fmt.Errorf("-%s must be > 0, got: %d", name, v)
		}
	}
	if c.From == "" && (c.URL == "" && (!c.SkipAPI || !c.SkipSess) || !c.SkipPeers) {
		if c.Rootfs == "" {
			return c, fmt.Errorf("-rootfs (or $SANDBOXD_RUNTIME_ROOTFS) is required: the unpacked python-runtime rootfs")
		}
		abs, err := filepath.Abs(c.Rootfs)
		if err != nil {
			return c, err
		}
		c.Rootfs = abs
		if _, err := os.Stat(filepath.Join(c.Rootfs, "usr/bin/python3")); err != nil {
			return c, fmt.Errorf("-rootfs %s has no usr/bin/python3: %w", c.Rootfs, err)
		}
	}
	if c.Image == "" {
		c.Image = "dir:" + c.Rootfs
	}
	if c.Sandboxd, err = filepath.Abs(c.Sandboxd); err != nil {
		return c, err
	}
	return c, nil
}

func run(ctx context.Context, cfg config) error {
	if cfg.From != "" {
		data, err := os.ReadFile(cfg.From)
		if err != nil {
			return err
		}
		var rep Report
		if err := json.Unmarshal(data, &rep); err != nil {
			return fmt.Errorf("%s: %w", cfg.From, err)
		}
		if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
			return err
		}
		rep.Targets = evaluateTargets(&rep)
		return writeOutputs(cfg, &rep, func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root: starts sandboxes, runc/crun containers and the server")
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
	}
	rep := &Report{Meta: collectMeta(cfg)}
	started := time.Now()

	if !cfg.SkipAPI {
		if err := runAPI(ctx, cfg, rep, logf); err != nil {
			return err
		}
	}
	if !cfg.SkipSess && cfg.URL == "" && ctx.Err() == nil {
		if err := runSessionsPhase(ctx, cfg, rep, logf); err != nil {
			return err
		}
	}
	if !cfg.SkipPeers && ctx.Err() == nil {
		runPeers(ctx, cfg, rep, logf)
	}
	rep.Meta.DurationS = round3(time.Since(started).Seconds())
	rep.Meta.LoadAvgAfter = loadAvg()
	rep.Targets = evaluateTargets(rep)
	return writeOutputs(cfg, rep, logf)
}

// runAPI runs the API matrix against a started server per pool setting, or
// once against -url.
func runAPI(ctx context.Context, cfg config, rep *Report, logf func(string, ...any)) error {
	if cfg.URL != "" {
		c := newAPIClient(cfg.URL)
		if err := c.waitReady(ctx, 30*time.Second); err != nil {
			return err
		}
		rep.Notes = append(rep.Notes, "API measured against an external server at "+cfg.URL+": pool setting and sandbox memory not controlled by the bench.")
		runMatrix(ctx, cfg, rep, c, "external", 0, nil, logf)
		return nil
	}
	poolOK, why := poolSupported(cfg)
	rep.PoolSupported = poolOK
	for _, pool := range cfg.Pools {
		if ctx.Err() != nil {
			break
		}
		size, on := 0, pool != "off"
		if on {
			if !poolOK {
				note := "pool " + pool + ": not run: " + why
				rep.Notes = append(rep.Notes, note)
				logf("%s", note)
				continue
			}
			size = cfg.PoolSize
		}
		label := poolLabel(pool, size)
		logf("starting sandboxd serve (%s)", label)
		cgParent := fmt.Sprintf("sandboxd-bench-%d-%s", os.Getpid(), pool)
		logPath := filepath.Join(absOut(cfg), "server-pool-"+pool+".log")
		env := cfg.ServerEnv
		if e := poolSettingEnv[pool]; e != "" {
			env = append(slices.Clone(env), e)
		}
		srv, err := startServer(ctx, serverOptions{
			Binary: cfg.Sandboxd, Image: cfg.Image, PoolSize: size, ExtraEnv: env,
			LogPath: logPath, CgroupParent: cgParent,
		})
		if err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
		if on {
			if log := tailFile(logPath, 100000); strings.Contains(log, "unknown") &&
				(strings.Contains(log, "EXECUTION_POOL_SIZE") || strings.Contains(log, "EXECUTION_POOL_TEMPLATE_FORKS")) {
				rep.Notes = append(rep.Notes, label+": the server warned that a pool setting is unknown; its cells may measure another path")
			}
		}
		var wait func()
		if on {
			want := size * policyCount(ctx, srv.client)
			logf("waiting for %d ready sandboxes (%d per policy)", want, size)
			if err := waitPool(ctx, srv, size, want, cfg.PoolWait); err != nil {
				rep.Notes = append(rep.Notes, label+": "+err.Error())
				logf("%v", err)
			}
			pm := measurePoolMemory(ctx, srv)
			pm.Pool = label
			switch {
			case pool == "forks":
				rep.ForksPoolMemory = pm
			case rep.PoolMemory == nil || pool == "on":
				rep.PoolMemory = pm // issue 5's: the shipped setting's before zygotes'
			}
			wait = func() { _ = waitPool(ctx, srv, size, want, cfg.PoolWait) }
		}
		first := len(rep.API)
		runMatrix(ctx, cfg, rep, srv.client, label, size, wait, logf)
		for i := first; i < len(rep.API); i++ {
			rep.API[i].Setting = pool
		}
		logf("stopping sandboxd serve (%s)", label)
		live := sandboxesBelow(srv.pid())
		srv.stop()
		if at := srv.exitedEarlyAt(); at != "" {
			note := fmt.Sprintf("%s: the server exited at %s UTC before the bench stopped it; the cells after that failed with 'connection refused'. Its log: %s",
				label, at, firstSignalLine(filepath.Join(absOut(cfg), "server-pool-"+pool+".log")))
			rep.Notes = append(rep.Notes, note)
			logf("%s", note)
		}
		// A clean shutdown destroys every sandbox, the idle pool included.
		if left := leftoverCgroups(live); len(left) > 0 {
			removed := removeLeftoverCgroups(left)
			note := fmt.Sprintf("%s: after SIGTERM the server left %d of its %d sandbox cgroups behind (e.g. %s); the bench removed %d empty cgroup directories",
				label, len(left), len(live), left[0], removed)
			rep.Notes = append(rep.Notes, note)
			logf("%s", note)
		}
		removeOwnCgroupDir(cgParent)
	}
	return nil
}

// poolSettingEnv is what each -pools setting adds to the server's
// environment: zygotes and forks name the kind of warm sandbox, so that one
// run compares them (issue 17's targets are ratios within one run).
var poolSettingEnv = map[string]string{
	"off":     "",
	"on":      "",
	"zygotes": "EXECUTION_POOL_TEMPLATE_FORKS=false",
	"forks":   "EXECUTION_POOL_TEMPLATE_FORKS=true",
}

func poolLabel(setting string, size int) string {
	switch setting {
	case "off":
		return "pool off"
	case "on":
		return fmt.Sprintf("pool on (%d)", size)
	}
	return fmt.Sprintf("pool on (%d, %s)", size, setting)
}

// runMatrix runs every workload × concurrency cell, and with a pool the
// "warm" cells (pool refilled before each request, concurrency 1).
func runMatrix(ctx context.Context, cfg config, rep *Report, c *apiClient, label string, size int, waitPool func(), logf func(string, ...any)) {
	for _, w := range cfg.Workloads {
		// Untimed warm-up: page cache, first-use costs in the server.
		for range 2 {
			if waitPool != nil {
				waitPool()
			}
			if err := c.execute(ctx, w); err != nil {
				logf("%s %s warm-up failed: %v", label, w.Name, err)
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s %s warm-up failed: %v", label, w.Name, err))
			}
		}
		n := cfg.NPrint
		if w.Name == workloadPandas.Name {
			n = cfg.NPandas
		}
		if waitPool != nil && ctx.Err() == nil {
			r := c.runLoad(ctx, w, 1, cfg.WarmN, cfg.CellTime*3, waitPool)
			rep.addCell(w.Name, label, size, "warm", 1, r)
			logCell(logf, rep.API[len(rep.API)-1])
		}
		for _, conc := range cfg.Conc {
			if ctx.Err() != nil {
				return
			}
			if waitPool != nil {
				waitPool()
			}
			r := c.runLoad(ctx, w, conc, n, cfg.CellTime, nil)
			rep.addCell(w.Name, label, size, "closed-loop", conc, r)
			logCell(logf, rep.API[len(rep.API)-1])
		}
	}
}

func logCell(logf func(string, ...any), c APICell) {
	logf("api %-7s %-12s %-11s c=%d n=%d fail=%d p50=%.2fms p90=%.2fms p99=%.2fms %.1f/s",
		c.Workload, c.Pool, c.Mode, c.Concurrency, c.N, c.Failures, c.P50MS, c.P90MS, c.P99MS, c.PerSec)
	for _, e := range c.Errors {
		logf("    error: %s", e)
	}
}

// poolSupported asks the binary whether it knows EXECUTION_POOL_SIZE:
// `sandboxd config print` lists every setting.
func poolSupported(cfg config) (bool, string) {
	cmd := exec.Command(cfg.Sandboxd, "config", "print")
	cmd.Env = append(os.Environ(), "EXECUTION_POOL_SIZE=1")
	out, _ := cmd.Output()
	if strings.Contains(string(out), "pool_size") {
		return true, ""
	}
	return false, "this sandboxd does not know EXECUTION_POOL_SIZE yet (`sandboxd config print` lists no pool_size); only the cold path (pool off) was measured"
}

// waitPool waits until the pool is full: from /metrics when the server
// exports the pool's gauges (ready >= want, where want is the size times the
// number of policies since the pool fills per policy; after half the timeout
// also nothing starting and at least size ready), else by counting idle python sandboxes in the
// process tree (an idle one uses no CPU for 200 ms).
func waitPool(ctx context.Context, srv *serverProc, size, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := -1.0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		_, text, err := srv.client.getText(ctx, "/metrics")
		var st poolState
		if err == nil {
			st = poolMetrics(text)
		}
		if st.HasReady {
			// The relaxed condition only after a while: right after an
			// execution the pool shows one sandbox fewer and none starting
			// yet, and a request sent then would race its refill.
			relaxed := time.Until(deadline) < timeout/2 && st.Starting == 0 && st.Ready >= float64(size)
			if st.Ready >= float64(want) || relaxed {
				return nil
			}
			last = st.Ready
		} else {
			n := idleSandboxes(srv.pid(), 200*time.Millisecond)
			if n >= size {
				return nil
			}
			last = float64(n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("pool not full after %s: %.0f of %d sandboxes ready", timeout, last, want)
}

// policyCount is the number of policies the server lists (the pool keeps
// pool_size sandboxes for each); 1 when it cannot tell.
func policyCount(ctx context.Context, c *apiClient) int {
	code, body, err := c.getText(ctx, "/v1/policies")
	if err != nil || code != 200 {
		return 1
	}
	var p struct {
		Policies map[string]json.RawMessage `json:"policies"`
	}
	if json.Unmarshal([]byte(body), &p) != nil || len(p.Policies) == 0 {
		return 1
	}
	return len(p.Policies)
}

// idleSandboxes counts python sandboxes below pid whose processes used no
// CPU over interval.
func idleSandboxes(pid int, interval time.Duration) int {
	before := cpuTicksByCgroup(pid)
	time.Sleep(interval)
	after := cpuTicksByCgroup(pid)
	n := 0
	for cg, t := range after {
		if b, ok := before[cg]; ok && b == t {
			n++
		}
	}
	return n
}

func measurePoolMemory(ctx context.Context, srv *serverProc) *PoolMemory {
	pm := &PoolMemory{}
	for _, s := range sandboxesBelow(srv.pid()) {
		if s.Python {
			pm.Sandboxes = append(pm.Sandboxes, s)
		}
	}
	if _, text, err := srv.client.getText(ctx, "/metrics"); err == nil {
		pm.Metrics = poolMetrics(text).Lines
	}
	var pss, cg, rss []float64
	for _, s := range pm.Sandboxes {
		pss = append(pss, float64(s.PSSBytes))
		rss = append(rss, float64(s.RSSBytes))
		cg = append(cg, float64(s.CgroupBytes))
	}
	pm.MedianPSSMiB = medianMiB(pss)
	pm.MedianRSSMiB = medianMiB(rss)
	pm.MedianCgroupMiB = medianMiB(cg)
	return pm
}

func medianMiB(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return round3(Percentile(v, 50) / (1 << 20))
}

func runPeers(ctx context.Context, cfg config, rep *Report, logf func(string, ...any)) {
	work, err := os.MkdirTemp("", "sandboxd-bench-peers-")
	if err != nil {
		rep.Notes = append(rep.Notes, "peers: "+err.Error())
		return
	}
	defer os.RemoveAll(work)
	imageTar := cfg.ImageTar
	if imageTar != "" {
		imageTar, _ = filepath.Abs(imageTar)
	}
	env := peerEnvironment{Rootfs: cfg.Rootfs, Sandboxd: cfg.Sandboxd, ImageTar: imageTar, WorkDir: work,
		Limits: defaultPeerLimits, KeepDockerImage: cfg.KeepImage, DockerImportRootfs: cfg.DockerImp, Logf: logf}
	byFlag := map[string]func() *peer{
		"sandboxd": env.sandboxdPeer, "runc": func() *peer { return env.ociPeer("runc") },
		"crun": func() *peer { return env.ociPeer("crun") }, "bwrap": env.bwrapPeer, "docker": env.dockerPeer,
	}
	for _, name := range cfg.Peers {
		if ctx.Err() != nil {
			return
		}
		logf("peer %s", name)
		rep.Peers = append(rep.Peers, runPeer(ctx, byFlag[name](), cfg.PeerRuns, cfg.PeerTime, logf))
	}
	if cfg.WarmProcs > 0 && ctx.Err() == nil {
		ws := filepath.Join(work, "warm-workspace")
		if err := os.MkdirAll(ws, 0o755); err == nil {
			_ = os.Chmod(ws, 0o777) // see sandboxdPeer
		}
		logf("warm-interpreter baseline: %d interpreters × (1 + %d) execs", cfg.WarmProcs, cfg.WarmSteady)
		w := warmBaseline(ctx, "sandboxd run (same limits as the API)", sandboxdLaunch(ctx, env, ws), cfg.WarmProcs, cfg.WarmSteady)
		for _, name := range []string{workloadPrint.Name, workloadPandas.Name} {
			logf("warm %-7s first p50=%.2fms  steady p50=%.2fms", name, w.First[name].P50MS, w.Steady[name].P50MS)
		}
		for _, e := range w.Errors {
			logf("    error: %s", e)
		}
		rep.Warm = &w
	}
	if cfg.ExecTrue > 0 && ctx.Err() == nil {
		logf("nsjail BenchmarkExecTrue, %d runs", cfg.ExecTrue)
		r := runExecTrue(ctx, repoRoot(), cfg.ExecTrue)
		if r.Skipped != "" {
			logf("BenchmarkExecTrue: %s", r.Skipped)
		} else {
			logf("BenchmarkExecTrue median %.2fms p90 %.2fms", r.MedianMS, r.P90MS)
		}
		rep.ExecTrue = &r
	}
}

// repoRoot is the directory holding go.mod, found upwards from the cwd.
func repoRoot() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

func absOut(cfg config) string {
	a, err := filepath.Abs(cfg.Out)
	if err != nil {
		return cfg.Out
	}
	return a
}

func collectMeta(cfg config) Meta {
	m := Meta{
		Time:   time.Now().UTC().Format(time.RFC3339),
		GoOS:   runtime.GOOS + "/" + runtime.GOARCH,
		CPUs:   runtime.NumCPU(),
		Quick:  cfg.Quick,
		Rootfs: cfg.Rootfs,
		Args:   os.Args[1:],
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	if out, err := exec.Command("git", "-C", repoRoot(), "describe", "--always", "--dirty").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	m.LoadAvgBefore = loadAvg()
	m.Sandboxd = cfg.Sandboxd
	m.SandboxdRev = binaryRevision(cfg.Sandboxd)
	return m
}

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("want positive integers, got %q", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error {
	if !strings.Contains(v, "=") || strings.HasPrefix(v, "=") {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*m = append(*m, v)
	return nil
}

// binaryRevision is the VCS revision a Go binary was built from, from its
// embedded build info ("" when it has none).
func binaryRevision(bin string) string {
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		return ""
	}
	var rev string
	var dirty bool
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "build" {
			if v, ok := strings.CutPrefix(f[1], "vcs.revision="); ok && len(v) >= 12 {
				rev = v[:12]
			}
			dirty = dirty || f[1] == "vcs.modified=true"
		}
	}
	if rev != "" && dirty {
		rev += "+dirty"
	}
	if rev == "" {
		// Built with -buildvcs=false: name the checkout the binary sits in
		// (make build puts it in bin/ of the tree it was built from).
		if out, err := exec.Command("git", "-C", filepath.Dir(bin), "describe", "--always", "--dirty").Output(); err == nil {
			rev = strings.TrimSpace(string(out)) + " (checkout holding the binary)"
		}
	}
	return rev
}

// firstSignalLine returns the server log's line about a received signal or
// a panic, or its last line.
func firstSignalLine(path string) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for _, l := range lines {
		if strings.Contains(l, "signal received") || strings.HasPrefix(l, "panic") || strings.Contains(l, "fatal error") {
			return "`" + tail(l, 300) + "`"
		}
	}
	return "`" + tail(lines[len(lines)-1], 300) + "`"
}
