package run

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/obs"
	"github.com/telorunner/telorunner/pkg/version"
)

// Env is what a standalone service main hands its Run function.
type Env struct {
	NC       *nats.Conn
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Limits are the bus limits from the environment (bus.LoadLimits):
	// replicas, replay window, owner and presence TTLs. Every service
	// passes them on, so all provision and use the same bus.
	Limits bus.Limits
}

// Main is the body of every standalone service's main: `<name> version`
// prints the build's version and exits 0; configErr (from
// loading its configuration) exits 2 naming the variable; then a signal
// context, the logger (LOG_LEVEL, LOG_FORMAT), a NATS connection to
// RUNNER_NATS_URL (authenticated with the nkey seed in the file
// RUNNER_NATS_NKEY_FILE as the service's bus role; empty = anonymous), the
// ops listener (RUNNER_OPS_ADDR; /debug/pprof when RUNNER_PPROF=true) and
// serve. A failure exits 1. It does not
// return.
func Main(name string, configErr error, serve func(ctx context.Context, env Env) error) {
	if version.Requested(os.Args[1:]) {
		version.Print(os.Stdout, name)
		os.Exit(0)
	}
	if configErr != nil {
		fmt.Fprintln(os.Stderr, configErr)
		os.Exit(2)
	}
	limits, err := bus.LoadLimits(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	withPprof, err := obs.PprofEnabled(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	url := os.Getenv("RUNNER_NATS_URL")
	if url == "" {
		fmt.Fprintln(os.Stderr, "RUNNER_NATS_URL: required (the telorunner all-in-one embeds a server)")
		os.Exit(2)
	}
	os.Exit(func() int {
		ctx, stop := SignalContext()
		defer stop()
		log := obs.NewLogger(os.Stderr, os.Getenv("LOG_LEVEL"), os.Getenv("LOG_FORMAT"))
		auth, err := bus.SeedFileOptions(bus.ServiceRole(name), os.Getenv("RUNNER_NATS_NKEY_FILE"), log)
		if err != nil {
			log.Error("nats credential", "service", name, "err", err)
			return 2
		}
		nc, err := nats.Connect(url, append(auth, nats.Name(name), nats.MaxReconnects(-1))...)
		if err != nil {
			log.Error("connect nats", "service", name, "err", err)
			return 1
		}
		defer nc.Close()
		reg := obs.NewRegistry()
		g := NewGroup(ctx)
		g.Go("ops", func(ctx context.Context) error {
			return obs.Serve(ctx, os.Getenv("RUNNER_OPS_ADDR"), reg, nil, withPprof)
		})
		g.Go(name, func(ctx context.Context) error {
			defer g.Cancel()
			return serve(ctx, Env{NC: nc, Logger: log, Registry: reg, Limits: limits})
		})
		if err := g.Wait(); err != nil {
			log.Error("service stopped", "service", name, "err", err)
			return 1
		}
		return 0
	}())
}

// ServiceLogger is a service's logger: l (slog.Default when nil) with the
// attribute service=name and args.
func ServiceLogger(l *slog.Logger, name string, args ...any) *slog.Logger {
	if l == nil {
		l = slog.Default()
	}
	return l.With(append([]any{"service", name}, args...)...)
}

// Service is Main for a service whose configuration load reads the
// environment: a load error exits 2 naming the variable, as Main's
// configErr; serve gets the configuration.
func Service[C any](name string, load func(func(string) (string, bool)) (C, error), serve func(ctx context.Context, cfg C, env Env) error) {
	cfg, err := load(os.LookupEnv)
	Main(name, err, func(ctx context.Context, env Env) error { return serve(ctx, cfg, env) })
}
