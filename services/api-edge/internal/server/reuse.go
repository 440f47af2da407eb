package server

import (
	"errors"
	"net"
	"sync"
)

// ReuseListener is the edge's listener: the connections its listener
// accepts, and those of hijacked SSE streams that ended cleanly, handed
// back (Reuse) so that the HTTP server reads the client's next request on
// them. net/http keeps a connection alive after a response it wrote itself
// (the contract's `connection: keep-alive`); a hijacked stream must do the
// same, or a client that reuses the connection for its next request (Go's
// and browsers' HTTP clients do) finds it closed.
type ReuseListener struct {
	net.Listener
	back      chan net.Conn
	accepted  chan accepted
	done      chan struct{}
	startOnce sync.Once
	closeOnce sync.Once
}

type accepted struct {
	c   net.Conn
	err error
}

// NewReuseListener wraps ln.
func NewReuseListener(ln net.Listener) *ReuseListener {
	return &ReuseListener{Listener: ln, back: make(chan net.Conn), accepted: make(chan accepted), done: make(chan struct{})}
}

// Accept returns the next new or handed-back connection.
func (l *ReuseListener) Accept() (net.Conn, error) {
	l.startOnce.Do(func() { go l.acceptLoop() })
	select {
	case c := <-l.back:
		return c, nil
	case a := <-l.accepted:
		return a.c, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// acceptLoop passes on what the wrapped listener accepts, errors included
// (net/http retries temporary ones), until it is closed.
func (l *ReuseListener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		select {
		case l.accepted <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				_ = c.Close()
			}
			return
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// Reuse hands c back to the server; false (c is then the caller's to
// close) once the listener is closed.
func (l *ReuseListener) Reuse(c net.Conn) bool {
	select {
	case l.back <- c:
		return true
	case <-l.done:
		return false
	}
}

// Close closes the wrapped listener; connections handed back after it are
// refused.
func (l *ReuseListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}
