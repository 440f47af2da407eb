package proc

import (
	"context"
	"errors"
	"io"
	"sync"
)

// ErrNotRunning is returned by Attach when the process already ended.
var ErrNotRunning = errors.New("container is not running")

// ErrSlowReader is returned by Attach when the session fell too far behind
// the process's output and was cut off.
var ErrSlowReader = errors.New("attach session fell behind the container's output")

// Attach connects one session to the process until the process ends and
// its output was delivered (nil), ctx is done (nil), or writing to the
// session fails. in, when not nil and the process keeps stdin open, feeds
// stdin; out receives stdout (the terminal with a tty); errw receives
// stderr (never with a tty); resize resizes the terminal. Output produced
// before Attach is not replayed. Any number of sessions may be attached at
// once; each sees all output from its start.
//
// When Attach returns it unblocks in by calling its Reset or Close method,
// if it has one.
func (p *Process) Attach(ctx context.Context, in io.Reader, out, errw io.Writer, resize <-chan Size) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	type stream struct {
		f   *fanout
		sub *subscriber
		w   io.Writer
	}
	var streams []stream
	if out != nil {
		streams = append(streams, stream{f: p.stdout, w: out})
	}
	if errw != nil && p.stderr != nil {
		streams = append(streams, stream{f: p.stderr, w: errw})
	}
	for i := range streams {
		streams[i].sub = streams[i].f.subscribe()
		if streams[i].sub == nil {
			for _, s := range streams[:i] {
				s.f.unsubscribe(s.sub)
			}
			return ErrNotRunning
		}
	}
	defer func() {
		for _, s := range streams {
			s.f.unsubscribe(s.sub)
		}
	}()

	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		result  error
	)
	setErr := func(err error) {
		errOnce.Do(func() { result = err })
		cancel()
	}
	var forwarders sync.WaitGroup
	for _, s := range streams {
		forwarders.Go(func() {
			for b := range s.sub.ch {
				if _, err := s.w.Write(b); err != nil {
					setErr(err)
					s.f.unsubscribe(s.sub)
					for range s.sub.ch {
					}
					return
				}
			}
			if s.f.isSlow(s.sub) {
				setErr(ErrSlowReader)
			}
		})
	}
	if in != nil && p.stdin != nil {
		wg.Go(func() { p.feed(ctx, in) })
	}
	if resize != nil && p.tty != nil {
		wg.Go(func() {
			for {
				select {
				case sz, ok := <-resize:
					if !ok {
						return
					}
					_ = setSize(p.tty, sz)
				case <-ctx.Done():
					return
				}
			}
		})
	}

	outputDone := make(chan struct{})
	go func() { forwarders.Wait(); close(outputDone) }()
	if len(streams) == 0 {
		select {
		case <-p.done:
		case <-ctx.Done():
		}
	} else {
		select {
		case <-outputDone:
		case <-ctx.Done():
		}
	}
	cancel()
	for _, s := range streams {
		s.f.unsubscribe(s.sub)
	}
	<-outputDone
	unblock(in)
	wg.Wait()
	return result
}

// feed copies one session's input to the stdin writer.
func (p *Process) feed(ctx context.Context, in io.Reader) {
	for {
		buf := make([]byte, 32*1024)
		n, err := in.Read(buf)
		if n > 0 {
			select {
			case p.stdin <- buf[:n]:
			case <-ctx.Done():
				return
			case <-p.stdinDone:
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && p.spec.StdinOnce {
				p.endInputOnce(ctx)
			}
			return
		}
	}
}

// endInputOnce closes stdin after the first session's input ended.
func (p *Process) endInputOnce(ctx context.Context) {
	p.inputMu.Lock()
	first := !p.inputSeen
	p.inputSeen = true
	p.inputMu.Unlock()
	if !first {
		return
	}
	select {
	case p.stdin <- nil:
	case <-ctx.Done():
	case <-p.stdinDone:
	}
}

// unblock ends a pending Read on in: SPDY streams need Reset, WebSocket
// channels and pipes end on Close.
func unblock(in io.Reader) {
	switch r := in.(type) {
	case interface{ Reset() error }:
		_ = r.Reset()
	case io.Closer:
		_ = r.Close()
	}
}
