package bus

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// LoadLimits reads the bus limits from the environment. It is the one
// place every service — standalone (run.Main) or in the all-in-one — gets
// them, so that all provision and use the same streams and buckets (the
// presence TTL keeps its default):
//
//   - RUNNER_NATS_REPLICAS: replicas of every stream, bucket and object
//     store, 1 to 5 (default 1; 3 on a 3-node NATS cluster in production).
//   - RUNNER_REPLAY_BUFFER_BYTES: the byte window of each session's event
//     log and each app channel (contract 18.1; default 5000000).
//   - RUNNER_OWNER_TTL_MS: how long an owner key outlives its dead driver,
//     300 to 600000 (default 15000; the pod-driver reads it too, with the
//     same bounds); a dead driver's sessions are adopted within about
//     twice this.
//
// A bad value is an error naming the variable.
func LoadLimits(lookup func(string) (string, bool)) (Limits, error) {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	l := Limits{}.Defaults()
	if v := get("RUNNER_NATS_REPLICAS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 5 {
			return l, fmt.Errorf("RUNNER_NATS_REPLICAS: must be 1 to 5, got %q", v)
		}
		l.Replicas = n
	}
	if v := get("RUNNER_REPLAY_BUFFER_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return l, fmt.Errorf("RUNNER_REPLAY_BUFFER_BYTES: must be a positive integer, got %q", v)
		}
		l.ReplayBytes = n
	}
	if v := get("RUNNER_OWNER_TTL_MS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 300 || n > 600000 {
			return l, fmt.Errorf("RUNNER_OWNER_TTL_MS: must be an integer from 300 to 600000, got %q", v)
		}
		l.OwnerTTL = time.Duration(n) * time.Millisecond
	}
	return l, nil
}
