package session

import (
	"time"

	"github.com/telorunner/telorunner/pkg/envconf"
)

// Lifetimes are the session lifetimes that the edge (what it advertises
// and enforces at the door) and the supervisor (what it evicts, suspends
// and checkpoints) both act on (contract 18.1): one set of defaults and
// one reading of the variables, so the two services cannot disagree.
type Lifetimes struct {
	ExitTTL      time.Duration // RUNNER_EXIT_TTL_MS: retention of ended sessions
	Idle         time.Duration // RUNNER_WATCH_IDLE_SECONDS: zero-subscriber window before a suspend
	SuspendedTTL time.Duration // RUNNER_WATCH_SUSPENDED_TTL_SECONDS: retention of suspended sessions
	Checkpoint   time.Duration // RUNNER_WORKSPACE_CHECKPOINT_SECONDS: periodic checkpoint cadence
}

// DefaultLifetimes are contract 18.1's defaults.
func DefaultLifetimes() Lifetimes {
	return Lifetimes{ExitTTL: 4 * time.Hour, Idle: 300 * time.Second, SuspendedTTL: 24 * time.Hour, Checkpoint: 30 * time.Second}
}

// ReadLifetimes reads the four variables (positive whole counts of their
// unit) into the services' own fields; an unset or blank variable leaves
// its field as it is, a bad one is an error collected by e.
func ReadLifetimes(e *envconf.Env, exitTTL, idle, suspendedTTL, checkpoint *time.Duration) {
	e.Duration("RUNNER_EXIT_TTL_MS", time.Millisecond, 1, envconf.NoMax, exitTTL)
	e.Duration("RUNNER_WATCH_IDLE_SECONDS", time.Second, 1, envconf.NoMax, idle)
	e.Duration("RUNNER_WATCH_SUSPENDED_TTL_SECONDS", time.Second, 1, envconf.NoMax, suspendedTTL)
	e.Duration("RUNNER_WORKSPACE_CHECKPOINT_SECONDS", time.Second, 1, envconf.NoMax, checkpoint)
}
