package bus

import (
	"time"

	"github.com/telorunner/telorunner/pkg/envconf"
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
	l := Limits{}.Defaults()
	e := envconf.New(lookup)
	e.Int("RUNNER_NATS_REPLICAS", 1, 5, &l.Replicas)
	e.Int64("RUNNER_REPLAY_BUFFER_BYTES", 1, envconf.NoMax, &l.ReplayBytes)
	e.Duration("RUNNER_OWNER_TTL_MS", time.Millisecond, 300, 600000, &l.OwnerTTL)
	return l, e.Err()
}
