package local

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// lifecycle is the part every session workload shares, run or watch: the
// stop and kill requests, the done channel and the recorded exit. The
// backend keeps live workloads by their lifecycle.
type lifecycle struct {
	id string

	stopOnce, killOnce sync.Once
	stopCh, killCh     chan struct{} // closed by requestStop / requestKill

	done chan struct{} // closed after exit is set
	exit backend.Exit

	expired atomic.Bool // the run-time ceiling ended the workload
}

// Ends by the run-time ceiling (contract 11.2 TTL; the wording of the
// runner-held timer of section 15).
var (
	errRunTimeLimit   = errors.New("session reached its time limit")
	errWatchTimeLimit = errors.New("watch session reached its time limit")
)

// armDeadline stops the workload (SIGTERM, SIGKILL after the grace) once
// ttl has passed, and marks it expired. ttl <= 0: no ceiling.
func (l *lifecycle) armDeadline(b *Backend, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	b.wg.Go(func() {
		t := time.NewTimer(ttl)
		defer t.Stop()
		select {
		case <-t.C:
			if !l.stopping() {
				l.expired.Store(true)
				l.requestStop()
			}
		case <-l.done:
		case <-l.stopCh:
		case <-l.killCh:
		}
	})
}

func newLifecycle(id string) lifecycle {
	return lifecycle{
		id:     id,
		stopCh: make(chan struct{}),
		killCh: make(chan struct{}),
		done:   make(chan struct{}),
	}
}

// Stop asks every process group of the session to end (SIGTERM, SIGKILL
// after the backend's StopGrace) and waits for Done or ctx. It is
// idempotent and safe after a natural exit; an expired ctx leaves the
// escalation running.
func (l *lifecycle) Stop(ctx context.Context) error {
	l.requestStop()
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop session %s: %w", l.id, ctx.Err())
	}
}

// Done is closed when every process of the session has ended, its output
// has been delivered, its watchers and relays have stopped and the session
// directory is gone.
func (l *lifecycle) Done() <-chan struct{} { return l.done }

// Exit reports how the workload ended, blocking until Done is closed.
func (l *lifecycle) Exit() backend.Exit {
	<-l.done
	return l.exit
}

func (l *lifecycle) requestStop() { l.stopOnce.Do(func() { close(l.stopCh) }) }
func (l *lifecycle) requestKill() { l.killOnce.Do(func() { close(l.killCh) }) }

// stopping reports whether a stop (or kill) was requested.
func (l *lifecycle) stopping() bool {
	select {
	case <-l.stopCh:
		return true
	case <-l.killCh:
		return true
	default:
		return false
	}
}

// pause waits d, or until a stop or kill request. It reports whether the
// whole pause elapsed.
func (l *lifecycle) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.stopCh:
		return false
	case <-l.killCh:
		return false
	}
}
