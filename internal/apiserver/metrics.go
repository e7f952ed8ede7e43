package apiserver

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.HistogramVec
	created  prometheus.Counter
	execs    prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warren_api_request_duration_seconds",
			Help:    "API request latency by route pattern and status.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"route", "status"}),
		created: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warren_sandboxes_created_total",
			Help: "Sandboxes created through this apiserver.",
		}),
		execs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warren_execs_total",
			Help: "Exec calls received by this apiserver.",
		}),
	}
	reg.MustRegister(m.requests, m.created, m.execs)
	return m
}

// observe records one request by its route pattern (not its path, which
// would make a series per sandbox id).
func (m *metrics) observe(r *http.Request, status int, d time.Duration) {
	route := routeKey(r)
	if _, known := routeRules[route]; !known && r.Pattern == sandboxVerbPattern {
		route = r.Pattern // not a series per made-up verb
	}
	if route == "" {
		route = "unmatched"
	}
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Observe(d.Seconds())
}
