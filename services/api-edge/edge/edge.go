// Package edge is the api-edge service's entry point: the stateless /v1
// HTTP surface over JetStream. Run serves until its context ends.
package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/obs"
	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/api-edge/internal/baseimage"
	"github.com/telorunner/telorunner/services/api-edge/internal/config"
	"github.com/telorunner/telorunner/services/api-edge/internal/server"
)

// Config is the edge configuration (contract section 18).
type Config = config.Config

// App is one operator catalog entry of RUNNER_APPS (contract 12.1).
type App = config.App

// Version is the runner version reported by /v1/health.
const Version = config.Version

// LoadConfig reads the configuration from the environment.
func LoadConfig(lookup func(string) (string, bool)) (Config, error) { return config.Load(lookup) }

// LoadConfigOver is LoadConfig with base as the values of unset variables
// (RUNNER_CORS_ORIGINS adds to a base allowlist; see config.LoadOver).
func LoadConfigOver(base Config, lookup func(string) (string, bool)) (Config, error) {
	return config.LoadOver(base, lookup)
}

// LoopbackCORS is the allowlist of loopback origins on any port
// (http://localhost:*, http://127.0.0.1:*, http://[::1]:*).
func LoopbackCORS() config.CORS { return config.LoopbackCORS() }

// DefaultConfig is the configuration with no variable set.
func DefaultConfig() Config { return config.Default() }

// Deps are the edge's connections.
type Deps struct {
	NC       *nats.Conn
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Listener, when set, is served instead of listening on cfg.Port.
	Listener net.Listener
	// Limits are the bus limits used to provision (Replicas etc.).
	Limits bus.Limits
	// EdgeID names the replica; random when empty.
	EdgeID string
	// Ready is called once the listener accepts connections.
	Ready func(addr net.Addr)
	// Now is the clock of the reload budget's 60 s window (contract 13.5);
	// time.Now when nil. Tests set it to move the window without waiting.
	Now func() time.Time
}

// bootMenu builds the base-image menu (contract 11.12) and fills it once
// before the edge listens; a failed first fetch is a warning and leaves
// the default image alone. Nil when the catalog is disabled.
func bootMenu(ctx context.Context, cfg Config, log *slog.Logger) (*baseimage.Menu, error) {
	b := cfg.BaseImages
	if !b.Enabled {
		return nil, nil
	}
	menu, err := baseimage.New(baseimage.Options{
		Default: cfg.Image, Repo: b.Repo, APIURL: b.APIURL, Refresh: b.Refresh, Logger: log,
		Filter: baseimage.Filter{PinnedOnly: b.PinnedOnly, ExcludeSHA: b.ExcludeSHA, ExcludePrerelease: b.ExcludePrerelease,
			Include: b.Include, Exclude: b.Exclude, Limit: b.Limit},
	})
	if err != nil {
		return nil, err
	}
	if err := menu.Refresh(ctx); err != nil {
		log.Warn("base-image menu unavailable at boot; offering the default image only", "err", err)
	} else {
		log.Info("base-image menu loaded", "images", len(menu.Images()))
	}
	return menu, nil
}

// Run serves /v1 until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, cfg Config, d Deps) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := run.ServiceLogger(d.Logger, "api-edge")
	reg := d.Registry
	if reg == nil {
		reg = obs.NewRegistry()
	}
	js, err := jetstream.New(d.NC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	lim := d.Limits
	lim.ReplayBytes = cfg.ReplayBufferBytes
	var store *session.Store
	if err := bus.WaitProvisioned(ctx, js, log, time.Minute, func(ctx context.Context) (err error) {
		store, err = session.Open(ctx, js, cfg.ReplayBufferBytes)
		return err
	}); err != nil {
		return err
	}
	edgeID := d.EdgeID
	if edgeID == "" {
		edgeID = "edge-" + nuid.Next()
	}
	srvCtx, cancelStreams := context.WithCancel(context.Background())
	defer cancelStreams()
	menu, err := bootMenu(ctx, cfg, log)
	if err != nil {
		return err
	}
	ln := d.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", net.JoinHostPort(cfg.ListenHost, strconv.Itoa(cfg.Port))); err != nil {
			return fmt.Errorf("listen on %s port %d: %w", cfg.ListenHost, cfg.Port, err)
		}
	}
	// Connections of hijacked SSE streams that ended cleanly come back to
	// the server through rl (keep-alive).
	rl := server.NewReuseListener(ln)
	api := server.New(srvCtx, server.Options{Config: cfg, NC: d.NC, Store: store, Logger: log, Registry: reg, EdgeID: edgeID, Now: d.Now, Menu: menu, Reuse: rl.Reuse})
	menuDone := make(chan struct{})
	go func() {
		defer close(menuDone)
		if menu != nil {
			menu.Run(srvCtx)
		}
	}()
	defer func() { cancelStreams(); <-menuDone }()

	mux := http.NewServeMux()
	obs.Mount(mux, reg, func() error {
		if d.NC.Status() != nats.CONNECTED {
			return errors.New("nats not connected")
		}
		return nil
	})
	if cfg.Pprof {
		obs.MountPprof(mux)
	}
	mux.Handle("/", api)

	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	presenceDone := make(chan struct{})
	go func() {
		defer close(presenceDone)
		api.PublishPresence(srvCtx, store, bus.Limits.Defaults(lim).PresenceTTL/3)
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- httpSrv.Serve(rl) }()
	log.Info("api-edge listening", "addr", ln.Addr().String(), "edge", edgeID)
	if d.Ready != nil {
		d.Ready(ln.Addr())
	}
	select {
	case err := <-serveErr:
		cancelStreams()
		<-presenceDone
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cancelStreams() // long-lived SSE and io streams end now
	err = httpSrv.Shutdown(shutdownCtx)
	api.Wait()
	<-presenceDone
	<-serveErr
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
