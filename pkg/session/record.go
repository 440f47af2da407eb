// Package session is the durable session registry shared by every service:
// the session record in the runner_sessions bucket, its event log, its
// bundle, admission slots and eviction. Every status transition goes
// through SetStatus (a CAS on the record that also queues the status event
// in the record's outbox, then the append of that event) so that the
// record and the event stream agree whichever actor caused it, even when
// the actor dies between the two steps.
package session

import (
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
)

// Record is a session as stored in runner_sessions.
type Record struct {
	ID          string          `json:"sessionId"`
	Mode        string          `json:"mode"`
	Agent       string          `json:"agent,omitempty"`
	Status      contract.Status `json:"status"`
	Apps        []App           `json:"apps"`
	CreatedAt   time.Time       `json:"createdAt"`
	ExitedAt    *time.Time      `json:"exitedAt,omitempty"`
	IdleSince   *time.Time      `json:"idleSince,omitempty"`
	SuspendedAt *time.Time      `json:"suspendedAt,omitempty"`
	// StartRequestedAt is when a start command was last requested
	// (create, resume). The supervisor leaves a starting session with no
	// owner alone for a grace after it: the command may still be on its
	// way to the queue.
	StartRequestedAt *time.Time `json:"startRequestedAt,omitempty"`
	UserStopped      bool       `json:"userStopped,omitempty"`
	Launch           Launch     `json:"launch"`
	// Workspace is the base URL of a watch session's live workspace
	// server ("" while it has none).
	Workspace string `json:"workspace,omitempty"`
	// Driver is the identity of the driver that served the workspace last
	// (set with Workspace). A driver recovering the session after a crash
	// serves a workspace directory it finds on its machine only when that
	// driver created it; otherwise the checkpoint is newer.
	Driver string `json:"driver,omitempty"`
	// Reloads are the admitted reload/write times of the last 60 s (13.5).
	Reloads []time.Time `json:"reloads,omitempty"`
	// Outbox holds the status events of transitions whose event is not
	// yet known to be in the event log, oldest first (Store.SetStatus).
	Outbox []PendingStatus `json:"outbox,omitempty"`
}

// PendingStatus is one status event in a record's outbox.
type PendingStatus struct {
	// ID is the event's Nats-Msg-Id, the same for every append attempt.
	ID string `json:"id"`
	// After is the event log's stream position before the transition:
	// the event, once appended, lies after it.
	After  uint64          `json:"after"`
	At     time.Time       `json:"at"`
	Status contract.Status `json:"status"`
}

// App is one app channel of a session.
type App struct {
	Name       string                 `json:"name"`
	Entry      string                 `json:"entryRelativePath"`
	IO         string                 `json:"io"`
	Generation int                    `json:"generation"`
	Ports      []contract.PortMapping `json:"ports"`
	// Trigger is the pending expectation of the app's next generation.
	Trigger string `json:"trigger,omitempty"`
}

// Launch is the retained launch description a driver starts from. It
// never holds operator catalog env (RUNNER_APPS secrets): the driver adds
// it at start from its own RUNNER_APPS, by the names in OperatorApp and
// AgentSpec.
type Launch struct {
	// Env is the session's own env (for an operator app session: the
	// caller's variables the entry does not set).
	Env           map[string]string      `json:"env"`
	Config        contract.SessionConfig `json:"config"`
	Inspect       bool                   `json:"inspect"`
	SelfContained bool                   `json:"selfContained,omitempty"`
	AgentSpec     *AgentSpec             `json:"agentSpec,omitempty"`
	// OperatorApp names the RUNNER_APPS entry an operator app session
	// runs (POST /v1/apps/:name/sessions); its env overrides Env.
	OperatorApp string `json:"operatorApp,omitempty"`
}

// AgentSpec is a resolved operator catalog entry, without its env (the
// driver resolves that from its RUNNER_APPS by Name).
type AgentSpec struct {
	Name       string `json:"name"`
	Image      string `json:"image"`
	PullPolicy string `json:"pullPolicy,omitempty"`
	Port       int    `json:"port,omitempty"`
}

// App returns the app named name.
func (r *Record) App(name string) (*App, bool) {
	for i := range r.Apps {
		if r.Apps[i].Name == name {
			return &r.Apps[i], true
		}
	}
	return nil, false
}

// Reclaimable reports whether the session may be evicted to admit another,
// and the time that orders candidates (oldest first).
func (r *Record) Reclaimable() (bool, time.Time) {
	switch {
	case r.Status.Terminal():
		if r.ExitedAt != nil {
			return true, *r.ExitedAt
		}
		return true, time.Time{}
	case r.Status.Kind == contract.StatusSuspended:
		if r.IdleSince != nil {
			return true, *r.IdleSince
		}
		return true, time.Time{}
	}
	return false, time.Time{}
}

// LiveWatch reports whether the session counts against the watch ceiling.
func (r *Record) LiveWatch() bool {
	return r.Mode == contract.ModeWatch && !r.Status.Terminal() && r.Status.Kind != contract.StatusSuspended
}

// AppsChange is the runner.ctl.<id>.apps request of PUT apps: the resolved
// new app set, whether the agent must be dropped (an app declares its
// port), and notices for the event stream.
type AppsChange struct {
	Apps      []App    `json:"apps"`
	DropAgent bool     `json:"dropAgent,omitempty"`
	Notices   []string `json:"notices,omitempty"`
}
