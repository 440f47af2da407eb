package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
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

// io is GET /v1/sessions/:id/io (section 7): the handshake (origin,
// session, app, position; ioHandshake), then the relay (ioRelay): one
// writer goroutine, one reader goroutine (stdin, resize) and the loop that
// moves the app's log entries to the socket.
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

	t, ok := s.ioHandshake(ctx, c, conn)
	defer t.release()
	if !ok {
		return
	}
	// 4–6. Follow the app's live entries (buffered), then replay from the
	// log what lies between lastSeq and where the hub stands.
	f, upTo, unfollow, err := s.hub.follow(ctx, t.subject, ioFollowEntries, ioFollowBytes)
	if err != nil {
		closeWith(conn, websocket.CloseInternalServerErr, "bus unavailable")
		return
	}
	defer unfollow()
	if t.rec.Status.Terminal() {
		tail, err := s.store.IO().Tail(ctx, t.subject)
		if err == nil && tail <= t.lastSeq {
			closeWith(conn, 4410, "session terminal, nothing to replay")
			return
		}
	}

	// One writer goroutine owns every write. The send queue is bounded;
	// the relay waits on it (it is the only thing that reads the log or
	// the follower for this socket), so a client that does not read holds
	// at most ioSendQueue frames here and ioFollowBytes in its follower,
	// and the rest is read from the log once it catches up.
	r := &ioRelay{s: s, ctx: ctx, t: t, f: f, out: make(chan outFrame, ioSendQueue), sent: &queued{}, delivered: t.lastSeq}
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		s.writeLoop(ctx, conn, r.out, r.sent, cancel)
	}()
	defer func() { <-writerDone }()
	defer cancel()
	seqFrame, _ := json.Marshal(map[string]any{"type": "seq", "seq": t.lastSeq, "app": t.app.Name, "io": t.app.IO})
	r.send(outFrame{text: true, data: seqFrame})
	if !r.fill(upTo) {
		return
	}

	// One reader goroutine: stdin and resize.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer cancel()
		s.readLoop(ctx, conn, t.id, t.app, r.send)
	}()
	defer func() { <-readerDone }()
	defer cancel()
	s.m.ioClients.Inc()
	defer s.m.ioClients.Dec()
	release := s.presence.Acquire(t.id)
	defer release()
	if r.run() {
		s.drainAndClose(ctx, r.sent, conn)
	}
}

// closeWith ends the socket with a close frame (code, reason).
func closeWith(conn *websocket.Conn, code int, reason string) {
	msg := websocket.FormatCloseMessage(code, reason)
	_ = conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
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
