package driver

import (
	"sync"

	"github.com/telorunner/telorunner/pkg/contract"
)

// evQueueMax is how many events may wait for emission before a sender
// blocks.
const evQueueMax = 4096

// evQueue is a session's ordered emission queue: FIFO, bounded at
// evQueueMax waiting events (a sender blocks beyond), holding memory only
// for the events waiting. It replaced a 4,096-slot channel, which cost
// every owned session ~1.1 MB of heap (4,096 × a 272-byte contract.Event)
// from its start to its end, whether it ever queued more than a few events
// (issue 20).
type evQueue struct {
	mu       sync.Mutex
	notEmpty sync.Cond
	notFull  sync.Cond
	items    []contract.Event
	head     int // items[head:] wait
	closed   bool
}

func newEvQueue() *evQueue {
	q := &evQueue{}
	q.notEmpty.L = &q.mu
	q.notFull.L = &q.mu
	return q
}

// push appends ev, waiting while the queue is full. It must not be called
// after close (the owner's evMu orders the two).
func (q *evQueue) push(ev contract.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items)-q.head >= evQueueMax && !q.closed {
		q.notFull.Wait()
	}
	q.items = append(q.items, ev)
	q.notEmpty.Signal()
}

// close lets pop return false once the queue is drained.
func (q *evQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.notEmpty.Broadcast()
	q.notFull.Broadcast()
}

// pop returns the oldest waiting event, waiting for one; false once the
// queue is closed and drained.
func (q *evQueue) pop() (contract.Event, bool) {
	evs, ok := q.popUpTo(nil, 1)
	if !ok {
		return contract.Event{}, false
	}
	return evs[0], true
}

// popUpTo appends to dst the oldest waiting events, at most max of them,
// waiting for one; false once the queue is closed and drained.
func (q *evQueue) popUpTo(dst []contract.Event, max int) ([]contract.Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.head == len(q.items) && !q.closed {
		q.notEmpty.Wait()
	}
	if q.head == len(q.items) {
		return dst, false
	}
	for n := 0; n < max && q.head < len(q.items); n++ {
		dst = append(dst, q.items[q.head])
		q.items[q.head] = contract.Event{} // drop its references
		q.head++
	}
	if q.head == len(q.items) {
		// Drained: start over, and give a burst's backing array back.
		q.head = 0
		if cap(q.items) > 64 {
			q.items = nil
		} else {
			q.items = q.items[:0]
		}
	}
	q.notFull.Broadcast()
	return dst, true
}
