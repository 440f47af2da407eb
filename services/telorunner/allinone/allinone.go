// Package allinone runs the whole of telorunner in one process: an
// embedded NATS server with JetStream (unless RUNNER_NATS_URL points at an
// external one) and the same Run functions of api-edge, pod-driver,
// supervisor and workspace-proxy that run as separate services.
package allinone

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/embednats"
	"github.com/telorunner/telorunner/pkg/envconf"
	"github.com/telorunner/telorunner/pkg/obs"
	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/services/api-edge/edge"
	"github.com/telorunner/telorunner/services/pod-driver/driver"
	"github.com/telorunner/telorunner/services/supervisor/supervisor"
	"github.com/telorunner/telorunner/services/workspace-proxy/proxy"
)

// Config is the all-in-one configuration.
type Config struct {
	NATSURL  string // RUNNER_NATS_URL: external NATS; empty = embedded
	DataDir  string // RUNNER_DATA_DIR: embedded store and session dirs (./.telorunner)
	NATSPort int    // RUNNER_NATS_PORT: embedded server port (-1 = random)
	Sync     Sync   // RUNNER_NATS_SYNC: embedded server's fsync policy
	// Limits are the bus limits (bus.LoadLimits: RUNNER_NATS_REPLICAS,
	// RUNNER_REPLAY_BUFFER_BYTES, RUNNER_OWNER_TTL_MS),
	// the same every standalone service reads.
	Limits     bus.Limits
	Edge       edge.Config
	Driver     driver.Config
	Supervisor supervisor.Config
	Proxy      proxy.Config
	// LocalUnrunnable names the RUNNER_APPS entries left out of the
	// catalog because the local backend cannot run their image (logged at
	// start).
	LocalUnrunnable []string
}

// LoadConfig reads every service's configuration from the environment.
func LoadConfig(lookup func(string) (string, bool)) (Config, error) {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	c := Config{NATSURL: get("RUNNER_NATS_URL"), DataDir: get("RUNNER_DATA_DIR"), NATSPort: -1}
	if c.DataDir == "" {
		c.DataDir = ".telorunner"
	}
	e := envconf.New(lookup)
	if e.Int("RUNNER_NATS_PORT", -1, 65535, &c.NATSPort); e.Err() != nil {
		return c, e.Err()
	}
	var err error
	if c.Limits, err = bus.LoadLimits(lookup); err != nil {
		return c, err
	}
	if c.Sync, err = ParseSync(get("RUNNER_NATS_SYNC")); err != nil {
		return c, err
	}
	if c.Edge, err = edge.LoadConfigOver(EdgeDefaults(), lookup); err != nil {
		return c, err
	}
	withData := func(k string) (string, bool) {
		if k == "RUNNER_DATA_DIR" {
			return c.DataDir, true
		}
		return lookup(k)
	}
	if c.Driver, err = driver.LoadConfig(withData); err != nil {
		return c, err
	}
	if c.Supervisor, err = supervisor.LoadConfig(lookup); err != nil {
		return c, err
	}
	if c.Proxy, err = proxy.LoadConfig(lookup); err != nil {
		return c, err
	}
	if c.Driver.Backend != "kubernetes" {
		// The local backend runs no images: a catalog entry it cannot run
		// is neither advertised nor accepted (an advertised app or agent
		// must start).
		c.Edge.Apps, c.LocalUnrunnable = c.Edge.Apps.Keep(func(a edge.App) bool { return driver.LocalCanRun(a.Image) })
		// Nor does it run base images: the menu (contract 11.12, a
		// Kubernetes runner feature) would offer choices that change
		// nothing, so config.image stays the default alone.
		c.Edge.BaseImages.Enabled = false
	}
	return c, nil
}

// EdgeDefaults is the all-in-one's /v1 configuration before the
// environment: safe on a laptop (issue 18). It listens on loopback only
// (RUNNER_LISTEN_HOST opens it) and allows only loopback origins, to which
// RUNNER_CORS_ORIGINS adds ("*" must be asked for).
func EdgeDefaults() edge.Config {
	c := edge.DefaultConfig()
	c.ListenHost = "127.0.0.1"
	c.CORS = edge.LoopbackCORS()
	return c
}

// Deps are the all-in-one's injectables (tests).
type Deps struct {
	Logger   *slog.Logger
	Listener net.Listener
	// Ready is called with the /v1 address and the NATS URL once serving.
	Ready func(httpAddr net.Addr, natsURL string)
}

// Run starts everything and serves until ctx ends, then stops the services
// (the driver stops its workloads) before the embedded NATS server.
func Run(ctx context.Context, cfg Config, d Deps) error {
	log := d.Logger
	if log == nil {
		log = slog.Default()
	}
	credDir := CredentialsDir(cfg.DataDir)
	for _, name := range cfg.LocalUnrunnable {
		log.Warn("RUNNER_APPS entry not offered: the local backend runs only an image that is an absolute path to an executable", "app", name)
	}
	url := cfg.NATSURL
	if url == "" {
		ns, err := startNATS(filepath.Join(cfg.DataDir, "nats"), credDir, cfg.NATSPort, cfg.Sync)
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		url = ns.ClientURL()
		log.Info("embedded nats with jetstream", "url", url, "store", filepath.Join(cfg.DataDir, "nats"), "sync", cfg.Sync.String(), "credentials", credDir)
	}
	// One set of bus limits for every service (the owner TTL is the owners
	// bucket's TTL; bus.LoadLimits and the driver read the same variable).
	lim := ProvisionLimits(cfg)
	if err := provision(ctx, url, credDir, lim, log); err != nil {
		return err
	}
	conns := map[string]*nats.Conn{}
	for _, name := range []string{"api-edge", "pod-driver", "supervisor", "workspace-proxy"} {
		nc, err := connect(url, credDir, bus.ServiceRole(name), log, nats.Name(name), nats.MaxReconnects(-1))
		if err != nil {
			return fmt.Errorf("connect nats for %s: %w", name, err)
		}
		defer nc.Close()
		conns[name] = nc
	}
	reg := obs.NewRegistry()
	// The driver stops first, while the other services still answer: its
	// watch sessions take a final checkpoint through workspace-proxy and
	// record their status before the rest goes.
	rest, cancelRest := context.WithCancel(context.Background())
	defer cancelRest()
	driverCtx, cancelDriver := context.WithCancel(ctx)
	defer cancelDriver()
	g := run.NewGroup(rest)
	g.Go("pod-driver", func(context.Context) error {
		err := driver.Run(driverCtx, cfg.Driver, driver.Deps{NC: conns["pod-driver"], Logger: log, Registry: reg, Limits: lim})
		cancelRest()
		return err
	})
	g.Go("supervisor", func(ctx context.Context) error {
		return supervisor.Run(ctx, cfg.Supervisor, supervisor.Deps{NC: conns["supervisor"], Logger: log, Limits: lim, Registry: reg})
	})
	g.Go("workspace-proxy", func(ctx context.Context) error {
		return proxy.Run(ctx, cfg.Proxy, proxy.Deps{NC: conns["workspace-proxy"], Logger: log, Limits: lim})
	})
	g.Go("api-edge", func(ctx context.Context) error {
		return edge.Run(ctx, cfg.Edge, edge.Deps{NC: conns["api-edge"], Logger: log, Registry: reg, Listener: d.Listener, Limits: lim,
			Ready: func(a net.Addr) {
				logListening(log, a, cfg.Edge)
				if d.Ready != nil {
					d.Ready(a, url)
				}
			}})
	})
	select {
	case <-ctx.Done():
	case <-g.Context().Done():
		cancelDriver() // a service failed: stop everything
		cancelRest()
	}
	return g.WaitTimeout(60 * time.Second)
}

// logListening says where /v1 answers and how to change it.
func logListening(log *slog.Logger, a net.Addr, c edge.Config) {
	origins := "*"
	if !c.CORS.AnyOrigin {
		origins = strings.Join(c.CORS.Origins, ",")
	}
	url := "http://" + a.String()
	if ta, ok := a.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		log.Info("telorunner listening on loopback only: set RUNNER_LISTEN_HOST=0.0.0.0 to accept other machines (there is no authentication: anyone who reaches it runs code here)",
			"url", url, "allowed_origins", origins)
		return
	}
	log.Warn("telorunner listening beyond loopback: anyone who reaches this address can run code on this machine",
		"url", url, "allowed_origins", origins)
}

// CredentialsDir is where the all-in-one keeps each role's nkey seed
// (<role>.nk): generated at the first start of the embedded server, reused
// after.
func CredentialsDir(dataDir string) string { return filepath.Join(dataDir, "credentials") }

// ProvisionLimits are the bus limits the all-in-one provisions with (one
// owner TTL for every service: it is the owners bucket's TTL).
func ProvisionLimits(cfg Config) bus.Limits {
	lim := cfg.Limits
	lim.ReplayBytes = cfg.Edge.ReplayBufferBytes
	return lim
}

// provision creates or updates every stream, bucket and object store as the
// provisioner role; the services then run without those rights.
func provision(ctx context.Context, url, credDir string, lim bus.Limits, log *slog.Logger) error {
	nc, err := connect(url, credDir, bus.RoleProvisioner, log, nats.Name("provisioner"))
	if err != nil {
		return fmt.Errorf("connect nats as %s: %w", bus.RoleProvisioner, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return bus.Provision(pctx, js, lim)
}

// connect connects as role with its seed from credDir; with no seed file
// there (an external server without authentication) it connects
// anonymously.
func connect(url, credDir, role string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	kp, err := bus.LoadSeed(bus.SeedFile(credDir, role))
	var opts []nats.Option
	switch {
	case err == nil:
		if opts, err = bus.ClientOptions(role, kp, log); err != nil {
			return nil, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	return nats.Connect(url, append(opts, extra...)...)
}

func startNATS(dir, credDir string, port int, sync Sync) (*server.Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("RUNNER_DATA_DIR: %w", err)
	}
	pubs, err := bus.EnsureCredentials(credDir)
	if err != nil {
		return nil, fmt.Errorf("RUNNER_DATA_DIR: %w", err)
	}
	users, err := embednats.Users(pubs)
	if err != nil {
		return nil, err
	}
	s, err := embednats.Start(embednats.Options{Name: "telorunner", Dir: dir, Port: port, Users: users,
		SyncInterval: sync.Interval, SyncAlways: sync.Always}, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	return s, nil
}
