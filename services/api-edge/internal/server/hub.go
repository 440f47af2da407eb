package server

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/telorunner/telorunner/pkg/bus"
)

// hub fans live log entries out to this edge's stream clients (SSE and io):
// one follower of the stream per subject however many clients watch it,
// instead of one JetStream consumer each. It follows what the stream stored
// (bus.Log.Follow, an ordered consumer), never the subject's core traffic,
// so an entry JetStream refused is never delivered.
//
// A client registers, gets the Runner-Seq up to which the hub has already
// passed entries on (upTo), reads (its position, upTo] from the log, and
// then takes every later entry from its follower. A follower's queue is
// bounded in entries and bytes; when it is full the entry is dropped and
// the follower marked lagged, and the client refills the hole from the log
// (ReadRange reads only the hole), so a slow client is slowed and costs at
// most its bound, never given a hole.
type hub struct {
	ctx context.Context
	log func(subject string) *bus.Log

	mu     sync.Mutex
	topics map[string]*topic
}

type topic struct {
	ready   chan struct{} // closed once started (err says how)
	err     error
	stop    func()
	last    atomic.Uint64 // Runner-Seq of the newest entry passed on
	clients map[*follower]struct{}
}

// follower is one client's live feed.
type follower struct {
	ch       chan bus.Entry
	maxBytes int64
	queued   atomic.Int64 // payload bytes in ch
	lagged   atomic.Bool  // an entry was dropped: repair from the log
	t        *topic
}

// take accounts for an entry the client received from ch.
func (f *follower) take(e bus.Entry) { f.queued.Add(-int64(len(e.Data))) }

// last is the Runner-Seq of the newest entry the hub passed on (delivered
// or dropped) for this follower's subject.
func (f *follower) last() uint64 { return f.t.last.Load() }

func newHub(ctx context.Context, log func(subject string) *bus.Log) *hub {
	return &hub{ctx: ctx, log: log, topics: map[string]*topic{}}
}

// follow registers a follower of subject whose queue holds at most entries
// entries and maxBytes payload bytes; every entry after upTo reaches it
// (or marks it lagged). Call stop exactly once.
func (h *hub) follow(ctx context.Context, subject string, entries int, maxBytes int64) (f *follower, upTo uint64, stop func(), err error) {
	h.mu.Lock()
	t, ok := h.topics[subject]
	if !ok {
		t = &topic{ready: make(chan struct{}), clients: map[*follower]struct{}{}}
		h.topics[subject] = t
		// Start outside the lock (round trips); later clients wait.
		h.mu.Unlock()
		tail, stopFollow, err := h.log(subject).Follow(h.ctx, subject, func(e bus.Entry) { h.deliver(t, e) })
		h.mu.Lock()
		if err != nil {
			t.err = err
			delete(h.topics, subject)
		} else {
			t.stop = stopFollow
			if t.last.Load() < tail {
				t.last.Store(tail)
			}
		}
		close(t.ready)
	}
	h.mu.Unlock()
	select {
	case <-t.ready:
	case <-ctx.Done():
		return nil, 0, nil, ctx.Err()
	}
	if t.err != nil {
		return nil, 0, nil, t.err
	}
	f = &follower{ch: make(chan bus.Entry, entries), maxBytes: maxBytes, t: t}
	h.mu.Lock()
	if h.topics[subject] != t {
		// The topic was stopped while we waited: start again.
		h.mu.Unlock()
		return h.follow(ctx, subject, entries, maxBytes)
	}
	t.clients[f] = struct{}{}
	upTo = t.last.Load()
	h.mu.Unlock()
	stop = func() {
		h.mu.Lock()
		delete(t.clients, f)
		last := len(t.clients) == 0 && h.topics[subject] == t
		if last {
			delete(h.topics, subject)
		}
		h.mu.Unlock()
		if last {
			t.stop()
		}
	}
	return f, upTo, stop, nil
}

// deliver runs on the topic's follower goroutine; it never blocks.
func (h *hub) deliver(t *topic, e bus.Entry) {
	size := int64(len(e.Data))
	h.mu.Lock()
	defer h.mu.Unlock()
	t.last.Store(e.Seq)
	for f := range t.clients {
		if f.queued.Load()+size > f.maxBytes && len(f.ch) > 0 {
			f.lagged.Store(true)
			continue
		}
		select {
		case f.ch <- e:
			f.queued.Add(size)
		default:
			f.lagged.Store(true)
		}
	}
}
