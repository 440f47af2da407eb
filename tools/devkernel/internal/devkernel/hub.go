package devkernel

import (
	"slices"
	"sync"
	"time"
)

// ReplayFrames is how many frames the hub keeps for replay to a new client.
const ReplayFrames = 5000

// clientQueue bounds the frames queued for one /events client; a client that
// falls this far behind is dropped so it never blocks the kernel.
const clientQueue = 256

// Hub is the process-wide debug wire: it stamps and encodes frames, keeps the
// last ReplayFrames of them, fans them out to subscribers, and remembers the
// currently declared ports for /json/version. It survives watch reloads.
// Publishing never blocks. The zero value is not usable; use NewHub.
type Hub struct {
	now func() time.Time

	mu     sync.Mutex
	ring   [][]byte // len <= ReplayFrames; oldest at start
	start  int
	subs   map[*subscriber]struct{}
	closed bool
	ports  []Port
}

type subscriber struct {
	ch chan []byte // closed by the hub when dropped or when the hub closes
}

// NewHub returns an empty hub using now for timestamps (time.Now if nil).
func NewHub(now func() time.Time) *Hub {
	if now == nil {
		now = time.Now
	}
	return &Hub{now: now, subs: make(map[*subscriber]struct{})}
}

// Event publishes an event frame; a nil payload is sent as {}.
func (h *Hub) Event(name string, payload any) {
	h.publish(encodeEvent(h.now(), name, payload))
}

// Log publishes a log frame for one line of process output.
func (h *Hub) Log(stream, line string) {
	h.publish(encodeLog(h.now(), stream, line))
}

// SetPorts records the declared port set reported by /json/version.
func (h *Hub) SetPorts(ports []Port) {
	h.mu.Lock()
	h.ports = slices.Clone(ports)
	h.mu.Unlock()
}

// Ports returns the declared port set last recorded.
func (h *Hub) Ports() []Port {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ports)
}

func (h *Hub) publish(frame []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	if len(h.ring) < ReplayFrames {
		h.ring = append(h.ring, frame)
	} else {
		h.ring[h.start] = frame
		h.start = (h.start + 1) % ReplayFrames
	}
	for s := range h.subs {
		select {
		case s.ch <- frame:
		default:
			h.dropLocked(s)
		}
	}
}

// subscribe returns the replay buffer and a live subscription that starts
// right after it, so no frame is missed or repeated. sub is nil when the hub
// is closed.
func (h *Hub) subscribe() (replay [][]byte, sub *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	replay = make([][]byte, 0, len(h.ring))
	replay = append(replay, h.ring[h.start:]...)
	replay = append(replay, h.ring[:h.start]...)
	if h.closed {
		return replay, nil
	}
	sub = &subscriber{ch: make(chan []byte, clientQueue)}
	h.subs[sub] = struct{}{}
	return replay, sub
}

func (h *Hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		h.dropLocked(s)
	}
}

func (h *Hub) dropLocked(s *subscriber) {
	delete(h.subs, s)
	close(s.ch)
}

// Close ends every subscription once its queued frames are delivered and
// stops accepting frames.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		h.dropLocked(s)
	}
}
