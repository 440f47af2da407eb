package supervisor

import (
	"time"

	"github.com/telorunner/telorunner/pkg/envconf"
	"github.com/telorunner/telorunner/pkg/session"
)

// LoadConfig reads the supervisor's variables (contract 18.1, plus
// RUNNER_SUPERVISOR_TICK_MS); unset or empty means the default.
func LoadConfig(lookup func(string) (string, bool)) (Config, error) {
	var c Config
	e := envconf.New(lookup)
	session.ReadLifetimes(e, &c.ExitTTL, &c.Idle, &c.SuspendedTTL, &c.CheckpointEvery)
	e.Duration("RUNNER_SUPERVISOR_TICK_MS", time.Millisecond, 1, envconf.NoMax, &c.Tick)
	if err := e.Err(); err != nil {
		return c, err
	}
	return c.withDefaults(), nil
}
