// Package iopump moves a workload's output into its app channel's io log.
// Writers hand bytes over without waiting for the bus; one goroutine per
// channel appends them, coalescing everything that arrived while the
// previous append was in flight into chunks of at most 64 KiB (7.6), so a
// fast producer costs one bus round trip per 64 KiB rather than per read.
package iopump

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/telorunner/telorunner/pkg/bus"
)

// MaxChunk is the largest payload of one io entry (contract 7.6).
const MaxChunk = 64 << 10

// Pump is one app channel's writer. Safe for concurrent use.
type Pump struct {
	log     *bus.Log
	subject string
	logger  *slog.Logger
	limit   int // pending bytes above which Write blocks (backpressure)

	mu      sync.Mutex
	cond    *sync.Cond
	pending []byte // tag-prefixed segments, see seg
	segs    []seg
	spare   []byte
	closed  bool
	done    chan struct{}
}

type seg struct {
	tag  byte
	n    int // payload bytes in pending
	from int
}

// New starts a pump appending to subject. limit bounds the bytes waiting
// for the bus (default 4 MiB); a writer beyond it waits.
func New(log *bus.Log, subject string, limit int, logger *slog.Logger) *Pump {
	if limit <= 0 {
		limit = 4 << 20
	}
	p := &Pump{log: log, subject: subject, logger: logger, limit: limit, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	go p.run()
	return p
}

// Write queues p with its stream tag. It copies p and returns once queued;
// it blocks only while more than the limit is waiting for the bus.
func (p *Pump) Write(tag byte, b []byte) {
	if len(b) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.pending) > p.limit && !p.closed {
		p.cond.Wait()
	}
	if p.closed {
		return
	}
	if n := len(p.segs); n > 0 && p.segs[n-1].tag == tag {
		p.segs[n-1].n += len(b)
	} else {
		p.segs = append(p.segs, seg{tag: tag, n: len(b), from: len(p.pending)})
	}
	p.pending = append(p.pending, b...)
	p.cond.Broadcast()
}

// Close flushes everything queued, then stops the pump.
func (p *Pump) Close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	<-p.done
}

func (p *Pump) run() {
	defer close(p.done)
	chunk := make([]byte, 0, MaxChunk+1)
	var segs []seg
	for {
		p.mu.Lock()
		for len(p.pending) == 0 && !p.closed {
			p.cond.Wait()
		}
		if len(p.pending) == 0 && p.closed {
			p.mu.Unlock()
			return
		}
		// Swap buffers: writers continue into the spare while we append.
		data := p.pending
		segs = append(segs[:0], p.segs...)
		p.pending, p.spare = p.spare[:0], nil
		p.segs = p.segs[:0]
		p.cond.Broadcast()
		p.mu.Unlock()

		for _, s := range segs {
			payload := data[s.from : s.from+s.n]
			for len(payload) > 0 {
				n := min(len(payload), MaxChunk)
				chunk = append(chunk[:0], s.tag)
				chunk = append(chunk, payload[:n]...)
				p.append(chunk)
				payload = payload[n:]
			}
		}
		p.mu.Lock()
		p.spare = data[:0]
		p.mu.Unlock()
	}
}

// append retries a failed append a few times; bytes are dropped (and
// logged) only when the bus stays unavailable. Every attempt carries the
// chunk's one Nats-Msg-Id, so a retry of a chunk that was stored (its ack
// lost) is de-duplicated, never stored twice.
func (p *Pump) append(chunk []byte) {
	wait := 50 * time.Millisecond
	id := nuid.Next()
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		hdr := nats.Header{}
		hdr.Set(jetstream.MsgIDHeader, id)
		_, err := p.log.Append(ctx, p.subject, chunk, hdr)
		cancel()
		if err == nil {
			return
		}
		if attempt >= 5 {
			p.logger.Error("append io dropped bytes", "subject", p.subject, "bytes", len(chunk)-1, "err", err)
			return
		}
		time.Sleep(wait)
		wait *= 2
	}
}
