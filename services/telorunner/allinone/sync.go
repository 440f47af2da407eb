package allinone

import (
	"fmt"
	"time"
)

// Sync is when the embedded JetStream server flushes its store to disk
// (RUNNER_NATS_SYNC). The zero value is the server's default: every
// 2 minutes, so acknowledged writes of the last interval live only in the
// page cache — they survive the process being killed, not the machine
// losing power or crashing.
type Sync struct {
	// Interval is the background flush period (0: the server's 2m).
	Interval time.Duration
	// Always flushes every write before it is acknowledged.
	Always bool
}

// ParseSync reads RUNNER_NATS_SYNC: empty (the server's default), a Go
// duration such as `10s` or `2m` (the flush interval), or `always`.
func ParseSync(v string) (Sync, error) {
	switch v {
	case "":
		return Sync{}, nil
	case "always":
		return Sync{Always: true}, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return Sync{}, fmt.Errorf("RUNNER_NATS_SYNC: must be a positive duration (e.g. 10s, 2m) or always, got %q", v)
	}
	return Sync{Interval: d}, nil
}

// String is how the setting is logged.
func (s Sync) String() string {
	switch {
	case s.Always:
		return "always"
	case s.Interval > 0:
		return s.Interval.String()
	}
	return "default (2m)"
}
