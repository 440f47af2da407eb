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
// bounded in entries and bytes. The hub reads no faster than the fastest
// client (while every follower is full it waits); a follower that is full
// while another has room gets the entry dropped and is marked lagged, and
// the client refills the hole from the log (ReadRange reads only the
// hole), so a slow client is slowed and costs at most its bound, never
// given a hole, and never holds back the others.
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
	stopped bool       // under hub.mu
	room    *sync.Cond // on hub.mu: a follower took an entry, left, or the topic stopped
	waiting atomic.Bool
	h       *hub
	// Direct delivery to hijacked SSE clients (ssehijack.go), under hub.mu:
	// how many clients are direct, the entries waiting for the topic's
	// writer, whether it runs, and a heartbeat it owes.
	ndirect  int
	pend     *sseBatch
	writerOn bool
	beatDue  bool
	wake     chan struct{} // cap 1: the writer has work
}

// follower is one client's live feed: a queue that holds memory only for
// the entries waiting (an idle client costs a few words, not a buffer of
// its bound), and a wake channel the client selects on.
type follower struct {
	wake       chan struct{} // cap 1: entries may wait
	maxEntries int
	maxBytes   int64
	queued     atomic.Int64 // payload bytes waiting
	lagged     atomic.Bool  // an entry was dropped: repair from the log
	t          *topic
	d          *sseConn // under hub.mu: a hijacked SSE client (nil: the client reads q itself)

	mu   sync.Mutex
	q    []bus.Entry // q[head:] wait
	head int
}

// push queues e (the hub's delivery only) and wakes the client.
func (f *follower) push(e bus.Entry) {
	f.queued.Add(int64(len(e.Data)))
	f.mu.Lock()
	f.q = append(f.q, e)
	f.mu.Unlock()
	f.signal()
}

func (f *follower) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// next takes the oldest waiting entry (false: none), wakes the client again
// while more wait, and wakes the hub when it waits for room.
func (f *follower) next() (bus.Entry, bool) {
	f.mu.Lock()
	if f.head == len(f.q) {
		f.mu.Unlock()
		return bus.Entry{}, false
	}
	e := f.q[f.head]
	f.q[f.head] = bus.Entry{}
	f.head++
	more := f.head < len(f.q)
	if !more {
		// Drained: keep a small array for the next burst, drop a large one.
		if cap(f.q) > 64 {
			f.q = nil
		} else {
			f.q = f.q[:0]
		}
		f.head = 0
	}
	f.mu.Unlock()
	if more {
		f.signal()
	}
	f.queued.Add(-int64(len(e.Data)))
	if f.t.waiting.Load() {
		f.t.h.mu.Lock()
		f.t.room.Broadcast()
		f.t.h.mu.Unlock()
	}
	return e, true
}

// waiting counts the entries waiting.
func (f *follower) waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.q) - f.head
}

// full reports whether an entry of size bytes would not fit.
func (f *follower) full(size int64) bool {
	n := f.waiting()
	return n >= f.maxEntries || (f.queued.Load()+size > f.maxBytes && n > 0)
}

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
		t = &topic{ready: make(chan struct{}), clients: map[*follower]struct{}{}, h: h}
		t.room = sync.NewCond(&h.mu)
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
	f = &follower{wake: make(chan struct{}, 1), maxEntries: entries, maxBytes: maxBytes, t: t}
	h.mu.Lock()
	if h.topics[subject] != t {
		// The topic was stopped while we waited: start again.
		h.mu.Unlock()
		return h.follow(ctx, subject, entries, maxBytes)
	}
	t.clients[f] = struct{}{}
	upTo = t.last.Load()
	t.room.Broadcast() // a waiting delivery has an empty follower now
	h.mu.Unlock()
	stop = func() {
		h.mu.Lock()
		delete(t.clients, f)
		last := len(t.clients) == 0 && h.topics[subject] == t
		if last {
			delete(h.topics, subject)
			t.stopped = true
		}
		t.room.Broadcast()
		h.mu.Unlock()
		if last {
			t.stop()
		}
	}
	return f, upTo, stop, nil
}

// deliver runs on the topic's follower goroutine. It reads no faster than
// the fastest client: while every follower is full it waits for room (the
// stream keeps the entries; the consumer's pull buffer is bounded), so a
// lone slow client is slowed without dropping and re-reading. Otherwise a
// full follower's entry is dropped and it is marked lagged.
func (h *hub) deliver(t *topic, e bus.Entry) {
	size := int64(len(e.Data))
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		t.waiting.Store(true)
		if t.stopped || len(t.clients) == 0 || !allFull(t, size) {
			break
		}
		t.room.Wait()
	}
	t.waiting.Store(false)
	t.last.Store(e.Seq)
	if t.ndirect > 0 {
		t.pend.add(e) // the topic's writer takes it to every direct client
		t.signalWriter()
	}
	for f := range t.clients {
		if d := f.d; d != nil && d.mode == sseDirect {
			continue
		}
		if f.full(size) {
			f.lagged.Store(true)
			continue
		}
		f.push(e) // room checked above; only deliver pushes
	}
}

func allFull(t *topic, size int64) bool {
	for f := range t.clients {
		if !f.full(size) {
			return false
		}
	}
	return true
}
