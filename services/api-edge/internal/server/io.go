package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
)

// io tunables (section 7).
var (
	ioSendQueue           = 16                    // frames queued for the socket's writer (each at most 64 KiB + 5)
	ioFollowEntries       = 256                   // live entries waiting in a socket's follower...
	ioFollowBytes   int64 = 1 << 20               // ...and their payload bytes, before it repairs from the log
	ioDrainPoll           = 50 * time.Millisecond // 7.8
	ioDrainMax            = 2 * time.Second       // 7.8
	ioResizeTrail         = 50 * time.Millisecond // 7.7
	ioWriteDeadline       = 10 * time.Second
)

var upgrader = websocket.Upgrader{
	ReadBufferSize:  4096,
	WriteBufferSize: 64 << 10,
	// The origin check runs after the upgrade so a browser can read the
	// refusal as a close code (7.1).
	CheckOrigin: func(*http.Request) bool { return true },
}

type outFrame struct {
	text bool
	seq  uint64
	data []byte
}

// io is GET /v1/sessions/:id/io (section 7).
func (s *Server) io(c *gin.Context) {
	conn, err := upgrader.Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		return // the upgrader answered the HTTP error
	}
	s.wg.Add(1)
	defer s.wg.Done()
	defer conn.Close()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	// Whatever ends the handler (a failed write, a failed read, shutdown)
	// closes the socket, so the reader goroutine never waits on a client
	// that sends nothing.
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()

	closeWith := func(code int, reason string) {
		msg := websocket.FormatCloseMessage(code, reason)
		_ = conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
	}
	// 1. Origin.
	if !s.cfg.CORS.AnyOrigin {
		if _, ok := s.cfg.CORS.AllowOrigin(c.GetHeader("Origin")); !ok {
			closeWith(4403, "forbidden_origin")
			return
		}
	}
	// 2. Session. Status changes are followed from here on (core
	// subscription to the event subject before the read, so a terminal
	// status between the two is not missed). Core traffic includes
	// publishes JetStream refused, so a terminal hint is confirmed with the
	// record (terminal before its event is appended) before draining.
	id := c.Param("id")
	terminalCh := make(chan struct{}, 1)
	hint := func() {
		select {
		case terminalCh <- struct{}{}:
		default:
		}
	}
	var statusSub *nats.Subscription
	if contract.ValidSessionID(id) {
		statusSub, err = s.nc.Subscribe(bus.EventsSubject(id), func(m *nats.Msg) {
			if m.Header.Get(bus.HeaderTerminal) != "" {
				hint()
			}
		})
		if err != nil {
			closeWith(websocket.CloseInternalServerErr, "bus unavailable")
			return
		}
		defer func() { _ = statusSub.Unsubscribe() }()
	}
	rec, _, err := s.store.Get(ctx, id)
	if errors.Is(err, session.ErrNotFound) {
		closeWith(4404, "session not found")
		return
	}
	if err != nil {
		closeWith(websocket.CloseInternalServerErr, "registry unavailable")
		return
	}
	if rec.Status.Terminal() {
		hint()
	}
	// 3. App selection.
	var app *session.App
	if name := strings.TrimSpace(c.Query("app")); name != "" {
		a, ok := rec.App(name)
		if !ok {
			closeWith(4404, fmt.Sprintf("session runs no app named '%s'", name))
			return
		}
		app = a
	} else if len(rec.Apps) != 1 {
		closeWith(4404, fmt.Sprintf("session runs %d apps — ?app= is required", len(rec.Apps)))
		return
	} else {
		app = &rec.Apps[0]
	}
	lastSeq, _ := parsePosition(c.Query("lastSeq"))
	subject := bus.IOSubject(id, app.Name)
	// 4–6. Follow the app's live entries (buffered), then replay from the
	// log what lies between lastSeq and where the hub stands.
	f, upTo, unfollow, err := s.hub.follow(ctx, subject, ioFollowEntries, ioFollowBytes)
	if err != nil {
		closeWith(websocket.CloseInternalServerErr, "bus unavailable")
		return
	}
	defer unfollow()
	if rec.Status.Terminal() {
		tail, err := s.store.IO().Tail(ctx, subject)
		if err == nil && tail <= lastSeq {
			closeWith(4410, "session terminal, nothing to replay")
			return
		}
	}

	// One writer goroutine owns every write. The send queue is bounded;
	// the loop below waits on it (it is the only thing that reads the log
	// or the follower for this socket), so a client that does not read
	// holds at most ioSendQueue frames here and ioFollowBytes in its
	// follower, and the rest is read from the log once it catches up.
	out := make(chan outFrame, ioSendQueue)
	writerDone := make(chan struct{})
	sent := &queued{} // frames queued but not yet written
	go func() {
		defer close(writerDone)
		s.writeLoop(ctx, conn, out, sent, cancel)
	}()
	defer func() { <-writerDone }()
	defer cancel()
	send := func(fr outFrame) bool {
		sent.add(fr)
		s.ioHeld.observe(sent.bytes.Load() + f.queued.Load())
		select {
		case out <- fr:
			return true
		case <-ctx.Done():
			sent.done(fr)
			return false
		}
	}
	seqFrame, _ := json.Marshal(map[string]any{"type": "seq", "seq": lastSeq, "app": app.Name, "io": app.IO})
	send(outFrame{text: true, data: seqFrame})

	delivered := lastSeq
	// fill sends the log's entries after delivered up to upTo (7.2 step 9,
	// and a slow client's lag repair: only the hole is read).
	fill := func(upTo uint64) bool {
		if upTo <= delivered {
			return true
		}
		err := s.store.IO().ReadRange(ctx, subject, delivered, upTo, func(e bus.Entry, gap bool) error {
			if gap && delivered == lastSeq && !send(outFrame{text: true, data: []byte(`{"type":"gap","reason":"buffer_evicted"}`)}) {
				return ctx.Err()
			}
			if !send(outFrame{seq: e.Seq, data: e.Data}) {
				return ctx.Err()
			}
			delivered = e.Seq
			return nil
		})
		return err == nil
	}
	if !fill(upTo) {
		return
	}

	// One reader goroutine: stdin and resize.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer cancel()
		s.readLoop(ctx, conn, id, app, send)
	}()
	defer func() { <-readerDone }()
	defer cancel()
	s.m.ioClients.Inc()
	defer s.m.ioClients.Dec()
	release := s.presence.Acquire(id)
	defer release()

	var drainTail uint64
	draining := false
	termCh := terminalCh
	for {
		if draining && delivered >= drainTail {
			s.drainAndClose(ctx, sent, conn)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-termCh:
			now, _, err := s.store.Get(ctx, id)
			if err != nil {
				return // abnormal close: the client reconnects with lastSeq
			}
			if !now.Status.Terminal() {
				break // a refused publish, not the session's end
			}
			termCh = nil
			tail, err := s.store.IO().Tail(ctx, subject)
			if err != nil {
				return
			}
			draining, drainTail = true, tail
		case <-f.wake:
			e, ok := f.next()
			if !ok {
				break
			}
			if e.Seq <= delivered {
				break
			}
			if e.Seq > delivered+1 {
				s.m.streamRepairs.WithLabelValues("io").Inc()
				if !fill(e.Seq - 1) {
					return
				}
			}
			if e.Seq > delivered {
				if !send(outFrame{seq: e.Seq, data: e.Data}) {
					return
				}
				delivered = e.Seq
			}
		}
		if f.lagged.Load() && f.waiting() == 0 {
			f.lagged.Store(false)
			if f.last() > delivered {
				s.m.streamRepairs.WithLabelValues("io").Inc()
			}
			if !fill(f.last()) {
				return
			}
		}
	}
}

// queued counts a socket's frames (and their payload bytes) that wait for
// its writer.
type queued struct{ frames, bytes atomic.Int64 }

func (q *queued) add(f outFrame)  { q.frames.Add(1); q.bytes.Add(int64(len(f.data))) }
func (q *queued) done(f outFrame) { q.frames.Add(-1); q.bytes.Add(-int64(len(f.data))) }

// highWater keeps the largest value observed.
type highWater struct{ v atomic.Int64 }

func (h *highWater) observe(n int64) {
	for {
		cur := h.v.Load()
		if n <= cur || h.v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// drainAndClose polls until every queued frame was written or the drain
// window passed, then closes with 1000 (7.8).
func (s *Server) drainAndClose(ctx context.Context, sent *queued, conn *websocket.Conn) {
	deadline := time.Now().Add(ioDrainMax)
	t := time.NewTicker(ioDrainPoll)
	defer t.Stop()
	for sent.frames.Load() > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "session terminal"), time.Now().Add(time.Second))
}

// writeLoop owns the connection's writes.
func (s *Server) writeLoop(ctx context.Context, conn *websocket.Conn, out <-chan outFrame, sent *queued, cancel context.CancelFunc) {
	var hdr [4]byte
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-out:
			_ = conn.SetWriteDeadline(time.Now().Add(ioWriteDeadline))
			var err error
			if f.text {
				err = conn.WriteMessage(websocket.TextMessage, f.data)
			} else {
				var w interface {
					Write([]byte) (int, error)
					Close() error
				}
				w, err = conn.NextWriter(websocket.BinaryMessage)
				if err == nil {
					binary.BigEndian.PutUint32(hdr[:], uint32(f.seq))
					_, _ = w.Write(hdr[:])
					_, _ = w.Write(f.data)
					err = w.Close()
					if len(f.data) > 1 {
						s.m.ioBytesOut.Add(float64(len(f.data) - 1))
					}
				}
			}
			sent.done(f)
			if err != nil {
				cancel()
				return
			}
		}
	}
}

// readLoop handles client frames: binary → stdin, resize control frames.
func (s *Server) readLoop(ctx context.Context, conn *websocket.Conn, id string, app *session.App, send func(outFrame) bool) {
	conn.SetReadLimit(1 << 20)
	var mu sync.Mutex
	var pending *[2]int
	var timer *time.Timer
	defer func() {
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}()
	flush := func() {
		mu.Lock()
		p := pending
		pending, timer = nil, nil
		mu.Unlock()
		if p != nil {
			s.publishCtl(id, bus.CtlResize, app.Name, fmt.Appendf(nil, `{"cols":%d,"rows":%d}`, p[0], p[1]))
		}
	}
	for ctx.Err() == nil {
		kind, data, err := conn.ReadMessage()
		if err != nil {
			return
		}
		if kind == websocket.BinaryMessage {
			s.publishCtl(id, bus.CtlStdin, app.Name, data)
			continue
		}
		var f struct {
			Type string `json:"type"`
			Cols any    `json:"cols"`
			Rows any    `json:"rows"`
		}
		if json.Unmarshal(data, &f) != nil || f.Type != "resize" {
			continue
		}
		if app.IO == contract.IOStreams {
			send(outFrame{text: true, data: []byte(`{"type":"error","error":"resize_unsupported","io":"streams"}`)})
			continue
		}
		cols, ok1 := clampDim(f.Cols)
		rows, ok2 := clampDim(f.Rows)
		if !ok1 || !ok2 {
			continue
		}
		mu.Lock()
		pending = &[2]int{cols, rows}
		if timer == nil {
			timer = time.AfterFunc(ioResizeTrail, flush)
		}
		mu.Unlock()
	}
}

// clampDim applies 7.7: number conversion, floor, < 1 ignored, > 10000 clamped.
func clampDim(v any) (int, bool) {
	var f float64
	switch t := v.(type) {
	case float64:
		f = t
	case string:
		p, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
		if err != nil {
			return 0, false
		}
		f = p
	case bool:
		if t {
			f = 1
		}
	default:
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	f = math.Floor(f)
	if f < 1 {
		return 0, false
	}
	if f > 10000 {
		f = 10000
	}
	return int(f), true
}

// publishCtl sends a fire-and-forget control message (stdin, resize) to
// the owner; with no live owner it is dropped, as the contract says input
// to a session without a workload is.
func (s *Server) publishCtl(id, verb, app string, data []byte) {
	msg := &nats.Msg{Subject: bus.CtlSubject(id, verb), Data: data, Header: nats.Header{}}
	msg.Header.Set(bus.HeaderApp, app)
	if err := s.nc.PublishMsg(msg); err != nil {
		s.log.Warn("publish control", "session", id, "verb", verb, "err", err)
	}
}
