package supervisor

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// LoadConfig reads the supervisor's variables (contract 18.1, plus
// RUNNER_SUPERVISOR_TICK_MS); unset or empty means the default.
func LoadConfig(lookup func(string) (string, bool)) (Config, error) {
	var c Config
	for _, v := range []struct {
		name string
		unit time.Duration
		dst  *time.Duration
	}{
		{"RUNNER_EXIT_TTL_MS", time.Millisecond, &c.ExitTTL},
		{"RUNNER_WATCH_IDLE_SECONDS", time.Second, &c.Idle},
		{"RUNNER_WORKSPACE_CHECKPOINT_SECONDS", time.Second, &c.CheckpointEvery},
		{"RUNNER_WATCH_SUSPENDED_TTL_SECONDS", time.Second, &c.SuspendedTTL},
		{"RUNNER_SUPERVISOR_TICK_MS", time.Millisecond, &c.Tick},
	} {
		raw, _ := lookup(v.name)
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n <= 0 || n > int64(1<<62)/int64(v.unit) {
			return c, fmt.Errorf("%s: must be a positive integer, got %q", v.name, raw)
		}
		*v.dst = time.Duration(n) * v.unit
	}
	return c.withDefaults(), nil
}
