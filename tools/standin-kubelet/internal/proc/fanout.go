package proc

import "sync"

// subBuffer bounds how many unread chunks a subscriber may hold before it
// is cut off.
const subBuffer = 256

// fanout copies one output stream to any number of live subscribers.
// Output published while nobody subscribes is dropped, as with a real
// container runtime's attach.
type fanout struct {
	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	closed bool
}

type subscriber struct {
	ch chan []byte
	// slow is set (under fanout.mu) when the subscriber was cut off
	// because its buffer was full.
	slow bool
}

func newFanout() *fanout {
	return &fanout{subs: map[*subscriber]struct{}{}}
}

// subscribe returns a subscriber whose channel receives every chunk
// published from now on; it is closed by unsubscribe, when the stream ends,
// or when the subscriber falls too far behind. It returns nil when the
// stream has already ended.
func (f *fanout) subscribe() *subscriber {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	s := &subscriber{ch: make(chan []byte, subBuffer)}
	f.subs[s] = struct{}{}
	return s
}

// unsubscribe ends s; it is a no-op for a subscriber already ended.
func (f *fanout) unsubscribe(s *subscriber) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; ok {
		delete(f.subs, s)
		close(s.ch)
	}
}

// isSlow reports whether s was cut off for falling behind.
func (f *fanout) isSlow(s *subscriber) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return s.slow
}

// publish hands b (which the fanout now owns) to every subscriber without
// blocking.
func (f *fanout) publish(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		select {
		case s.ch <- b:
		default:
			s.slow = true
			delete(f.subs, s)
			close(s.ch)
		}
	}
}

// close ends the stream for every subscriber, after the chunks they hold.
func (f *fanout) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.closed = true
	for s := range f.subs {
		delete(f.subs, s)
		close(s.ch)
	}
}
