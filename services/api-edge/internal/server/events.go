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
	var tail uint64
	terminal := rec.Status.Terminal()
	if terminal {
		if tail, err = s.store.Events.Tail(ctx, subject); err != nil {
			s.fail(c, err)
			return
		}
	}
	reader, err := s.store.Events.Read(ctx, subject, after)
	if err != nil {
		s.fail(c, err)
		return
	}
	defer reader.Close()

	w := c.Writer
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache, no-transform")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	w.Flush()
	if terminal && after >= tail {
		return
	}
	s.m.sseClients.Inc()
	defer s.m.sseClients.Dec()
	if !terminal {
		release := s.presence.Acquire(id)
		defer release()
	}

	entries := make(chan readResult, 64)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		pump(ctx, reader, entries)
	}()
	beat := time.NewTicker(heartbeatEvery)
	defer beat.Stop()
	buf := make([]byte, 0, 4096)
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			if _, err := w.Write([]byte(": heartbeat\n\n")); err != nil {
				return
			}
			w.Flush()
		case r, ok := <-entries:
			if !ok || r.err != nil {
				return
			}
			buf = buf[:0]
			if r.gap {
				buf = append(buf, "event: gap\ndata: {\"reason\":\"buffer_evicted\"}\n\n"...)
			}
			buf = append(buf, "id: "...)
			buf = strconv.AppendUint(buf, r.e.Seq, 10)
			buf = append(buf, "\nevent: "...)
			buf = append(buf, r.e.Header.Get(bus.HeaderType)...)
			buf = append(buf, "\ndata: "...)
			buf = append(buf, r.e.Data...)
			buf = append(buf, "\n\n"...)
			if _, err := w.Write(buf); err != nil {
				return
			}
			// Flush once the burst is written: replay goes out in large writes.
			if len(entries) == 0 {
				w.Flush()
			}
			if r.e.Header.Get(bus.HeaderTerminal) != "" || (terminal && r.e.Seq >= tail) {
				w.Flush()
				return
			}
		}
	}
}

type readResult struct {
	e   bus.Entry
	gap bool
	err error
}

// pump copies a reader's entries into out until ctx ends or it fails; it
// closes out.
func pump(ctx context.Context, r *bus.Reader, out chan<- readResult) {
	defer close(out)
	for {
		e, gap, _, err := r.Next()
		select {
		case out <- readResult{e: e, gap: gap, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}
