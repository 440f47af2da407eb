// Package driver is the pod-driver service's entry point: it owns
// sessions and runs their workloads on a backend. Run serves until its
// context ends.
package driver

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/envconf"
	"github.com/telorunner/telorunner/pkg/run"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/imagebuild"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/local"
	idriver "github.com/telorunner/telorunner/services/pod-driver/internal/driver"
)

// Config is the pod-driver configuration.
type Config struct {
	// Backend is RUNNER_BACKEND: "local" (default) or "kubernetes".
	Backend string
	// KernelCommand is RUNNER_KERNEL_COMMAND split on spaces: the Telo CLI
	// (`telo`) in production, devkernel where the CLI is absent. Default:
	// a devkernel binary next to this executable, else `telo`.
	KernelCommand []string
	// WorkspaceServerCommand is RUNNER_WORKSPACE_SERVER_COMMAND: the
	// workspace-server of local watch sessions. Default: a workspace-server
	// binary next to this executable.
	WorkspaceServerCommand []string
	// WorkDir is RUNNER_WORK_DIR: local session directories.
	WorkDir string
	// ReplayBufferBytes is RUNNER_REPLAY_BUFFER_BYTES.
	ReplayBufferBytes int64
	// ID is RUNNER_DRIVER_ID. Empty: a stable identity kept in
	// RUNNER_WORK_DIR/.drivers (the one of this driver's previous run on
	// the work directory, else a new one).
	ID string
	// OwnerTTL is RUNNER_OWNER_TTL_MS (default 15 s): how long an owner
	// key outlives a dead driver. It is the owners bucket's TTL, so every
	// service that provisions the bus must use the same value.
	OwnerTTL time.Duration
	// RelayRetry is RUNNER_RELAY_RETRY_MS: the longest pause between
	// debug-relay connection attempts (0: the contract's 500 ms).
	RelayRetry time.Duration
	// Kube is the kubernetes backend's configuration (RUNNER_BACKEND=kubernetes).
	Kube KubeConfig
	// OperatorEnv is the env of each RUNNER_APPS entry by name: the driver
	// needs the same RUNNER_APPS as the edge, because session records never
	// carry catalog env.
	OperatorEnv map[string]map[string]string
	// Local is the local backend's sandbox and ceilings.
	Local LocalConfig
}

// LoadConfig reads the configuration from the environment.
func LoadConfig(lookup func(string) (string, bool)) (Config, error) {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	c := Config{Backend: "local", ReplayBufferBytes: 5_000_000, OwnerTTL: 15 * time.Second}
	if v := get("RUNNER_BACKEND"); v != "" {
		c.Backend = v
	}
	e := envconf.New(lookup)
	e.Fields("RUNNER_KERNEL_COMMAND", &c.KernelCommand)
	e.Fields("RUNNER_WORKSPACE_SERVER_COMMAND", &c.WorkspaceServerCommand)
	c.WorkDir = get("RUNNER_WORK_DIR")
	dataDir := get("RUNNER_DATA_DIR")
	if dataDir == "" {
		dataDir = ".telorunner"
	}
	if c.WorkDir == "" {
		c.WorkDir = filepath.Join(dataDir, "sessions")
	}
	// The bus limits every service reads the same way (bus.LoadLimits).
	lim, err := bus.LoadLimits(lookup)
	if err != nil {
		return c, err
	}
	c.ReplayBufferBytes, c.OwnerTTL = lim.ReplayBytes, lim.OwnerTTL
	c.ID = get("RUNNER_DRIVER_ID")
	if v := get("RUNNER_APPS"); v != "" {
		var err error
		if c.OperatorEnv, err = parseOperatorEnv(v); err != nil {
			return c, err
		}
	}
	e.Duration("RUNNER_RELAY_RETRY_MS", time.Millisecond, 10, 60000, &c.RelayRetry)
	if err := e.Err(); err != nil {
		return c, err
	}
	if c.Backend == "kubernetes" {
		if c.Kube, err = loadKubeConfig(get); err != nil {
			return c, err
		}
	} else {
		withData := func(k string) string {
			if k == "RUNNER_DATA_DIR" {
				return dataDir
			}
			return get(k)
		}
		if c.Local, err = loadLocalConfig(withData); err != nil {
			return c, err
		}
	}
	return c, c.Validate()
}

// Validate checks the configuration, naming the variable at fault.
func (c *Config) Validate() error {
	switch c.Backend {
	case "local", "kubernetes":
	default:
		return fmt.Errorf("RUNNER_BACKEND: must be local or kubernetes, got %q", c.Backend)
	}
	if len(c.KernelCommand) == 0 {
		c.KernelCommand = []string{besideExecutable("devkernel", "telo")}
	}
	if len(c.WorkspaceServerCommand) == 0 {
		c.WorkspaceServerCommand = []string{besideExecutable("workspace-server", "workspace-server")}
	}
	if c.ReplayBufferBytes <= 0 {
		return fmt.Errorf("RUNNER_REPLAY_BUFFER_BYTES: must be a positive integer")
	}
	return nil
}

// besideExecutable is the named binary next to this executable when it
// exists, else fallback (looked up on PATH).
func besideExecutable(name, fallback string) string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	return fallback
}

// Deps are the driver's connections.
type Deps struct {
	NC       *nats.Conn
	Logger   *slog.Logger
	Registry prometheus.Registerer
	Limits   bus.Limits
}

// Run owns sessions until ctx ends; on a clean exit it stops every
// workload it owns.
func Run(ctx context.Context, cfg Config, d Deps) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := run.ServiceLogger(d.Logger, "pod-driver")
	js, err := jetstream.New(d.NC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	lim := d.Limits
	lim.ReplayBytes = cfg.ReplayBufferBytes
	if lim.OwnerTTL == 0 {
		lim.OwnerTTL = cfg.OwnerTTL
	}
	var store *session.Store
	var cps *checkpoint.Store
	if err := bus.WaitProvisioned(ctx, js, log, time.Minute, func(ctx context.Context) (err error) {
		store, err = session.Open(ctx, js, cfg.ReplayBufferBytes)
		return err
	}, func(ctx context.Context) (err error) {
		cps, err = checkpoint.NewStore(ctx, js, checkpoint.Options{})
		return err
	}); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return fmt.Errorf("RUNNER_WORK_DIR: %w", err)
	}
	workDir, err := filepath.Abs(cfg.WorkDir)
	if err != nil {
		return fmt.Errorf("RUNNER_WORK_DIR: %w", err)
	}
	ident, err := claimIdentity(workDir, cfg.ID)
	if err != nil {
		return err
	}
	defer ident.release()
	log = log.With("driver", ident.ID)
	if len(ident.Dead) > 0 {
		log.Info("found dead drivers on this work directory", "drivers", ident.Dead)
	}
	var be interface {
		backend.Backend
		Close(context.Context) error
	}
	switch cfg.Backend {
	case "kubernetes":
		var locks *imagebuild.Locks
		if cfg.Kube.ImageRepository != "" {
			// One build per image ref across drivers (runner_builds).
			if locks, err = imagebuild.OpenLocks(ctx, js, ident.ID, log); err != nil {
				return fmt.Errorf("kubernetes backend: %w", err)
			}
		}
		kb, err := newKubeBackend(cfg.Kube, cfg.RelayRetry, locks, log)
		if err != nil {
			return fmt.Errorf("kubernetes backend: %w", err)
		}
		// Reap pods no live session owns (11.15); failures are warnings.
		if reaped, err := kb.ReapOrphans(ctx, func(id string) bool {
			rec, _, err := store.Get(ctx, id)
			return err == nil && !rec.Status.Terminal() && rec.Status.Kind != contract.StatusSuspended
		}); err != nil {
			log.Warn("reap orphan pods", "err", err)
		} else if len(reaped) > 0 {
			log.Info("reaped orphan pods", "sessions", reaped)
		}
		be = kb
	default:
		lo := local.Options{KernelCommand: cfg.KernelCommand, WorkspaceServerCommand: cfg.WorkspaceServerCommand, WorkRoot: workDir, RelayRetry: cfg.RelayRetry, Logger: log, Owner: ident.ID}
		cfg.Local.apply(&lo)
		lb, err := local.New(lo)
		if err != nil {
			return fmt.Errorf("local backend: %w", err)
		}
		reapLocalOrphans(ctx, lb, store, ident, log)
		be = lb
	}
	drv := idriver.New(idriver.Options{ID: ident.ID, NC: d.NC, Store: store, Backend: be, Logger: log, OwnerTTL: lim.Defaults().OwnerTTL,
		Registry: d.Registry, Checkpoints: cps, Predecessors: append([]string{ident.ID}, ident.Dead...), OperatorEnv: cfg.OperatorEnv})
	err = drv.Run(ctx)
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cerr := be.Close(closeCtx); cerr != nil && err == nil {
		err = cerr
	}
	return err
}
