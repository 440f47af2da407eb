package server

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	sessionsCreated *prometheus.CounterVec
	sseClients      prometheus.Gauge
	ioClients       prometheus.Gauge
	ioBytesOut      prometheus.Counter
	// streamRepairs counts the holes a slow SSE or io client's stream
	// filled from the log (entries the hub dropped for it), by stream.
	streamRepairs *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		sessionsCreated: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runner_edge_sessions_created_total", Help: "Sessions created, by mode."}, []string{"mode"}),
		sseClients:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "runner_edge_sse_clients", Help: "Open SSE event streams."}),
		ioClients:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "runner_edge_io_clients", Help: "Open io WebSockets."}),
		ioBytesOut:      prometheus.NewCounter(prometheus.CounterOpts{Name: "runner_edge_io_bytes_out_total", Help: "Payload bytes sent on io WebSockets."}),
		streamRepairs:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runner_edge_stream_repairs_total", Help: "Holes a slow client's SSE or io stream filled from the log, by stream."}, []string{"stream"}),
	}
	if reg != nil {
		reg.MustRegister(m.sessionsCreated, m.sseClients, m.ioClients, m.ioBytesOut, m.streamRepairs)
	}
	return m
}
