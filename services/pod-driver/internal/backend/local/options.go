package local

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
)

// Defaults applied by New to zero Options fields.
const (
	DefaultStopGrace         = 2 * time.Second
	DefaultReachInterval     = kernelwire.DefaultReachInterval // contract 11.7
	DefaultReachDeadline     = kernelwire.DefaultReachDeadline
	DefaultReachSlowInterval = kernelwire.DefaultReachSlowInterval
	DefaultRelayRetry        = kernelwire.DefaultRelayRetry // contract 10.4
	DefaultWorkspaceReady    = 120 * time.Second            // contract 9.4
)

// Options configures a Backend.
type Options struct {
	// KernelCommand is the argv prefix of the kernel, e.g.
	// ["/path/devkernel"] or ["telo"]; "run", flags and the entry path are
	// appended. The first word is resolved through PATH once, by New.
	KernelCommand []string
	// WorkspaceServerCommand is the argv of workspace-server, the file
	// service of watch sessions (ARCHITECTURE.md §6). Its first word is
	// resolved like KernelCommand's. Empty: watch sessions fail to start
	// (stage create).
	WorkspaceServerCommand []string
	// WorkRoot is the directory per-session directories live under. New
	// creates it.
	WorkRoot string
	// Logger receives the backend's diagnostics; nil discards them.
	Logger *slog.Logger
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL.
	StopGrace time.Duration
	// ReachInterval, ReachDeadline and ReachSlowInterval time the
	// reachability watcher of every declared tcp port (contract 11.7).
	ReachInterval, ReachDeadline, ReachSlowInterval time.Duration
	// RelayRetry is the pause between debug-relay connection attempts
	// (contract 10.4).
	RelayRetry time.Duration
	// WorkspaceReady bounds how long a watch session's start waits for its
	// workspace server to answer (contract 9.4: 120 s).
	WorkspaceReady time.Duration
	// Owner is the identity of the driver using this backend, written into
	// every process group record (GroupRecord.Driver).
	Owner string
	// Sandbox configures the per-process sandbox (sandbox.go); on unless
	// Sandbox.Off.
	Sandbox SandboxOptions
	// RunCeilings, AppCeilings and WatchCeilings limit run sessions,
	// self-contained app sessions and each process of a watch session
	// (contract 11.2). A zero value takes the defaults; a negative TTL or
	// memory means none.
	RunCeilings, AppCeilings, WatchCeilings Ceilings
}

// Validate reports the first unusable field. Zero durations are allowed
// (New replaces them with the defaults); negative ones are not.
func (o Options) Validate() error {
	if len(o.KernelCommand) == 0 || o.KernelCommand[0] == "" {
		return errors.New("local backend: KernelCommand is empty")
	}
	if len(o.WorkspaceServerCommand) > 0 && o.WorkspaceServerCommand[0] == "" {
		return errors.New("local backend: WorkspaceServerCommand has an empty program")
	}
	if o.WorkRoot == "" {
		return errors.New("local backend: WorkRoot is empty")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"StopGrace", o.StopGrace},
		{"ReachInterval", o.ReachInterval},
		{"ReachDeadline", o.ReachDeadline},
		{"ReachSlowInterval", o.ReachSlowInterval},
		{"RelayRetry", o.RelayRetry},
		{"WorkspaceReady", o.WorkspaceReady},
	} {
		if d.v < 0 {
			return fmt.Errorf("local backend: %s is negative (%v)", d.name, d.v)
		}
	}
	return nil
}

func (o *Options) applyDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	setDefault(&o.StopGrace, DefaultStopGrace)
	setDefault(&o.ReachInterval, DefaultReachInterval)
	setDefault(&o.ReachDeadline, DefaultReachDeadline)
	setDefault(&o.ReachSlowInterval, DefaultReachSlowInterval)
	setDefault(&o.RelayRetry, DefaultRelayRetry)
	setDefault(&o.WorkspaceReady, DefaultWorkspaceReady)
	for _, c := range []struct {
		c   *Ceilings
		def Ceilings
	}{{&o.RunCeilings, DefaultRunCeilings}, {&o.AppCeilings, DefaultAppCeilings}, {&o.WatchCeilings, DefaultWatchCeilings}} {
		if *c.c == (Ceilings{}) {
			*c.c = c.def
		}
	}
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}
