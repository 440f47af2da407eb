package server

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
)

// hub fans live log entries out to this edge's stream clients: one core
// NATS subscription per subject however many clients follow it, instead of
// one JetStream consumer each. Clients replay history from the log first
// and then follow the hub; a client that falls behind is marked lagged and
// repairs the hole from the log, so nothing is lost.
type hub struct {
	nc *nats.Conn

	mu     sync.Mutex
	topics map[string]*topic
}

type topic struct {
	sub     *nats.Subscription
	clients map[*follower]struct{}
}

// follower is one client's live feed.
type follower struct {
	ch     chan bus.Entry
	lagged atomic.Bool // an entry was dropped: repair from the log
}

func newHub(nc *nats.Conn) *hub { return &hub{nc: nc, topics: map[string]*topic{}} }

// follow starts buffering subject's live entries for a new client; call
// the returned stop exactly once.
func (h *hub) follow(subject string, buffer int) (*follower, func(), error) {
	f := &follower{ch: make(chan bus.Entry, buffer)}
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.topics[subject]
	if !ok {
		t = &topic{clients: map[*follower]struct{}{}}
		sub, err := h.nc.Subscribe(subject, func(m *nats.Msg) { h.deliver(subject, m) })
		if err != nil {
			return nil, nil, err
		}
		t.sub = sub
		h.topics[subject] = t
	}
	t.clients[f] = struct{}{}
	stop := func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(t.clients, f)
		if len(t.clients) == 0 && h.topics[subject] == t {
			_ = t.sub.Unsubscribe()
			delete(h.topics, subject)
		}
	}
	return f, stop, nil
}

// deliver runs on the subscription's goroutine; it never blocks.
func (h *hub) deliver(subject string, m *nats.Msg) {
	seq, err := strconv.ParseUint(m.Header.Get(bus.HeaderSeq), 10, 64)
	if err != nil {
		return
	}
	e := bus.Entry{Seq: seq, Data: m.Data, Header: m.Header}
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.topics[subject]
	if t == nil {
		return
	}
	for f := range t.clients {
		select {
		case f.ch <- e:
		default:
			f.lagged.Store(true)
		}
	}
}
