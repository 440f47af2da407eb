package server

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/telorunner/telorunner/pkg/bus"
)

// sseHijack lets an SSE stream leave net/http after its replay (tests turn
// it off to exercise the net/http path).
var sseHijack = true

// An SSE client idle between events should cost little: net/http keeps two
// goroutines and about 10 KiB of bufio buffers per connection for as long
// as the handler runs. So once the headers and the replay are written, an
// HTTP/1.1 stream takes its connection from net/http (http.Hijacker) and
// the handler returns: the connection's goroutines end and its buffers are
// dropped. From then on the edge's hub writes each live entry to the
// connection itself, one non-blocking write per client, encoding the frame
// once for all of them (sseConn, mode sseDirect); a shared timer writes the
// heartbeats, and one shared epoll set (sseWatch) reports clients that
// hang up. A client whose socket cannot take a whole frame gets the rest
// queued and a goroutine of its own (mode ssePumping) only while it is
// behind: it writes the rest, then drains its hub follower exactly as the
// net/http path does (bounded queue, holes and lag refilled from the log),
// and hands the client back to the hub once it has caught up.
//
// The response stays byte-for-byte what net/http would send: net/http had
// already chosen chunked encoding (the headers were flushed with no length),
// so every write is one chunk, and the stream ends with the last chunk.
// Writers that cannot be hijacked (HTTP/2, TLS, recorders) keep the
// net/http path.

type sseMode uint8

const (
	ssePumping sseMode = iota // a goroutine of its own writes (the handler's or a backlog's)
	sseDirect                 // the hub writes each entry as it arrives
	sseClosed
)

// sseConn is a hijacked SSE client.
type sseConn struct {
	s       *Server
	h       *hub
	f       *follower
	conn    net.Conn
	raw     syscall.RawConn
	fd      int
	subject string
	st      *sseStream
	cw      *chunkWriter

	unfollow, release func()
	once              sync.Once

	// Under h.mu.
	stopAfter  func() bool // stops the shutdown's end; nil until the stream is whole
	mode       sseMode
	pending    []byte // bytes of a frame the socket did not take yet
	pendingEnd bool   // pending ends the stream
	// reusable: the connection may serve another request once its stream
	// ends; ended: the stream's last chunk was written whole (h.mu).
	reusable, ended bool
}

// lastChunk ends a chunked response body.
var lastChunk = []byte("0\r\n\r\n")

// heartbeatChunk is the heartbeat comment (6.3) as one chunk.
var heartbeatChunk = appendChunk(nil, []byte(": heartbeat\n\n"))

// appendChunk appends p as one chunk of a chunked body.
func appendChunk(b, p []byte) []byte {
	b = strconv.AppendUint(b, uint64(len(p)), 16)
	b = append(b, "\r\n"...)
	b = append(b, p...)
	return append(b, "\r\n"...)
}

// chunkWriter writes each Write as one chunk, blocking (the pump's writes).
type chunkWriter struct {
	c   net.Conn
	buf []byte
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	w.buf = appendChunk(w.buf[:0], p)
	if _, err := w.c.Write(w.buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *chunkWriter) Flush() {}

// hijackSSE takes the stream's connection from net/http once its headers
// and replay are written, when it can (HTTP/1.1 over plain TCP). It owns
// unfollow and release (and the sseClients count) when it returns true;
// the handler then returns at once.
func (s *Server) hijackSSE(c *gin.Context, f *follower, st *sseStream, subject string, unfollow, release func()) bool {
	r := c.Request
	if !sseHijack || r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.TLS != nil || !sseWatchSupported {
		return false
	}
	// gin refuses to hijack once body bytes were written (the replay), so
	// net/http's writer is hijacked itself. Everything written so far is
	// flushed first: net/http's Hijack flushes only its chunk writer's
	// buffer, not the response's own.
	u, ok := c.Writer.(interface{ Unwrap() http.ResponseWriter })
	if !ok {
		return false
	}
	hj, ok := u.Unwrap().(http.Hijacker)
	if !ok {
		return false
	}
	st.w.Flush()
	conn, rw, err := hj.Hijack()
	if err != nil {
		return false
	}
	// Both buffers are dropped. The read buffer holds nothing unless the
	// client pipelined a request behind this one: that connection is then
	// closed at the end rather than served again.
	d := &sseConn{s: s, h: s.hub, f: f, conn: conn, subject: subject, unfollow: unfollow, release: release,
		reusable: s.reuse != nil && rw.Reader.Buffered() == 0}
	s.wg.Add(1)
	if hook := s.hijackHook.Load(); hook != nil {
		(*hook)(d) // tests: the edge stops here
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		d.end() // not a socket: the client resumes from its last id
		return true
	}
	raw, err := sc.SyscallConn()
	if err == nil {
		err = raw.Control(func(fd uintptr) { d.fd = int(fd) })
	}
	if err != nil {
		d.end()
		return true
	}
	d.raw = raw
	_ = conn.SetDeadline(time.Time{})
	d.cw = &chunkWriter{c: conn}
	st.w = d.cw
	d.st = st
	if err := s.sseWatch().add(d); err != nil {
		s.log.Warn("watch a hijacked SSE connection; the stream ends, the client resumes from its last id", "err", err)
		d.end()
		return true
	}
	s.hub.mu.Lock()
	f.d = d
	// The server's shutdown ends the stream from here on, once it is whole
	// (a stream already ended is left alone): end reads what it frees
	// under the same lock.
	if d.mode != sseClosed {
		d.stopAfter = context.AfterFunc(s.ctx, d.end)
	}
	s.hub.mu.Unlock()
	// Write what arrived since the replay, then hand the client to the hub.
	d.pump()
	return true
}

// pump writes what the hub could not (pending), then the follower's queue
// and any hole, until the client has caught up; then the hub writes to it
// again (sseDirect) and the goroutine ends.
func (d *sseConn) pump() {
	s, f, st := d.s, d.f, d.st
	d.h.mu.Lock()
	pending, end := d.pending, d.pendingEnd
	d.pending, d.pendingEnd = nil, false
	d.h.mu.Unlock()
	if len(pending) > 0 {
		if _, err := d.conn.Write(pending); err != nil {
			d.end()
			return
		}
	}
	if end {
		d.endClean()
		return
	}
	for {
		done, err := s.drain(s.ctx, st, f, d.subject)
		if done || err != nil {
			if done && err == nil {
				if _, werr := d.conn.Write(lastChunk); werr == nil {
					d.endClean()
					return
				}
			}
			d.end()
			return
		}
		d.h.mu.Lock()
		if d.mode == sseClosed {
			d.h.mu.Unlock()
			return
		}
		if f.waiting() == 0 && !f.lagged.Load() {
			// Caught up: every entry up to the topic's last was written
			// (the hub delivers under h.mu), so the hub writes from here.
			d.setModeLocked(sseDirect)
			st.buf, d.cw.buf = nil, nil
			d.h.mu.Unlock()
			return
		}
		d.h.mu.Unlock()
	}
}

// tryWrite writes what the socket takes now without waiting: n < len(b)
// with a nil error means the socket's buffer is full.
func (d *sseConn) tryWrite(b []byte) (int, error) {
	var n int
	var werr error
	err := d.raw.Write(func(fd uintptr) bool {
		for {
			n, werr = syscall.Write(int(fd), b)
			if werr != syscall.EINTR {
				return true
			}
		}
	})
	if n < 0 {
		n = 0
	}
	if err != nil {
		return n, err
	}
	if werr == syscall.EAGAIN {
		return n, nil
	}
	return n, werr
}

// sseBatch is live entries encoded once for every direct client of a
// topic: each entry's frame is one chunk of buf.
type sseBatch struct {
	buf     []byte
	offs    []int       // where each entry's chunk starts in buf
	entries []bus.Entry // pushed to a client that leaves direct delivery
	end     bool        // the last entry is terminal; buf ends with the last chunk
	frame   []byte      // encoding scratch
}

func (b *sseBatch) add(e bus.Entry) {
	if b.end {
		return // the streams end at the terminal entry
	}
	b.frame = appendFrame(b.frame[:0], e)
	b.offs = append(b.offs, len(b.buf))
	b.buf = appendChunk(b.buf, b.frame)
	b.entries = append(b.entries, e)
	if e.Header.Get(bus.HeaderTerminal) != "" {
		b.end = true
		b.buf = append(b.buf, lastChunk...)
	}
}

func (b *sseBatch) empty() bool { return len(b.entries) == 0 }

func (b *sseBatch) last() uint64 { return b.entries[len(b.entries)-1].Seq }

// reset empties b for reuse, dropping large arrays.
func (b *sseBatch) reset() {
	if cap(b.buf) > 256<<10 {
		b.buf, b.frame = nil, nil
	}
	clear(b.entries)
	b.buf, b.offs, b.entries, b.end = b.buf[:0], b.offs[:0], b.entries[:0], false
	if cap(b.entries) > 1024 {
		b.offs, b.entries = nil, nil
	}
}

// setModeLocked moves d to mode m (h.mu held), keeping the topic's count
// of direct clients and starting its writer when the first one arrives.
func (d *sseConn) setModeLocked(m sseMode) {
	t := d.f.t
	if d.mode == sseDirect {
		if t.ndirect--; t.ndirect == 0 && t.writerOn {
			t.signalWriter() // it ends
		}
	}
	d.mode = m
	if m != sseDirect {
		return
	}
	t.ndirect++
	if !t.writerOn {
		t.writerOn = true
		if t.pend == nil {
			t.pend, t.wake = &sseBatch{}, make(chan struct{}, 1)
		}
		go t.h.write(t)
	}
}

func (t *topic) signalWriter() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// leaveLocked takes d off direct delivery (h.mu held): entries after
// written that it has not been given (in batches not yet written) go to its
// follower's queue, and a goroutine of its own writes them (pump).
func (d *sseConn) leaveLocked(rest []bus.Entry) {
	d.setModeLocked(ssePumping)
	for _, e := range rest {
		if e.Seq > d.st.last {
			d.pushLocked(e)
		}
	}
	for _, e := range d.f.t.pend.entries {
		if e.Seq > d.st.last {
			d.pushLocked(e)
		}
	}
	go d.pump()
}

// pushLocked queues e for the pump as deliver would: a full queue marks
// the client lagged (it is refilled from the log).
func (d *sseConn) pushLocked(e bus.Entry) {
	if d.f.full(int64(len(e.Data))) {
		d.f.lagged.Store(true)
		return
	}
	d.f.push(e)
}

// sseWrite is the outcome of one batch's write to one client.
type sseWrite struct {
	d     *sseConn
	from  int   // index of the first entry the client lacked
	n     int   // bytes written
	total int   // bytes to write
	err   error // the connection failed
	hole  bool  // the client lacks entries before the batch: repair
	beatN int   // heartbeat bytes written (-1: none tried)
}

// wrote reports whether the batch had entries w's client lacked.
func (w *sseWrite) wrote(b *sseBatch) bool { return !b.empty() && w.from < len(b.entries) }

// write is the topic's writer: while the topic has direct clients it takes
// the entries waiting (however many arrived while it wrote the last
// batch) and writes them to each direct client with one non-blocking write
// (the clients split between two goroutines). A client whose socket takes
// less leaves direct delivery with the rest queued (leaveLocked).
func (h *hub) write(t *topic) {
	spare := &sseBatch{}
	var subs []*sseConn
	var res []sseWrite
	for {
		h.mu.Lock()
		for t.ndirect > 0 && t.pend.empty() && !t.beatDue {
			h.mu.Unlock()
			<-t.wake
			h.mu.Lock()
		}
		if t.ndirect == 0 {
			t.writerOn = false
			t.pend.reset()
			h.mu.Unlock()
			return
		}
		b := t.pend
		t.pend, spare = spare, nil
		beat := t.beatDue
		t.beatDue = false
		subs = subs[:0]
		for f := range t.clients {
			if f.d != nil && f.d.mode == sseDirect {
				subs = append(subs, f.d)
			}
		}
		h.mu.Unlock()

		res = res[:0]
		for _, d := range subs {
			res = append(res, sseWrite{d: d})
		}
		writeAll(res, func(w *sseWrite) {
			w.beatN = -1
			if !b.empty() {
				w.batch(b)
			}
			if w.err != nil || w.hole || w.n < w.total || (b.end && w.wrote(b)) {
				return
			}
			if beat {
				w.beatN, w.err = w.d.tryWrite(heartbeatChunk)
			}
		})

		h.mu.Lock()
		for i := range res {
			w := &res[i]
			d := w.d
			if d.mode != sseDirect {
				continue // ended meanwhile
			}
			if w.err != nil {
				d.setModeLocked(sseClosed)
				go d.end()
				continue
			}
			if w.hole {
				d.leaveLocked(b.entries[w.from:])
				continue
			}
			wrote := w.wrote(b)
			if wrote {
				d.st.last = b.last() // the rest of a partial write is queued below
			}
			var rest []byte
			switch {
			case w.n < w.total:
				rest = append([]byte(nil), b.buf[b.offs[w.from]+w.n:]...)
				if beat && !b.end {
					rest = append(rest, heartbeatChunk...)
				}
				d.pendingEnd = b.end
			case w.beatN >= 0 && w.beatN < len(heartbeatChunk):
				rest = append([]byte(nil), heartbeatChunk[w.beatN:]...)
			case wrote && b.end:
				d.setModeLocked(sseClosed)
				d.ended = true
				go d.end()
				continue
			}
			if rest != nil {
				d.pending = rest
				d.leaveLocked(nil)
			}
		}
		clear(subs)
		b.reset()
		spare = b
		h.mu.Unlock()
	}
}

// batch writes the entries of b that w's client lacks.
func (w *sseWrite) batch(b *sseBatch) {
	last := w.d.st.last
	i := 0
	for i < len(b.entries) && b.entries[i].Seq <= last {
		i++
	}
	w.from = i
	if i == len(b.entries) {
		return // it has them all (it caught up from the log meanwhile)
	}
	if b.entries[i].Seq > last+1 {
		w.hole = true
		return
	}
	p := b.buf[b.offs[i]:]
	w.total = len(p)
	w.n, w.err = w.d.tryWrite(p)
}

// writeAll runs fn for every write, on two goroutines when there are many
// (a loopback write costs ~10 µs of system time: 1,000 clients are 10 ms).
func writeAll(res []sseWrite, fn func(*sseWrite)) {
	const split = 64
	if len(res) < split {
		for i := range res {
			fn(&res[i])
		}
		return
	}
	half := len(res) / 2
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := half; i < len(res); i++ {
			fn(&res[i])
		}
	}()
	for i := range res[:half] {
		fn(&res[i])
	}
	wg.Wait()
}

// endClean ends a stream whose last chunk was written whole.
func (d *sseConn) endClean() {
	d.h.mu.Lock()
	d.ended = true
	d.h.mu.Unlock()
	d.end()
}

// end ends the stream and frees what it holds; it runs once. A stream
// that ended cleanly gives its connection back to the HTTP server for the
// client's next request (keep-alive); any other is closed.
func (d *sseConn) end() {
	d.once.Do(func() {
		d.h.mu.Lock()
		d.setModeLocked(sseClosed)
		reuse := d.ended && d.reusable && d.s.ctx.Err() == nil
		stopAfter := d.stopAfter // nil until the stream was whole
		d.h.mu.Unlock()
		if d.raw != nil {
			d.s.sseWatch().remove(d)
		}
		if !reuse || !d.s.reuse(d.conn) {
			_ = d.conn.Close()
		}
		d.unfollow()
		d.release()
		if stopAfter != nil {
			stopAfter()
		}
		d.s.m.sseClients.Dec()
		d.s.wg.Done()
	})
}

// beat has each topic's writer write the heartbeat to its direct clients
// (the pumping ones are written to anyway).
func (h *hub) beat() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.topics {
		if t.ndirect > 0 {
			t.beatDue = true
			t.signalWriter()
		}
	}
}

// beats writes the heartbeats of hijacked streams until ctx ends.
func (s *Server) beats() {
	defer s.wg.Done()
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.hub.beat()
		}
	}
}
