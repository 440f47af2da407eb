package server

import (
	"context"

	"github.com/telorunner/telorunner/pkg/bus"
)

// ioRelay moves one app's io log to one socket: the entries after
// delivered, from the hub's follower while it keeps up and from the log
// where it does not (a hole, a lagging follower), until the session ends.
type ioRelay struct {
	s         *Server
	ctx       context.Context
	t         *ioTarget
	f         *follower
	out       chan outFrame // the writer's queue
	sent      *queued       // frames queued but not yet written
	delivered uint64        // the last sequence queued for the socket
}

// send queues a frame for the writer; false when the socket is ending.
func (r *ioRelay) send(fr outFrame) bool {
	r.sent.add(fr)
	r.s.ioHeld.observe(r.sent.bytes.Load() + r.f.queued.Load())
	select {
	case r.out <- fr:
		return true
	case <-r.ctx.Done():
		r.sent.done(fr)
		return false
	}
}

// fill sends the log's entries after delivered up to upTo (7.2 step 9,
// and a slow client's lag repair: only the hole is read).
func (r *ioRelay) fill(upTo uint64) bool {
	if upTo <= r.delivered {
		return true
	}
	err := r.s.store.IO().ReadRange(r.ctx, r.t.subject, r.delivered, upTo, func(e bus.Entry, gap bool) error {
		if gap && r.delivered == r.t.lastSeq && !r.send(outFrame{text: true, data: []byte(`{"type":"gap","reason":"buffer_evicted"}`)}) {
			return r.ctx.Err()
		}
		if !r.send(outFrame{seq: e.Seq, data: e.Data}) {
			return r.ctx.Err()
		}
		r.delivered = e.Seq
		return nil
	})
	return err == nil
}

// run relays until the socket ends (false) or the session is terminal and
// every entry of its log is queued (true: drain and close, 7.8).
func (r *ioRelay) run() bool {
	var drainTail uint64
	draining := false
	termCh := r.t.terminal
	for {
		if draining && r.delivered >= drainTail {
			return true
		}
		select {
		case <-r.ctx.Done():
			return false
		case <-termCh:
			now, _, err := r.s.store.Get(r.ctx, r.t.id)
			if err != nil {
				return false // abnormal close: the client reconnects with lastSeq
			}
			if !now.Status.Terminal() {
				break // a refused publish, not the session's end
			}
			termCh = nil
			tail, err := r.s.store.IO().Tail(r.ctx, r.t.subject)
			if err != nil {
				return false
			}
			draining, drainTail = true, tail
		case <-r.f.wake:
			if !r.live() {
				return false
			}
		}
		if r.f.lagged.Load() && r.f.waiting() == 0 {
			r.f.lagged.Store(false)
			if r.f.last() > r.delivered {
				r.s.m.streamRepairs.WithLabelValues("io").Inc()
			}
			if !r.fill(r.f.last()) {
				return false
			}
		}
	}
}

// live sends the follower's next entry, first repairing a hole before it
// from the log; false when the socket is ending.
func (r *ioRelay) live() bool {
	e, ok := r.f.next()
	if !ok || e.Seq <= r.delivered {
		return true
	}
	if e.Seq > r.delivered+1 {
		r.s.m.streamRepairs.WithLabelValues("io").Inc()
		if !r.fill(e.Seq - 1) {
			return false
		}
	}
	if e.Seq > r.delivered {
		if !r.send(outFrame{seq: e.Seq, data: e.Data}) {
			return false
		}
		r.delivered = e.Seq
	}
	return true
}
