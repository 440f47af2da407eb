package session

import (
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/envconf"
)

func TestReadLifetimes(t *testing.T) {
	vars := map[string]string{"RUNNER_EXIT_TTL_MS": "1500", "RUNNER_WATCH_IDLE_SECONDS": " "}
	l := DefaultLifetimes()
	e := envconf.New(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	ReadLifetimes(e, &l.ExitTTL, &l.Idle, &l.SuspendedTTL, &l.Checkpoint)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	want := DefaultLifetimes()
	want.ExitTTL = 1500 * time.Millisecond
	if l != want {
		t.Errorf("lifetimes = %+v, want %+v (blank and unset keep the defaults)", l, want)
	}

	vars = map[string]string{"RUNNER_WATCH_SUSPENDED_TTL_SECONDS": "0", "RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "soon"}
	e = envconf.New(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	ReadLifetimes(e, &l.ExitTTL, &l.Idle, &l.SuspendedTTL, &l.Checkpoint)
	err := e.Err()
	if err == nil {
		t.Fatal("a zero TTL and a word were accepted")
	}
	for _, name := range []string{"RUNNER_WATCH_SUSPENDED_TTL_SECONDS", "RUNNER_WORKSPACE_CHECKPOINT_SECONDS"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
}
