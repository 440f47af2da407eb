package server

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/session"
)

// heartbeatEvery is the SSE comment heartbeat period (6.3).
var heartbeatEvery = 20 * time.Second

// sseFollowBuffer and sseFollowBytes bound the live entries waiting for
// one SSE client before it is marked lagged and repaired from the log.
var (
	sseFollowBuffer       = 1024
	sseFollowBytes  int64 = 1 << 20
)

// parsePosition parses a base-10 integer prefix; ok is false when nothing
// parses or the value is negative (6.1, 7.1).
func parsePosition(s string) (uint64, bool) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, false
	}
	n, err := strconv.ParseUint(s[:i], 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// terminalEventGrace is how long a stream of a terminal session whose
// status event is not in the log yet waits for it (the supervisor delivers
// an outbox within about two ticks).
const terminalEventGrace = 30 * time.Second

// events is GET /v1/sessions/:id/events (section 6), served from the
// session's event log: ids are the log's Runner-Seq.
func (s *Server) events(c *gin.Context) {
	id := c.Param("id")
	ctx, cancel := context.WithCancel(c.Request.Context())
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	s.wg.Add(1)
	defer s.wg.Done()

	rec, _, err := s.store.Get(ctx, id)
	if errors.Is(err, session.ErrNotFound) {
		s.fail(c, notFound(id))
		return
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	after, ok := parsePosition(c.GetHeader("Last-Event-ID"))
	if !ok {
		after, _ = parsePosition(c.Query("lastEventId"))
	}
	subject := bus.EventsSubject(id)
	// Follow live entries first (buffered): every entry after upTo reaches
	// the follower, every one up to it is replayed from the log, starting
	// at the client's position — no gap, no duplicate (6.4, 19.36).
	f, upTo, unfollow, err := s.hub.follow(ctx, subject, sseFollowBuffer, sseFollowBytes)
	if err != nil {
		s.fail(c, err)
		return
	}
	owned := true // false once a hijacked connection owns the follower
	defer func() {
		if owned {
			unfollow()
		}
	}()
	terminal := rec.Status.Terminal()

	w := c.Writer
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache, no-transform")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	w.Flush()

	st := &sseStream{w: w, last: after, first: true} // buf grows on the first event: an idle client holds none
	if done, err := s.replay(ctx, st, subject, upTo); done || err != nil {
		return
	}
	var grace <-chan time.Time
	if terminal {
		// The record is terminal but its status event is not in the log
		// yet: it is being appended, or waits in the record's outbox for
		// the supervisor (its writer died). Follow until it arrives, for
		// a while.
		t := time.NewTimer(terminalEventGrace)
		defer t.Stop()
		grace = t.C
	} else {
		release := s.presence.Acquire(id)
		s.m.sseClients.Inc()
		if s.hijackSSE(c, f, st, subject, unfollow, release) {
			owned = false
			return
		}
		defer s.m.sseClients.Dec()
		defer release()
	}

	beat := time.NewTicker(heartbeatEvery)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-grace:
			return
		case <-beat.C:
			if _, err := w.Write([]byte(": heartbeat\n\n")); err != nil {
				return
			}
			w.Flush()
		case <-f.wake:
			done, err := s.drain(ctx, st, f, subject)
			if done || err != nil {
				return
			}
			w.Flush()
		}
	}
}

// drain writes the live entries waiting in f (filling a hole from the log
// first), then refills a lagged client from the log once its queue is
// empty; done reports that a terminal status was written.
func (s *Server) drain(ctx context.Context, st *sseStream, f *follower, subject string) (done bool, err error) {
	for {
		e, ok := f.next()
		if !ok {
			break
		}
		if e.Seq <= st.last {
			continue
		}
		if e.Seq > st.last+1 {
			// Entries were dropped for this slow client: fill the hole
			// from the log (only the hole is read).
			s.m.streamRepairs.WithLabelValues("sse").Inc()
			if done, err := s.replay(ctx, st, subject, e.Seq-1); done || err != nil {
				return done, err
			}
			if e.Seq <= st.last {
				continue // the hole's read reached past it (evictions)
			}
		}
		if done, err := st.write(e, false); done || err != nil {
			return done, err
		}
	}
	if f.lagged.Load() && f.waiting() == 0 {
		f.lagged.Store(false)
		if f.last() > st.last {
			s.m.streamRepairs.WithLabelValues("sse").Inc()
		}
		return s.replay(ctx, st, subject, f.last())
	}
	return false, nil
}

// sseStream writes SSE frames, remembering the last id written.
type sseStream struct {
	w     flushWriter
	last  uint64
	first bool
	buf   []byte
}

// write frames one entry; done reports that it was a terminal status.
func (st *sseStream) write(e bus.Entry, gap bool) (done bool, err error) {
	b := st.buf[:0]
	if gap && st.first {
		b = append(b, "event: gap\ndata: {\"reason\":\"buffer_evicted\"}\n\n"...)
	}
	st.first = false
	b = appendFrame(b, e)
	st.buf = b
	if _, err := st.w.Write(b); err != nil {
		return false, err
	}
	st.last = e.Seq
	if e.Header.Get(bus.HeaderTerminal) != "" {
		st.w.Flush()
		return true, nil
	}
	return false, nil
}

// flushWriter is where an SSE stream writes: net/http's response, or a
// hijacked connection's chunk writer.
type flushWriter interface {
	Write([]byte) (int, error)
	Flush()
}

// appendFrame appends e's SSE frame (6.3).
func appendFrame(b []byte, e bus.Entry) []byte {
	b = append(b, "id: "...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, "\nevent: "...)
	b = append(b, e.Header.Get(bus.HeaderType)...)
	b = append(b, "\ndata: "...)
	b = append(b, e.Data...)
	return append(b, "\n\n"...)
}

// replay writes the log's entries after st.last up to and including upTo,
// reading only that range.
func (s *Server) replay(ctx context.Context, st *sseStream, subject string, upTo uint64) (done bool, err error) {
	// A read of the log that fails (the bus slow to answer under load) is
	// read again from where the client now is — st.last advances with
	// every entry written, so nothing is sent twice — a few times before
	// the stream ends (the client then resumes from its last id).
	wait := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if upTo <= st.last {
			return false, nil
		}
		if attempt == 0 && upTo-st.last <= sharedReplayEntries {
			if entries, gap, ok := s.sharedRead(ctx, subject, st.last, upTo); ok {
				for i, e := range entries {
					done, werr := st.write(e, gap && i == 0)
					if done || werr != nil {
						return done && werr == nil, werr
					}
				}
				st.w.Flush()
				return false, nil
			}
		}
		var werr error
		err = s.store.Events().ReadRange(ctx, subject, st.last, upTo, func(e bus.Entry, gap bool) error {
			if done, werr = st.write(e, gap); done && werr == nil {
				return errStreamDone
			}
			return werr
		})
		switch {
		case errors.Is(err, errStreamDone):
			return true, nil
		case err == nil:
			st.w.Flush()
			return false, nil
		case werr != nil || ctx.Err() != nil || attempt == 3:
			if werr == nil && ctx.Err() == nil {
				s.log.Warn("read the event log for an SSE client; the stream ends, the client resumes from its last id", "subject", subject, "after", st.last, "err", err)
			}
			return false, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
		wait *= 2
	}
}

// Clients that replay the same short range at the same time (a storm of
// new clients of one session) share one read of the log: the first reads,
// the others wait for its entries. Each gets what the log held while it
// was connected, so nothing changes for it; the edge reads the entries
// once instead of once per client (each read is a few direct gets whose
// replies the server builds and the client parses).
const (
	sharedReplayEntries = 256
	sharedReplayBytes   = 1 << 20
)

type replayKey struct {
	subject     string
	after, upTo uint64
}

type replayRead struct {
	done    chan struct{}
	entries []bus.Entry
	gap     bool // on the first entry
	ok      bool // false: read failed or too large; read alone
}

// sharedRead reads (after, upTo] of subject, or waits for the same read
// already under way; ok is false when the caller must read alone.
func (s *Server) sharedRead(ctx context.Context, subject string, after, upTo uint64) (entries []bus.Entry, gap, ok bool) {
	k := replayKey{subject, after, upTo}
	s.readsMu.Lock()
	if r, found := s.reads[k]; found {
		s.readsMu.Unlock()
		select {
		case <-r.done:
			return r.entries, r.gap, r.ok
		case <-ctx.Done():
			return nil, false, false
		}
	}
	r := &replayRead{done: make(chan struct{})}
	if s.reads == nil {
		s.reads = map[replayKey]*replayRead{}
	}
	s.reads[k] = r
	s.readsMu.Unlock()
	size := 0
	err := s.store.Events().ReadRange(ctx, subject, after, upTo, func(e bus.Entry, g bool) error {
		if len(r.entries) == 0 {
			r.gap = g
		}
		if size += len(e.Data); size > sharedReplayBytes {
			return errTooLarge
		}
		r.entries = append(r.entries, e)
		return nil
	})
	if r.ok = err == nil; !r.ok {
		r.entries = nil
	}
	s.readsMu.Lock()
	delete(s.reads, k)
	s.readsMu.Unlock()
	close(r.done)
	return r.entries, r.gap, r.ok
}

var errTooLarge = errors.New("range too large to share")

// errStreamDone ends a replay at a terminal status.
var errStreamDone = errors.New("stream done")
