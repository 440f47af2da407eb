package kernelwire

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
)

// ProbeTimeout is the connect timeout of one reachability probe (11.7).
const ProbeTimeout = time.Second

// Reachability schedule defaults (contract 11.7).
const (
	DefaultReachInterval     = 1 * time.Second
	DefaultReachDeadline     = 30 * time.Second
	DefaultReachSlowInterval = 5 * time.Second
	// The first FastFor of a watch probes every FastInterval (never less
	// often than Interval): a one-shot whose port lives a few hundred
	// milliseconds is still seen reachable, which 1 s probes would miss.
	DefaultReachFastInterval = 50 * time.Millisecond
	DefaultReachFastFor      = 5 * time.Second
)

// ReachSink receives reachability states. backend.Sink satisfies it.
type ReachSink interface {
	Reachability(app string, port int, state string)
}

// ReachTiming is the reachability watcher's schedule; zero fields get the
// contract's defaults.
type ReachTiming struct {
	Interval, Deadline, SlowInterval time.Duration
	FastInterval, FastFor            time.Duration
}

func (t ReachTiming) withDefaults() ReachTiming {
	if t.Interval <= 0 {
		t.Interval = DefaultReachInterval
	}
	if t.Deadline <= 0 {
		t.Deadline = DefaultReachDeadline
	}
	if t.SlowInterval <= 0 {
		t.SlowInterval = DefaultReachSlowInterval
	}
	if t.FastInterval <= 0 {
		t.FastInterval = DefaultReachFastInterval
	}
	t.FastInterval = min(t.FastInterval, t.Interval)
	if t.FastFor <= 0 {
		t.FastFor = DefaultReachFastFor
	}
	return t
}

// WatchReachability reports a declared tcp port's reachability at
// host:port: checking at once, then a probe every FastInterval for FastFor
// and every Interval after that; the first
// successful connect reports reachable and ends the watch. If the port is
// still unreachable Deadline after the start, unreachable is reported once
// and probing goes on every SlowInterval. It blocks until reachable or ctx
// ends.
func WatchReachability(ctx context.Context, host string, port int, app string, sink ReachSink, tm ReachTiming) {
	tm = tm.withDefaults()
	sink.Reachability(app, port, contract.ReachChecking)
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	probe := time.NewTimer(0)
	defer probe.Stop()
	deadline := time.NewTimer(tm.Deadline)
	defer deadline.Stop()
	start := time.Now()
	interval := tm.Interval
	for {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			sink.Reachability(app, port, contract.ReachUnreachable)
			interval = tm.SlowInterval
			continue
		case <-probe.C:
		}
		if reachable(ctx, addr) {
			sink.Reachability(app, port, contract.ReachReachable)
			return
		}
		if interval == tm.Interval && time.Since(start) < tm.FastFor {
			probe.Reset(tm.FastInterval)
			continue
		}
		probe.Reset(interval)
	}
}

func reachable(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: ProbeTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close() // a probe connection; nothing was sent
	return true
}

// ProgressSink receives progress notices. backend.Sink satisfies it.
type ProgressSink interface {
	Progress(phase, message string, done bool, app string)
}

// CheckAgentPort checks that a co-resident agent listens on its catalog
// port (19.5): the agent's port gets no reachability events (11.7), so one
// that does not answer within tm.Deadline is reported once as a progress
// notice (no app) naming the agent and the operator setting. It blocks
// until the port answers, the notice is sent, or ctx ends.
func CheckAgentPort(ctx context.Context, host string, port int, agent string, sink ProgressSink, tm ReachTiming) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	WatchReachability(ctx, host, port, agent, agentReach{sink: sink, agent: agent, cancel: cancel}, tm)
}

type agentReach struct {
	sink   ProgressSink
	agent  string
	cancel context.CancelFunc
}

func (a agentReach) Reachability(_ string, port int, state string) {
	if state != contract.ReachUnreachable {
		return
	}
	a.sink.Progress(contract.PhaseBoot, fmt.Sprintf(
		"agent %s is not listening on port %d: its address leads nowhere until it does (RUNNER_APPS.%s.port must be the port its image listens on)",
		a.agent, port, a.agent), false, "")
	a.cancel()
}
