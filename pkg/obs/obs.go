// Package obs is telorunner's observability: slog loggers, the Prometheus
// registry and the /metrics, /healthz and /readyz handlers every service
// exposes.
package obs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/telorunner/telorunner/pkg/envconf"
)

// NewLogger returns a slog logger at level ("debug", "info", "warn",
// "error") writing JSON, or text when format is "text".
func NewLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(strings.ToUpper(level)))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// NewRegistry returns a registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Ready reports nil when the service can take work.
type Ready func() error

// Mount adds /metrics, /healthz and /readyz to mux.
func Mount(mux *http.ServeMux, reg prometheus.Gatherer, ready Ready) {
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = io.WriteString(w, "ready\n")
	})
}

// PprofVar turns on /debug/pprof on a service's ops listener.
const PprofVar = "RUNNER_PPROF"

// PprofEnabled reads RUNNER_PPROF: true, 1 or yes turn the profiler on;
// unset, empty, false, 0 or no leave it off; anything else is an error
// naming the variable.
func PprofEnabled(lookup func(string) (string, bool)) (bool, error) {
	var on bool
	e := envconf.New(lookup)
	e.Bool(PprofVar, &on)
	return on, e.Err()
}

// MountPprof adds the runtime profiler (net/http/pprof) under
// /debug/pprof/ to mux: the index, every named profile (heap, allocs,
// goroutine, …; ?gc=1 on heap collects first), cmdline, profile (CPU),
// symbol and trace. Only when RUNNER_PPROF asks for it: a profile shows
// the process's memory and a CPU profile costs while it runs.
func MountPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// Serve runs an ops listener on addr until ctx ends ("" disables it), with
// /debug/pprof when withPprof.
func Serve(ctx context.Context, addr string, reg prometheus.Gatherer, ready Ready, withPprof bool) error {
	if addr == "" {
		<-ctx.Done()
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return serve(ctx, ln, reg, ready, withPprof)
}

func serve(ctx context.Context, ln net.Listener, reg prometheus.Gatherer, ready Ready, withPprof bool) error {
	mux := http.NewServeMux()
	Mount(mux, reg, ready)
	if withPprof {
		MountPprof(mux)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
