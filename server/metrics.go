package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	}
	m.reg.MustRegister(m.executions, m.duration, m.inFlight, m.queued, m.rejected,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}
