package local

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// probeTimeout is the connect timeout of one reachability probe (11.7).
const probeTimeout = time.Second

// reachTiming is the reachability watcher's schedule (contract 11.7).
type reachTiming struct {
	interval, deadline, slowInterval time.Duration
}

// watchReach reports a declared tcp port's reachability on loopback:
// checking at once, then a probe every interval; the first successful
// connect reports reachable and ends the watch. If the port is still
// unreachable deadline after the start, unreachable is reported once and
// probing goes on every slowInterval. It returns when ctx ends.
func watchReach(ctx context.Context, app string, port int, tm reachTiming, sink backend.Sink) {
	sink.Reachability(app, port, contract.ReachChecking)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	probe := time.NewTimer(0)
	defer probe.Stop()
	deadline := time.NewTimer(tm.deadline)
	defer deadline.Stop()
	interval := tm.interval
	for {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			sink.Reachability(app, port, contract.ReachUnreachable)
			interval = tm.slowInterval
			continue
		case <-probe.C:
		}
		if reachable(ctx, addr) {
			sink.Reachability(app, port, contract.ReachReachable)
			return
		}
		probe.Reset(interval)
	}
}

func reachable(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: probeTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close() // a probe connection; nothing was sent
	return true
}
