// Package backend is the seam between the driver and the things that run
// workloads: a Backend turns a launch Spec into a running Workload and
// reports what happens through a Sink. Implementations live in
// subpackages (local, kubernetes).
package backend

import (
	"context"
	"encoding/json"

	"github.com/telorunner/telorunner/pkg/contract"
)

// Spec is what a backend needs to start a session's workload.
type Spec struct {
	SessionID string
	Mode      string // contract.ModeRun or contract.ModeWatch
	// Bundle is the run session's application (or the watch session's
	// initial workspace).
	Bundle contract.Bundle
	// Restore, when set, is a watch session's workspace as a checkpoint
	// (resume, app-set change): it is seeded instead of Bundle.Files,
	// whose EntryRelativePath still names the default app's entry.
	Restore *Restore
	// Env is the shaped session env (registry URL injected, TELO_CACHE_DIR
	// removed). Only this env reaches app kernels.
	Env     map[string]string
	Config  contract.SessionConfig
	Inspect bool
	// SelfContained marks operator app sessions: the image runs its own
	// entrypoint, no bundle.
	SelfContained bool
	Apps          []App
	// Agent is the co-resident agent of a watch session (nil when none).
	// It gets the operator env only; apps never see it.
	Agent *Agent
	// KeepWorkspace (local backend, watch sessions) serves the workspace
	// directory a workload lost with its driver left on this machine, as
	// it is, instead of seeding Bundle (crash recovery; see the local
	// backend's WorkspaceIntact).
	KeepWorkspace bool
}

// Restore is a workspace to seed from a checkpoint: its files by content
// hash, and how to fetch a blob. A backend streams it into the workspace
// (kernelwire.Seed): one fetch per distinct hash, in change sets of
// bounded size, memory bounded by a constant rather than the workspace.
type Restore struct {
	// Files lists every file of the checkpoint.
	Files []RestoreFile
	// Fetch returns the bytes of the blob hash, checked against it. It is
	// called concurrently.
	Fetch func(ctx context.Context, hash string) ([]byte, error)
}

// RestoreFile is one file of a Restore.
type RestoreFile struct {
	Path string
	Hash string // Lowercase hex SHA-256 of the bytes.
	Size int64
	// Mode is the file's permission bits; 0 leaves the workspace server's
	// default. It is passed through to the write op as is.
	Mode uint32
}

// Agent is a resolved operator catalog entry run beside a watch session's
// apps, sharing the workspace.
type Agent struct {
	Name       string
	Image      string
	Env        map[string]string
	PullPolicy string
	Port       int
}

// App is one application of the session.
type App struct {
	Name  string
	Entry string // normalized entry path relative to the bundle root
	Ports []contract.PortMapping
	IO    string // contract.IOTTY or contract.IOStreams
}

// Sink receives everything a workload reports. Calls may come from several
// goroutines; implementations are safe for concurrent use. Output must not
// retain p after it returns.
type Sink interface {
	// Progress reports a coming-up step (app "" for session-scoped).
	Progress(phase, message string, done bool, app string)
	// Running reports the workload is up, with its endpoints and, for a
	// watch session with a co-resident agent, the agent's endpoint.
	Running(endpoints []contract.Endpoint, agent *contract.Endpoint)
	// Output delivers bytes an app wrote; tag is contract.TagTTY,
	// TagStdout or TagStderr.
	Output(app string, tag byte, p []byte)
	// Debug delivers one kernel debug-wire frame (already de-duplicated:
	// a relay reconnect never re-delivers a frame).
	Debug(app string, frame json.RawMessage)
	// RunEnded reports an app's workload ended without a kernel event.
	RunEnded(app string, code *int, reason string)
	// Reachability reports a declared tcp port's state.
	Reachability(app string, port int, state string)
	// WorkspaceReady reports the base URL of a watch session's workspace
	// server once it answers (before seeding and before Running).
	WorkspaceReady(url string)
}

// Exit is how a workload ended.
type Exit struct {
	// Code is the exit code of a run session's workload (nil when unknown).
	Code *int
	// Err is set when the workload failed rather than exited
	// (the message of a failed status).
	Err error
	// Stopped is true when Stop ended it.
	Stopped bool
}

// Workload is a running session workload.
type Workload interface {
	// Stdin writes p to the app's stdin (dropped if the app is gone).
	Stdin(app string, p []byte) error
	// Resize sets the app's terminal size (tty apps; no-op otherwise).
	Resize(app string, cols, rows int) error
	// Stop ends the workload; idempotent, safe after a natural exit.
	Stop(ctx context.Context) error
	// Done is closed when the workload has ended and every Output call
	// for it has returned.
	Done() <-chan struct{}
	// Exit reports how it ended; valid after Done is closed.
	Exit() Exit
}

// WatchWorkload is the extra surface of a watch session's workload.
type WatchWorkload interface {
	Workload
	// SetPorts makes ports app's routed port set after the app declared a
	// new one (contract 11.8 step 4): the backend re-publishes its routing
	// (the Kubernetes Service and Ingress). On an error the previous set
	// stays routed. Conflicts between apps are the caller's to reject first.
	SetPorts(ctx context.Context, app string, ports []contract.PortMapping) error
	// WatchPorts starts reachability watchers for app's tcp ports never
	// watched in this workload (11.8 step 6; 11.7: not re-armed per reload).
	WatchPorts(app string, ports []contract.PortMapping)
	// Endpoints is how this workload announces ports, in order (with
	// ingress hosts where the backend routes them).
	Endpoints(ports []contract.PortMapping) []contract.Endpoint
}

// Backend starts workloads.
type Backend interface {
	// Start launches spec. It returns once the workload is running (after
	// calling sink.Running) or fails with a *StartError.
	Start(ctx context.Context, spec Spec, sink Sink) (Workload, error)
}

// StartError is a classified start failure: the failed status message is
// "<stage>: <message>".
type StartError struct {
	Stage   string // pull, inspect, daemon, create, attach, start
	Message string
}

func (e *StartError) Error() string { return e.Stage + ": " + e.Message }

// Prober is a backend that can check its own setup (POST /v1/probe); a
// backend without it needs none.
type Prober interface {
	// Probe returns one issue per missing piece (none: ready), or an
	// error when the check itself could not run.
	Probe(ctx context.Context) ([]contract.Issue, error)
}
