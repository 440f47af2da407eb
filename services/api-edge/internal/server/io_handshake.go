package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
)

// ioTarget is what an io socket's handshake settled: the session, the app
// and the position to resume after.
type ioTarget struct {
	id      string
	rec     session.Record
	app     *session.App
	subject string // the app's io log subject
	lastSeq uint64
	// terminal is signalled when a status event with the terminal header
	// is seen on the session's event subject (a hint: the record decides).
	terminal chan struct{}
	release  func() // ends the event subscription
}

// hint signals a possibly terminal status.
func (t *ioTarget) hint() {
	select {
	case t.terminal <- struct{}{}:
	default:
	}
}

// ioHandshake runs the socket's first steps (7.1–7.3): the origin, the
// session, the app. On a refusal it has closed the socket with the
// contract's code and reports false. The target's release must be called
// either way.
func (s *Server) ioHandshake(ctx context.Context, c *gin.Context, conn *websocket.Conn) (*ioTarget, bool) {
	t := &ioTarget{id: c.Param("id"), terminal: make(chan struct{}, 1), release: func() {}}
	// 1. Origin.
	if !s.cfg.CORS.AnyOrigin {
		if _, ok := s.cfg.CORS.AllowOrigin(c.GetHeader("Origin")); !ok {
			closeWith(conn, 4403, "forbidden_origin")
			return t, false
		}
	}
	// 2. Session. Status changes are followed from here on (core
	// subscription to the event subject before the read, so a terminal
	// status between the two is not missed). Core traffic includes
	// publishes JetStream refused, so a terminal hint is confirmed with the
	// record (terminal before its event is appended) before draining.
	if contract.ValidSessionID(t.id) {
		statusSub, err := s.nc.Subscribe(bus.EventsSubject(t.id), func(m *nats.Msg) {
			if m.Header.Get(bus.HeaderTerminal) != "" {
				t.hint()
			}
		})
		if err != nil {
			closeWith(conn, websocket.CloseInternalServerErr, "bus unavailable")
			return t, false
		}
		t.release = func() { _ = statusSub.Unsubscribe() }
	}
	rec, _, err := s.store.Get(ctx, t.id)
	if errors.Is(err, session.ErrNotFound) {
		closeWith(conn, 4404, "session not found")
		return t, false
	}
	if err != nil {
		closeWith(conn, websocket.CloseInternalServerErr, "registry unavailable")
		return t, false
	}
	t.rec = rec
	if rec.Status.Terminal() {
		t.hint()
	}
	// 3. App selection.
	if name := strings.TrimSpace(c.Query("app")); name != "" {
		a, ok := t.rec.App(name)
		if !ok {
			closeWith(conn, 4404, fmt.Sprintf("session runs no app named '%s'", name))
			return t, false
		}
		t.app = a
	} else if len(t.rec.Apps) != 1 {
		closeWith(conn, 4404, fmt.Sprintf("session runs %d apps — ?app= is required", len(t.rec.Apps)))
		return t, false
	} else {
		t.app = &t.rec.Apps[0]
	}
	t.lastSeq, _ = parsePosition(c.Query("lastSeq"))
	t.subject = bus.IOSubject(t.id, t.app.Name)
	return t, true
}
