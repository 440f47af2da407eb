// Package contract holds the /v1 JSON shapes of the Telo runner contract
// (v1-contract.md), relayed verbatim on the bus, and its pure rules: bundle
// path normalization and session ids.
package contract

import (
	"encoding/json"
	"time"
)

// Session modes, io modes, phases, triggers and status kinds.
const (
	ModeRun   = "run"
	ModeWatch = "watch"

	IOTTY     = "tty"
	IOStreams = "streams"

	PhaseBuild     = "build"
	PhaseProvision = "provision"
	PhaseBoot      = "boot"

	TriggerInitial = "initial"
	TriggerWatch   = "watch"
	TriggerManual  = "manual"
	TriggerResume  = "resume"

	StatusStarting  = "starting"
	StatusRunning   = "running"
	StatusExited    = "exited"
	StatusSuspended = "suspended"
	StatusFailed    = "failed"
	StatusStopped   = "stopped"

	ReachChecking    = "checking"
	ReachReachable   = "reachable"
	ReachUnreachable = "unreachable"

	// DefaultApp is the name of the single app of a session without apps.
	DefaultApp = "app"
)

// Byte stream tags of io frames.
const (
	TagTTY    byte = 0
	TagStdout byte = 1
	TagStderr byte = 2
)

// PortMapping is a port an app declares.
type PortMapping struct {
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
}

// Key is the port's identity inside a session, "<protocol>/<port>".
func (p PortMapping) Key() string { return p.Protocol + "/" + itoa(p.Port) }

// Endpoint is a published port (RunnerEndpoint).
type Endpoint struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
	URL      string `json:"url,omitempty"`
}

// SessionConfig is the base image choice of a session.
type SessionConfig struct {
	Image       string `json:"image"`
	PullPolicy  string `json:"pullPolicy"`
	RegistryURL string `json:"registryUrl,omitempty"`
}

// BundleFile is one file of a bundle.
type BundleFile struct {
	RelativePath string `json:"relativePath"`
	Contents     string `json:"contents"`
	Encoding     string `json:"encoding,omitempty"`
}

// Bundle is the application a run session executes or a watch session's
// initial workspace.
type Bundle struct {
	EntryRelativePath string       `json:"entryRelativePath"`
	Files             []BundleFile `json:"files"`
}

// AppSpec is one application of a session.
type AppSpec struct {
	Name              string        `json:"name"`
	EntryRelativePath string        `json:"entryRelativePath"`
	Ports             []PortMapping `json:"ports"`
	IO                string        `json:"io"`
}

// Status is a RunStatus.
type Status struct {
	Kind       string     `json:"kind"`
	Endpoints  []Endpoint `json:"endpoints,omitempty"`
	InspectURL string     `json:"inspectUrl,omitempty"`
	Agent      *Endpoint  `json:"agent,omitempty"`
	Code       *int       `json:"code,omitempty"`
	Message    string     `json:"message,omitempty"`
}

// MarshalJSON keeps `endpoints` present (possibly empty) on running.
func (s Status) MarshalJSON() ([]byte, error) {
	type plain Status
	if s.Kind == StatusRunning {
		eps := s.Endpoints
		if eps == nil {
			eps = []Endpoint{}
		}
		return json.Marshal(struct {
			plain
			Endpoints []Endpoint `json:"endpoints"`
		}{plain(s), eps})
	}
	return json.Marshal(plain(s))
}

// Terminal reports whether the status ends the session.
func (s Status) Terminal() bool { return IsTerminal(s.Kind) }

// IsTerminal reports whether a status kind ends the session.
func IsTerminal(kind string) bool {
	return kind == StatusExited || kind == StatusFailed || kind == StatusStopped
}

// Event is one event of a session's event stream. Type selects which
// fields are set; absent fields are omitted.
type Event struct {
	Type string `json:"type"`
	// status
	Status *Status `json:"status,omitempty"`
	// progress, debug, reachability, run, endpoints
	App string `json:"app,omitempty"`
	// progress
	Phase   string `json:"phase,omitempty"`
	Message string `json:"message,omitempty"`
	Done    bool   `json:"done,omitempty"`
	// debug
	Frame json.RawMessage `json:"frame,omitempty"`
	// reachability
	Port  int    `json:"port,omitempty"`
	State string `json:"state,omitempty"`
	// run (Phase is reused: started|completed|failed)
	Generation int    `json:"generation,omitempty"`
	Trigger    string `json:"trigger,omitempty"`
	Code       *int   `json:"code,omitempty"`
	DurationMs *int64 `json:"durationMs,omitempty"`
	Reason     string `json:"reason,omitempty"`
	// endpoints
	Added    []Endpoint `json:"added,omitempty"`
	Removed  []Endpoint `json:"removed,omitempty"`
	Rejected []Rejected `json:"rejected,omitempty"`
}

// Rejected is a port an app declared that could not be published.
type Rejected struct {
	Port   int    `json:"port"`
	Reason string `json:"reason"`
}

// Event types.
const (
	EventStatus       = "status"
	EventProgress     = "progress"
	EventDebug        = "debug"
	EventReachability = "reachability"
	EventRun          = "run"
	EventEndpoints    = "endpoints"
)

// StatusEvent wraps a status.
func StatusEvent(s Status) Event { return Event{Type: EventStatus, Status: &s} }

// Error is the contract's error envelope.
type Error struct {
	Code    string `json:"error"`
	Message string `json:"message,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf builds an *Error.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: sprintf(format, args...)}
}

// Timestamp formats t as the contract's ISO-8601 UTC millisecond form.
func Timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// IntPtr returns &v.
func IntPtr(v int) *int { return &v }

// Availability statuses of POST /v1/probe (3.7).
const (
	AvailabilityReady       = "ready"
	AvailabilityNeedsSetup  = "needs-setup"
	AvailabilityUnavailable = "unavailable"
)

// Issue is one missing piece of a `needs-setup` AvailabilityReport (3.7).
type Issue struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

// ProbeReply is a driver's answer on runner.probe (a bus message, not an
// HTTP shape): the setup issues of its backend, or the error that kept it
// from checking.
type ProbeReply struct {
	Issues []Issue `json:"issues,omitempty"`
	Error  string  `json:"error,omitempty"`
}
