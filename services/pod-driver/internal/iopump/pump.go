// Package iopump moves a workload's output into its app channel's io log.
// Writers hand bytes over without waiting for the bus; one goroutine per
// channel appends them, coalescing everything that arrived while the
// previous append was in flight into chunks of at most 64 KiB (7.6), so a
// fast producer costs one bus round trip per 64 KiB rather than per read.
// While output streams, a chunk not yet full lingers a moment for more
// bytes (see linger): an entry's cost on the bus is mostly per entry, not
// per byte.
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
	entries [][]byte // waiting entries, each [tag][payload ≤ MaxChunk]
	bytes   int      // payload bytes in entries
	free    [][]byte // entry buffers to reuse
	closed  bool
	done    chan struct{}
	waited  bool // the linger of the batch being gathered is over
}

// maxFree bounds the entry buffers kept for reuse (each 64 KiB + 1).
const maxFree = 16

// While output streams — the previous append ended less than streamGap
// ago — a batch smaller than one full chunk waits up to linger for more
// bytes before it is appended. A write after a pause (an echoed
// keystroke, a log line) is appended at once.
const (
	linger    = 2 * time.Millisecond
	streamGap = 10 * time.Millisecond
)

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

// Write queues b with its stream tag. It copies b straight into the entry
// that will be published (the tag byte, then up to 64 KiB of payload), so
// nothing is copied again between here and the bus, and returns once
// queued; it blocks only while more than the limit is waiting for the bus.
func (p *Pump) Write(tag byte, b []byte) {
	if len(b) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.bytes > p.limit && !p.closed {
		p.cond.Wait()
	}
	if p.closed {
		return
	}
	for len(b) > 0 {
		n := len(p.entries)
		if n == 0 || p.entries[n-1][0] != tag || len(p.entries[n-1]) == 1+MaxChunk {
			p.entries = append(p.entries, append(p.buffer(), tag))
			n++
		}
		e := p.entries[n-1]
		k := min(len(b), 1+MaxChunk-len(e))
		p.entries[n-1] = append(e, b[:k]...)
		p.bytes += k
		b = b[k:]
	}
	p.cond.Broadcast()
}

// buffer returns an empty entry buffer of capacity 1+MaxChunk (mu held).
func (p *Pump) buffer() []byte {
	if n := len(p.free); n > 0 {
		b := p.free[n-1]
		p.free = p.free[:n-1]
		return b[:0]
	}
	return make([]byte, 0, 1+MaxChunk)
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
	var batch [][]byte
	var lastEnd time.Time
	for {
		p.mu.Lock()
		for len(p.entries) == 0 && !p.closed {
			p.cond.Wait()
		}
		if len(p.entries) == 0 && p.closed {
			p.mu.Unlock()
			return
		}
		if p.bytes < MaxChunk && !p.closed && time.Since(lastEnd) < streamGap {
			p.waited = false
			t := time.AfterFunc(linger, func() {
				p.mu.Lock()
				p.waited = true
				p.cond.Broadcast()
				p.mu.Unlock()
			})
			for p.bytes < MaxChunk && !p.closed && !p.waited {
				p.cond.Wait()
			}
			t.Stop()
		}
		// Take every waiting entry: writers start new ones meanwhile.
		batch, p.entries = p.entries, batch[:0]
		p.bytes = 0
		p.cond.Broadcast()
		p.mu.Unlock()

		for _, e := range batch {
			p.append(e)
		}
		lastEnd = time.Now()
		p.mu.Lock()
		for i, e := range batch {
			if len(p.free) < maxFree {
				p.free = append(p.free, e)
			}
			batch[i] = nil
		}
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
