package bus

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Reader replays a subject's retained entries after a position and then
// follows new ones live. It is not safe for concurrent use.
type Reader struct {
	it      jetstream.MessagesContext
	stop    func() bool
	after   uint64
	started bool
}

// Read opens a reader over subject that yields entries with Runner-Seq
// greater than after: first the retained history, then live appends, with
// no gap or duplicate between the two. Close it when done; cancelling ctx
// also ends it.
func (l *Log) Read(ctx context.Context, subject string, after uint64) (*Reader, error) {
	c, err := l.js.OrderedConsumer(ctx, l.stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	it, err := c.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	return &Reader{it: it, stop: context.AfterFunc(ctx, it.Stop), after: after}, nil
}

// Next blocks until the next entry. gap is true on the first entry returned
// when entries between the requested position and it were evicted from the
// window. Pending is how many more entries the server already holds
// (0 means the reader has caught up with the tail).
func (r *Reader) Next() (e Entry, gap bool, pending uint64, err error) {
	for {
		m, err := r.it.Next()
		if err != nil {
			return Entry{}, false, 0, err
		}
		md, err := m.Metadata()
		if err != nil {
			return Entry{}, false, 0, err
		}
		e := Entry{Seq: parseSeq(m.Headers()), StreamSeq: md.Sequence.Stream, Data: m.Data(), Header: m.Headers()}
		if e.Seq <= r.after {
			continue
		}
		if !r.started {
			r.started = true
			gap = e.Seq > r.after+1
		}
		r.after = e.Seq
		return e, gap, md.NumPending, nil
	}
}

// Close stops the reader and releases its consumer.
func (r *Reader) Close() {
	r.stop()
	r.it.Stop()
}
