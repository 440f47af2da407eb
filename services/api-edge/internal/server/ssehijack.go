package server

import (
	"context"
	"net"
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
	stopAfter         func() bool
	once              sync.Once

	// Under h.mu.
	mode       sseMode
	pending    []byte // bytes of a frame the socket did not take yet
	pendingEnd bool   // pending ends the stream
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
	st.w.Flush()
	conn, rw, err := c.Writer.Hijack()
	if err != nil {
		return false
	}
	_ = rw // the read buffer holds nothing an SSE client sends; both buffers are dropped
	d := &sseConn{s: s, h: s.hub, f: f, conn: conn, subject: subject, unfollow: unfollow, release: release}
	s.wg.Add(1)
	d.stopAfter = context.AfterFunc(s.ctx, d.end)
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
		d.end()
		return
	}
	for {
		done, err := s.drain(s.ctx, st, f, d.subject)
		if done || err != nil {
			if done && err == nil {
				_, _ = d.conn.Write(lastChunk)
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
			d.mode = sseDirect
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

// sendLocked writes frame (h.mu held, mode sseDirect): what the socket does
// not take is queued for a goroutine of the client's own; end closes the
// stream once frame is written.
func (d *sseConn) sendLocked(frame []byte, end bool) {
	n, err := d.tryWrite(frame)
	switch {
	case err != nil:
		d.mode = sseClosed
		go d.end()
	case n == len(frame):
		if end {
			d.mode = sseClosed
			go d.end()
		}
	default:
		d.pending = append([]byte(nil), frame[n:]...)
		d.pendingEnd = end
		d.mode = ssePumping
		go d.pump()
	}
}

// deliverLocked passes one live entry to a direct client (h.mu held);
// chunk is e's frame as a chunk (the stream's last chunk too when e is
// terminal), shared by every client of the topic.
func (d *sseConn) deliverLocked(e bus.Entry, chunk []byte, terminal bool) {
	if e.Seq <= d.st.last {
		return
	}
	if e.Seq > d.st.last+1 {
		// A hole (cannot happen while direct, but cheap to handle): the
		// pump fills it from the log.
		d.f.push(e)
		d.mode = ssePumping
		go d.pump()
		return
	}
	d.st.last = e.Seq
	d.sendLocked(chunk, terminal)
}

// end closes the stream and frees what it holds; it runs once.
func (d *sseConn) end() {
	d.once.Do(func() {
		d.h.mu.Lock()
		d.mode = sseClosed
		d.h.mu.Unlock()
		if d.raw != nil {
			d.s.sseWatch().remove(d)
		}
		_ = d.conn.Close()
		d.unfollow()
		d.release()
		d.stopAfter()
		d.s.m.sseClients.Dec()
		d.s.wg.Done()
	})
}

// peerGone reports whether the client hung up (read EOF or an error);
// anything it sent is discarded.
func (d *sseConn) peerGone() bool {
	var buf [512]byte
	for {
		var n int
		var rerr error
		err := d.raw.Read(func(fd uintptr) bool {
			for {
				n, rerr = syscall.Read(int(fd), buf[:])
				if rerr != syscall.EINTR {
					return true
				}
			}
		})
		switch {
		case err != nil:
			return true
		case rerr == syscall.EAGAIN:
			return false
		case rerr != nil || n == 0:
			return true
		}
	}
}

// beat writes the heartbeat to every direct client (the pumping ones are
// written to anyway).
func (h *hub) beat() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.topics {
		for f := range t.clients {
			if d := f.d; d != nil && d.mode == sseDirect {
				d.sendLocked(heartbeatChunk, false)
			}
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
