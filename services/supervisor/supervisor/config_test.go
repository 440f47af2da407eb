package supervisor

import (
	"strings"
	"testing"
	"time"
)

func TestLoadConfig(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	c, err := LoadConfig(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.ExitTTL != 4*time.Hour || c.Idle != 300*time.Second || c.CheckpointEvery != 30*time.Second || c.SuspendedTTL != 24*time.Hour || c.Tick != 5*time.Second {
		t.Errorf("defaults = %+v, want the contract's (18.1) and a 5 s tick", c)
	}
	c, err = LoadConfig(env(map[string]string{
		"RUNNER_EXIT_TTL_MS": "1500", "RUNNER_WATCH_IDLE_SECONDS": "3", "RUNNER_WORKSPACE_CHECKPOINT_SECONDS": " 1 ",
		"RUNNER_WATCH_SUSPENDED_TTL_SECONDS": "60", "RUNNER_SUPERVISOR_TICK_MS": "200",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.ExitTTL != 1500*time.Millisecond || c.Idle != 3*time.Second || c.CheckpointEvery != time.Second || c.SuspendedTTL != time.Minute || c.Tick != 200*time.Millisecond {
		t.Errorf("overrides = %+v", c)
	}
	for _, key := range []string{"RUNNER_EXIT_TTL_MS", "RUNNER_WATCH_IDLE_SECONDS", "RUNNER_WORKSPACE_CHECKPOINT_SECONDS", "RUNNER_WATCH_SUSPENDED_TTL_SECONDS", "RUNNER_SUPERVISOR_TICK_MS"} {
		for _, bad := range []string{"0", "-1", "5s", "1e3"} {
			if _, err := LoadConfig(env(map[string]string{key: bad})); err == nil || !strings.HasPrefix(err.Error(), key+":") {
				t.Errorf("LoadConfig(%s=%q) = %v, want an error naming %s", key, bad, err, key)
			}
		}
	}
}
