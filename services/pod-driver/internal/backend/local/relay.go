package local

import (
	"context"
	"log/slog"
	"net"
	"strconv"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
)

// relayFunc relays one kernel process's debug wire until ctx ends, or
// until exited is closed and the current stream has ended.
type relayFunc func(ctx context.Context, exited <-chan struct{})

// newRelay returns the relay of the kernel whose inspection server listens
// on loopback port (contract 10.4, via kernelwire).
func (b *Backend) newRelay(app string, port int, sink backend.Sink, log *slog.Logger) relayFunc {
	url := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/events"
	return func(ctx context.Context, exited <-chan struct{}) {
		kernelwire.Relay(ctx, url, app, sink, kernelwire.RelayOptions{
			Client: b.client,
			Retry:  b.opts.RelayRetry,
			Exited: exited,
			Logger: log,
		})
	}
}

// reachTiming is the reachability schedule of the backend's options.
func (b *Backend) reachTiming() kernelwire.ReachTiming {
	return kernelwire.ReachTiming{
		Interval:     b.opts.ReachInterval,
		Deadline:     b.opts.ReachDeadline,
		SlowInterval: b.opts.ReachSlowInterval,
	}
}
