package server

import (
	"context"
	"errors"
	"sync"
	"syscall"
)

// sseWatchSupported: the epoll set below exists on Linux only.
const sseWatchSupported = true

// sseWatcher reports hijacked SSE clients that hang up without a goroutine
// each: their sockets are also registered (edge-triggered, for peer
// hang-up only) in one epoll set of its own, waited on by one goroutine;
// net/http's own poller keeps the sockets too. Nothing is read: whatever
// a client sends (its next request, once its stream has ended) stays in
// the socket for the HTTP server the connection goes back to.
type sseWatcher struct {
	ep   int
	wake [2]int // a pipe: a byte on wake[1] ends the wait at shutdown

	mu     sync.Mutex
	conns  map[int]*sseConn
	closed bool // under mu: ep is closed (shutdown); its number may be reused
	err    error
}

// sseWatch starts the server's watcher on first use (and its heartbeats).
func (s *Server) sseWatch() *sseWatcher {
	s.watchOnce.Do(func() {
		w := &sseWatcher{conns: map[int]*sseConn{}}
		s.watch = w
		ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			w.err = err
			return
		}
		w.ep = ep
		if err := syscall.Pipe2(w.wake[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
			w.err = err
			_ = syscall.Close(ep)
			return
		}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, w.wake[0], &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(w.wake[0])}); err != nil {
			w.err = err
			return
		}
		s.wg.Add(2)
		go s.beats()
		go w.run(s)
		context.AfterFunc(s.ctx, func() { _, _ = syscall.Write(w.wake[1], []byte{1}) })
	})
	return s.watch
}

func (w *sseWatcher) add(d *sseConn) error {
	if w.err != nil {
		return w.err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("the edge is shutting down")
	}
	w.conns[d.fd] = d
	ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | 1<<31 /* EPOLLET */, Fd: int32(d.fd)}
	if err := syscall.EpollCtl(w.ep, syscall.EPOLL_CTL_ADD, d.fd, &ev); err != nil {
		delete(w.conns, d.fd)
		return err
	}
	return nil
}

// remove forgets d; call it before closing d's connection (its descriptor
// number is then reused).
func (w *sseWatcher) remove(d *sseConn) {
	if w.err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conns[d.fd] == d && !w.closed {
		delete(w.conns, d.fd)
		_ = syscall.EpollCtl(w.ep, syscall.EPOLL_CTL_DEL, d.fd, nil)
	}
}

func (w *sseWatcher) run(s *Server) {
	defer s.wg.Done()
	defer func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.closed = true
		_ = syscall.Close(w.ep)
		_ = syscall.Close(w.wake[0])
		_ = syscall.Close(w.wake[1])
	}()
	evs := make([]syscall.EpollEvent, 128)
	for {
		n, err := syscall.EpollWait(w.ep, evs, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			s.log.Error("wait for hung-up SSE clients; hung-up clients are now found by their heartbeat write", "err", err)
			return
		}
		for _, ev := range evs[:n] {
			fd := int(ev.Fd)
			if fd == w.wake[0] {
				return
			}
			w.mu.Lock()
			d := w.conns[fd]
			w.mu.Unlock()
			if d == nil {
				continue
			}
			if ev.Events&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
				go d.end()
			}
		}
	}
}
