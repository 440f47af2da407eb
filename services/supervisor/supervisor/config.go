package supervisor

import (
	"time"

	"github.com/telorunner/telorunner/pkg/envconf"
)

// LoadConfig reads the supervisor's variables (contract 18.1, plus
// RUNNER_SUPERVISOR_TICK_MS); unset or empty means the default.
func LoadConfig(lookup func(string) (string, bool)) (Config, error) {
	var c Config
	e := envconf.New(lookup)
	e.Duration("RUNNER_EXIT_TTL_MS", time.Millisecond, 1, envconf.NoMax, &c.ExitTTL)
	e.Duration("RUNNER_WATCH_IDLE_SECONDS", time.Second, 1, envconf.NoMax, &c.Idle)
	e.Duration("RUNNER_WORKSPACE_CHECKPOINT_SECONDS", time.Second, 1, envconf.NoMax, &c.CheckpointEvery)
	e.Duration("RUNNER_WATCH_SUSPENDED_TTL_SECONDS", time.Second, 1, envconf.NoMax, &c.SuspendedTTL)
	e.Duration("RUNNER_SUPERVISOR_TICK_MS", time.Millisecond, 1, envconf.NoMax, &c.Tick)
	if err := e.Err(); err != nil {
		return c, err
	}
	return c.withDefaults(), nil
}
