package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// metrics are the server's Prometheus series, on its own registry (no
// globals: two servers in one test binary do not share counters).
type metrics struct {
	reg        *prometheus.Registry
	executions *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	inFlight   prometheus.Gauge
	queued     prometheus.Gauge
	rejected   *prometheus.CounterVec
	// quotaRefusals counts what the API refused for a session's quota
	// (the code's own ENOSPC is the code's).
	quotaRefusals prometheus.Counter
	// forwards counts the session requests for another worker's session
	// (forward.go), by outcome.
	forwards *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_executions_total",
			Help: "Finished executions by type and final status.",
		}, []string{"type", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandboxd_execution_duration_seconds",
			Help:    "Wall time of executions from admission to result, by type.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300},
		}, []string{"type"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandboxd_executions_in_flight",
			Help: "Executions holding a slot (running).",
		}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandboxd_executions_queued",
			Help: "Executions waiting for a slot.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_requests_rejected_total",
			Help: "Requests refused before any sandbox started, by reason.",
		}, []string{"reason"}),
		quotaRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_session_quota_refusals_total",
			Help: "Uploads and execution files refused (413) because a session's workspace quota was used up.",
		}),
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_session_forwards_total",
			Help: "Requests for a session another worker owns, by outcome: proxied (the owner answered), owner_gone (410), owner_unavailable (503), forward_loop (503), failed (502, or the client's body broke), cut (the owner's answer broke midway), cancelled.",
		}, []string{"outcome"}),
	}
	m.reg.MustRegister(m.executions, m.duration, m.inFlight, m.queued, m.rejected, m.quotaRefusals, m.forwards,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerResults exports the result store's size.
func (m *metrics) registerResults(stats func() (int, int64)) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandboxd_results_stored",
			Help: "Finished results kept for GET.",
		}, func() float64 { n, _ := stats(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandboxd_results_bytes",
			Help: "Bytes the kept results hold on disk (answers' JSON and artifacts), bounded by results_max_bytes.",
		}, func() float64 { _, b := stats(); return float64(b) }))
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// poolCollector exports the warm pool's state. One Stats() per scrape (it
// reads every ready sandbox's cgroup), rather than one per series as
// separate GaugeFuncs would.
type poolCollector struct {
	size  int
	stats func() warmpool.Stats
}

var (
	poolSizeDesc       = prometheus.NewDesc("sandboxd_pool_size", "pool_size: warm sandboxes kept per policy on its own runtime (runtime_pool_size.NAME keeps more on others; GET /v1/capacity has each template's size).", nil, nil)
	poolReadyDesc      = prometheus.NewDesc("sandboxd_pool_ready", "Warm sandboxes ready for an execution.", nil, nil)
	poolStartingDesc   = prometheus.NewDesc("sandboxd_pool_starting", "Warm sandboxes starting (importing the preload).", nil, nil)
	poolTakenDesc      = prometheus.NewDesc("sandboxd_pool_taken_total", "Executions served by a warm sandbox.", nil, nil)
	poolFailDesc       = prometheus.NewDesc("sandboxd_pool_refill_failures_total", "Warm sandboxes that failed to start.", nil, nil)
	poolRetiredDesc    = prometheus.NewDesc("sandboxd_pool_retired_total", "Warm sandboxes retired unused after pool_max_idle.", nil, nil)
	poolMemDesc        = prometheus.NewDesc("sandboxd_pool_idle_memory_bytes", "Memory the ready warm sandboxes hold, as their cgroups account it.", nil, nil)
	poolTplDesc        = prometheus.NewDesc("sandboxd_pool_templates", "Template processes running (pool_template_forks), retired ones included until their last fork ends.", nil, nil)
	poolTplStartDesc   = prometheus.NewDesc("sandboxd_pool_templates_started_total", "Template processes started (pool_template_forks), rotations included.", nil, nil)
	poolTplForkDesc    = prometheus.NewDesc("sandboxd_pool_template_forks_total", "Forks the template processes made (pool_template_forks).", nil, nil)
	poolKernelForkDesc = prometheus.NewDesc("sandboxd_pool_kernel_forks_total",
		"Session kernels forked from their template on demand (pool_template_forks, no warm sandbox ready): neither taken from the pool nor started cold.", nil, nil)
	poolExecForkDesc = prometheus.NewDesc("sandboxd_pool_execution_forks_total",
		"Executions forked from their template on demand (pool_template_forks, no warm sandbox ready): neither taken from the pool nor run cold.", nil, nil)
	poolFallbackDesc = prometheus.NewDesc("sandboxd_pool_fallback_total",
		"Executions and session kernels that matched a warm template but ran cold, by reason: dead (the warm sandbox had died), env (the request sets a variable a warm sandbox cannot apply), fork (an on-demand fork could not be made: its template broken, refused or not startable), write (the request could not be written into the claimed warm sandbox's workspace: the sandbox filled it or put names in the way, a sign of a compromised template).",
		[]string{"reason"}, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolSizeDesc, poolReadyDesc, poolStartingDesc, poolTakenDesc, poolFailDesc, poolRetiredDesc, poolMemDesc,
		poolTplDesc, poolTplStartDesc, poolTplForkDesc, poolExecForkDesc, poolKernelForkDesc, poolFallbackDesc} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(poolSizeDesc, prometheus.GaugeValue, float64(c.size))
	ch <- prometheus.MustNewConstMetric(poolReadyDesc, prometheus.GaugeValue, float64(st.Ready))
	ch <- prometheus.MustNewConstMetric(poolStartingDesc, prometheus.GaugeValue, float64(st.Starting))
	ch <- prometheus.MustNewConstMetric(poolTakenDesc, prometheus.CounterValue, float64(st.Taken))
	ch <- prometheus.MustNewConstMetric(poolFailDesc, prometheus.CounterValue, float64(st.RefillFailures))
	ch <- prometheus.MustNewConstMetric(poolRetiredDesc, prometheus.CounterValue, float64(st.Retired))
	ch <- prometheus.MustNewConstMetric(poolMemDesc, prometheus.GaugeValue, float64(st.IdleMemoryBytes))
	ch <- prometheus.MustNewConstMetric(poolTplDesc, prometheus.GaugeValue, float64(st.Templates))
	ch <- prometheus.MustNewConstMetric(poolTplStartDesc, prometheus.CounterValue, float64(st.TemplatesStarted))
	ch <- prometheus.MustNewConstMetric(poolTplForkDesc, prometheus.CounterValue, float64(st.TemplateForks))
	ch <- prometheus.MustNewConstMetric(poolFallbackDesc, prometheus.CounterValue, float64(st.FallbackDead), "dead")
	ch <- prometheus.MustNewConstMetric(poolExecForkDesc, prometheus.CounterValue, float64(st.ExecForks))
	ch <- prometheus.MustNewConstMetric(poolKernelForkDesc, prometheus.CounterValue, float64(st.KernelForks))
	ch <- prometheus.MustNewConstMetric(poolFallbackDesc, prometheus.CounterValue, float64(st.FallbackEnv), "env")
	ch <- prometheus.MustNewConstMetric(poolFallbackDesc, prometheus.CounterValue, float64(st.FallbackFork), "fork")
	ch <- prometheus.MustNewConstMetric(poolFallbackDesc, prometheus.CounterValue, float64(st.FallbackWrite), "write")
}

// sessionCollector exports the session manager's state, one Stats() per
// scrape.
type sessionCollector struct {
	stats func() session.Stats
}

var (
	sessionsDesc       = prometheus.NewDesc("sandboxd_sessions", "Sessions kept (their files on disk).", nil, nil)
	sessionsBusyDesc   = prometheus.NewDesc("sandboxd_sessions_busy", "Sessions running an execution.", nil, nil)
	sessionIdleDesc    = prometheus.NewDesc("sandboxd_session_idle_kernels", "Session kernels alive and waiting.", nil, nil)
	sessionIdleMemDesc = prometheus.NewDesc("sandboxd_session_idle_kernel_memory_bytes",
		"Memory the idle session kernels hold, as their cgroups account it (bounded by session_idle_memory_bytes).", nil, nil)
	sessionSpareDesc = prometheus.NewDesc("sandboxd_session_spare_kernels",
		"Default-type kernels kept ready in spare volumes for new sessions (session_spare_kernels), by state: ready, or missing (wanted but not ready: no warm sandbox yet, no spare volume, or being replaced).", []string{"state"}, nil)
	sessionDiskDesc   = prometheus.NewDesc("sandboxd_session_bytes_on_disk", "Bytes the sessions' workspace volumes hold.", nil, nil)
	sessionStartsDesc = prometheus.NewDesc("sandboxd_session_kernel_starts_total",
		"Session kernels started, by state/reason of the execution that started them (new/first_execution, new/idle_timeout, new/memory_budget, restarted/worker_restart, new/timeout, new/oom, new/pids, new/exited, new/protocol, new/kernel_disabled, ...).",
		[]string{"reason"}, nil)
)

func (c *sessionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sessionsDesc, sessionsBusyDesc, sessionIdleDesc, sessionIdleMemDesc, sessionSpareDesc, sessionDiskDesc, sessionStartsDesc} {
		ch <- d
	}
}

func (c *sessionCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(st.Sessions))
	ch <- prometheus.MustNewConstMetric(sessionsBusyDesc, prometheus.GaugeValue, float64(st.Busy))
	ch <- prometheus.MustNewConstMetric(sessionIdleDesc, prometheus.GaugeValue, float64(st.IdleKernels))
	ch <- prometheus.MustNewConstMetric(sessionIdleMemDesc, prometheus.GaugeValue, float64(st.IdleKernelBytes))
	ch <- prometheus.MustNewConstMetric(sessionSpareDesc, prometheus.GaugeValue, float64(st.SpareKernels), "ready")
	ch <- prometheus.MustNewConstMetric(sessionSpareDesc, prometheus.GaugeValue, float64(max(st.SpareKernelsWanted-st.SpareKernels, 0)), "missing")
	ch <- prometheus.MustNewConstMetric(sessionDiskDesc, prometheus.GaugeValue, float64(st.BytesOnDisk))
	for reason, n := range st.KernelStarts {
		ch <- prometheus.MustNewConstMetric(sessionStartsDesc, prometheus.CounterValue, float64(n), reason)
	}
}
