package devkernel

import (
	"encoding/json"
	"time"
)

// Kernel event names of the debug wire (contract 10.5.5).
const (
	EventInitialized   = "Kernel.Initialized"
	EventStarting      = "Kernel.Starting"
	EventPortsResolved = "Kernel.PortsResolved"
	EventStarted       = "Kernel.Started"
	EventStopping      = "Kernel.Stopping"
	EventStopped       = "Kernel.Stopped"
	EventRunFailed     = "Kernel.RunFailed"
)

// Run-failure phases of Kernel.RunFailed.
const (
	PhaseLoad  = "load"
	PhaseStart = "start"
)

// timestampLayout is RFC 3339 in UTC with milliseconds and a literal Z.
const timestampLayout = "2006-01-02T15:04:05.000Z"

type eventFrame struct {
	Kind      string `json:"kind"`
	Timestamp string `json:"timestamp"`
	Event     string `json:"event"`
	Payload   any    `json:"payload"`
}

type logFrame struct {
	Kind      string `json:"kind"`
	Timestamp string `json:"timestamp"`
	Stream    string `json:"stream"`
	Line      string `json:"line"`
}

type portsPayload struct {
	Ports []portJSON `json:"ports"`
}

type portJSON struct {
	Name     string `json:"name"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
}

type runFailedPayload struct {
	Phase   string `json:"phase"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

type stoppedPayload struct {
	ExitCode int `json:"exitCode"`
}

type empty struct{}

func stamp(t time.Time) string { return t.UTC().Format(timestampLayout) }

func encodeEvent(t time.Time, name string, payload any) []byte {
	if payload == nil {
		payload = empty{}
	}
	return mustJSON(eventFrame{Kind: "event", Timestamp: stamp(t), Event: name, Payload: payload})
}

func encodeLog(t time.Time, stream, line string) []byte {
	return mustJSON(logFrame{Kind: "log", Timestamp: stamp(t), Stream: stream, Line: line})
}

func portsJSON(ports []Port) []portJSON {
	out := make([]portJSON, 0, len(ports))
	for _, p := range ports {
		out = append(out, portJSON{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
	}
	return out
}

// mustJSON marshals values built from plain structs, strings and numbers,
// which cannot fail.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("devkernel: encode frame: " + err.Error())
	}
	return b
}
