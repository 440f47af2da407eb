package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reads start where the reader is, never at the window's start: the stream
// position of a Runner-Seq is found by a search over direct gets
// (next-by-subject gets are ordered by stream sequence, and Runner-Seq grows
// with it), and the entries after it are fetched in batches of direct gets
// bounded in bytes. A resume or a lag repair therefore costs a few round
// trips plus what is missing, whatever the retained window holds.

// readBatchBytes bounds one batch of a range read (and the client buffer
// of a live reader): the memory one read pins, whatever the window holds.
const readBatchBytes = 1 << 20

// readBatchEntries bounds the entries of one batch of a range read.
const readBatchEntries = 256

// batchReplyTimeout bounds the wait for each reply of a batch.
const batchReplyTimeout = 10 * time.Second

// directGets counts direct-get round trips (probes and batches) and
// rangeEntries the entries range reads fetched, for the benchmarks' cost
// figures.
var directGets, rangeEntries atomic.Uint64

// DirectGets returns how many direct-get round trips this process has made
// to locate and read log entries.
func DirectGets() uint64 { return directGets.Load() }

// RangeEntries returns how many entries this process's range reads
// (ReadRange) fetched from the stream.
func RangeEntries() uint64 { return rangeEntries.Load() }

// Reader replays a subject's retained entries after a position and then
// follows new ones live. It is not safe for concurrent use.
type Reader struct {
	it      jetstream.MessagesContext
	stop    func() bool
	after   uint64
	started bool

	js     jetstream.JetStream
	stream string
	c      jetstream.Consumer
}

// Read opens a reader over subject that yields entries with Runner-Seq
// greater than after: first the retained history from that position (not
// the window's start), then live appends, with no gap or duplicate between
// the two. Close it when done; cancelling ctx also ends it.
func (l *Log) Read(ctx context.Context, subject string, after uint64) (*Reader, error) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if after > 0 {
		var start uint64
		err := Retry(ctx, tailPatience, func(ctx context.Context) (err error) {
			start, err = l.locate(ctx, subject, after)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", subject, err)
		}
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	}
	c, err := l.js.OrderedConsumer(ctx, l.stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	it, err := c.Messages(jetstream.PullMaxBytes(readBatchBytes))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	return &Reader{it: it, stop: context.AfterFunc(ctx, it.Stop), after: after, js: l.js, stream: l.stream, c: c}, nil
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

// Close stops the reader and deletes its consumer on the server. An
// ordered consumer left alone lingers for its inactive threshold (five
// minutes), and a stream takes at most 1,000 consumers by default: past
// 1,000 reads in five minutes every further one was refused "maximum
// consumers limit reached" (issue 20's benchmark found it at 10,000
// sessions). A failed delete leaves the consumer to its threshold.
func (r *Reader) Close() {
	r.stop()
	r.it.Stop()
	deleteConsumer(r.js, r.stream, r.c)
}

// deleteConsumer deletes an ordered consumer this process is done with
// (after its iterator or consume context stopped); best effort, bounded
// by two seconds.
func deleteConsumer(js jetstream.JetStream, stream string, c jetstream.Consumer) {
	if c == nil {
		return
	}
	info := c.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = js.DeleteConsumer(ctx, stream, info.Name)
}

// ReadRange calls fn, in order, for the retained entries of subject with
// after < Runner-Seq <= upTo, and returns once it has passed upTo or the
// subject has no more entries. gap is true on the first entry when entries
// after `after` were evicted from the window. It reads from the position of
// after+1 (found by search), in batches of at most 1 MiB, so its cost is
// the missing entries plus a few round trips, and its memory one batch.
// An error from fn ends the read and is returned.
func (l *Log) ReadRange(ctx context.Context, subject string, after, upTo uint64, fn func(e Entry, gap bool) error) error {
	if upTo <= after {
		return nil
	}
	// A bus that does not answer for a moment (a stream electing its
	// leader) is waited for, as Tail does; direct gets are answered by any
	// replica.
	// From the start (a new client) the first batch finds the subject's
	// first entry itself: no search (two direct gets fewer per connect).
	pos := uint64(1)
	if after > 0 {
		err := Retry(ctx, tailPatience, func(ctx context.Context) (err error) {
			pos, err = l.locate(ctx, subject, after)
			return err
		})
		if err != nil {
			return fmt.Errorf("read %s: %w", subject, err)
		}
	}
	first := true
	last := after
	for last < upTo {
		n := int(min(upTo-last, readBatchEntries))
		var ferr error
		var got int
		var next uint64
		fetch := func(e Entry) bool {
			if e.Seq <= last {
				return true
			}
			if e.Seq > upTo {
				last = upTo
				return false
			}
			gap := first && e.Seq > after+1
			first = false
			last = e.Seq
			if ferr = fn(e, gap); ferr != nil {
				return false
			}
			return true
		}
		// A retried batch starts again at pos: entries already passed on
		// are skipped (Seq <= last).
		err := Retry(ctx, tailPatience, func(context.Context) (err error) {
			got, next, err = l.batch(ctx, subject, pos, n, fetch)
			return err
		})
		if ferr != nil {
			return ferr
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", subject, err)
		}
		if got == 0 {
			return nil // the subject ends before upTo
		}
		pos = next
	}
	return nil
}

// locate returns the stream sequence from which subject's entries with
// Runner-Seq > after start (the next stream sequence after the subject's
// tail when there are none yet). It reads the tail and the oldest entry,
// then narrows the stream range by interpolation, alternating with
// bisection so it never takes more than about twice log2(range) probes; one
// direct get per probe.
func (l *Log) locate(ctx context.Context, subject string, after uint64) (uint64, error) {
	tail, ok, err := l.getLast(ctx, subject)
	if err != nil || !ok {
		return 1, err // empty subject: nothing to skip
	}
	switch {
	case tail.Seq <= after:
		return tail.StreamSeq + 1, nil
	case tail.Seq == after+1:
		return tail.StreamSeq, nil
	}
	first, ok, err := l.getNext(ctx, subject, 1)
	if err != nil {
		return 0, err
	}
	if !ok {
		return tail.StreamSeq + 1, nil // purged meanwhile
	}
	if first.Seq > after {
		return first.StreamSeq, nil // evicted up to here: a gap
	}
	if first.Seq == after {
		lo := first.StreamSeq + 1
		e, ok, err := l.getNext(ctx, subject, lo)
		if err != nil || !ok {
			return lo, err
		}
		return e.StreamSeq, nil
	}
	// The answer is cand, or an entry in the unsearched range [lo, hi);
	// [hi, cand) holds no entry of subject. loSeq is the Runner-Seq of the
	// subject's last entry below lo.
	lo, loSeq := first.StreamSeq+1, first.Seq
	hi, cand, candSeq := tail.StreamSeq, tail.StreamSeq, tail.Seq
	for bisect := false; lo < hi; bisect = !bisect {
		mid := lo + (hi-lo)/2
		if !bisect && candSeq > loSeq {
			// Interpolate: the subject's entries are spread over the range.
			mid = lo + (cand-lo)*(after-loSeq)/(candSeq-loSeq)
			mid = min(max(mid, lo), hi-1)
		}
		e, ok, err := l.getNext(ctx, subject, mid)
		if err != nil {
			return 0, err
		}
		switch {
		case !ok || e.StreamSeq >= hi:
			hi = mid // nothing in [mid, hi)
		case e.Seq > after:
			hi, cand, candSeq = e.StreamSeq, e.StreamSeq, e.Seq
			if e.Seq == after+1 {
				return cand, nil
			}
		default:
			lo, loSeq = e.StreamSeq+1, e.Seq
			if e.Seq == after {
				// The next entry of subject is the one sought.
				n, ok, err := l.getNext(ctx, subject, lo)
				if err != nil {
					return 0, err
				}
				if ok {
					return n.StreamSeq, nil
				}
				return cand, nil
			}
		}
	}
	return cand, nil
}

// directRequest is the body of a direct get ($JS.API.DIRECT.GET.<stream>).
type directRequest struct {
	Seq      uint64 `json:"seq,omitempty"`
	NextFor  string `json:"next_by_subj,omitempty"`
	LastFor  string `json:"last_by_subj,omitempty"`
	Batch    int    `json:"batch,omitempty"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

func (l *Log) directSubject() string { return "$JS.API.DIRECT.GET." + l.stream }

// getLast reads subject's newest entry.
func (l *Log) getLast(ctx context.Context, subject string) (Entry, bool, error) {
	return l.get(ctx, directRequest{LastFor: subject})
}

// getNext reads subject's first entry at or after stream sequence seq.
func (l *Log) getNext(ctx context.Context, subject string, seq uint64) (Entry, bool, error) {
	return l.get(ctx, directRequest{Seq: max(seq, 1), NextFor: subject})
}

func (l *Log) get(ctx context.Context, req directRequest) (Entry, bool, error) {
	body, _ := json.Marshal(req)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	directGets.Add(1)
	m, err := l.js.Conn().RequestWithContext(ctx, l.directSubject(), body)
	if err != nil {
		return Entry{}, false, err
	}
	return directEntry(m)
}

// directEntry decodes one direct-get reply; found is false for "not found"
// (and for a batch's end-of-batch marker).
func directEntry(m *nats.Msg) (Entry, bool, error) {
	if st := m.Header.Get("Status"); st != "" {
		switch st {
		case "404", "204":
			return Entry{}, false, nil
		default:
			return Entry{}, false, fmt.Errorf("direct get: %s %s", st, m.Header.Get("Description"))
		}
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return Entry{}, false, fmt.Errorf("direct get: bad %s header", jetstream.SequenceHeader)
	}
	return Entry{Seq: parseSeq(m.Header), StreamSeq: seq, Data: m.Data, Header: m.Header}, true, nil
}

// batch reads up to n entries of subject from stream sequence from with one
// direct-get request (at most readBatchBytes of them), calling fn for each
// until it returns false. It returns how many entries arrived and the
// stream sequence after the last one.
func (l *Log) batch(ctx context.Context, subject string, from uint64, n int, fn func(Entry) bool) (got int, next uint64, err error) {
	nc := l.js.Conn()
	inbox := nc.NewInbox()
	// A channel of the batch's size (its entries and the end-of-batch
	// status), not SubscribeSync's: that one allocates and clears 64 Ki
	// slots (512 KiB) per subscription, which dominated the CPU and the
	// garbage of 1,000 SSE clients replaying at once. The server sends at
	// most n entries and one status, so the channel never drops.
	replies := make(chan *nats.Msg, n+2)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return 0, from, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := json.Marshal(directRequest{Seq: max(from, 1), NextFor: subject, Batch: n, MaxBytes: readBatchBytes})
	directGets.Add(1)
	if err := nc.PublishRequest(l.directSubject(), inbox, body); err != nil {
		return 0, from, err
	}
	next = from
	more := true
	wait := time.NewTimer(batchReplyTimeout)
	defer wait.Stop()
	for {
		// Each reply is waited for on its own (fn may take its time with
		// the previous one: a slow client), up to batchReplyTimeout: a
		// loaded server that is slow to answer is not asked again.
		if err := ctx.Err(); err != nil {
			return got, next, err
		}
		wait.Reset(batchReplyTimeout)
		var m *nats.Msg
		select {
		case m = <-replies:
		case <-wait.C:
			return got, next, nats.ErrTimeout
		case <-ctx.Done():
			return got, next, ctx.Err()
		}
		e, found, err := directEntry(m)
		if err != nil {
			return got, next, err
		}
		if !found {
			return got, next, nil // end of batch, or nothing at or after from
		}
		got++
		rangeEntries.Add(1)
		next = e.StreamSeq + 1
		if more {
			more = fn(e)
		}
		if !more {
			// The rest of the batch is still on its way to the inbox;
			// unsubscribing drops it.
			return got, next, nil
		}
	}
}

// Follow calls fn, in order and on one goroutine, for every entry of
// subject appended after the subject's current tail, whose Runner-Seq it
// returns. Only entries the stream stored reach fn (it reads the stream
// through an ordered consumer, not the subject's core traffic): a publish
// JetStream refused — a writer's stale expected-last-sequence, a duplicate —
// is never seen. Call stop once to end it; it also ends with ctx.
func (l *Log) Follow(ctx context.Context, subject string, fn func(Entry)) (tail uint64, stop func(), err error) {
	var last Entry
	var ok bool
	err = Retry(ctx, tailPatience, func(ctx context.Context) (err error) {
		last, ok, err = l.getLast(ctx, subject)
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("follow %s: %w", subject, err)
	}
	start := uint64(1)
	if ok {
		tail, start = last.Seq, last.StreamSeq+1
	}
	// The consumer is created by the stream's leader: wait for one while a
	// cluster elects it.
	var cc jetstream.ConsumeContext
	var c jetstream.Consumer
	err = Retry(ctx, tailPatience, func(context.Context) (err error) {
		c, err = l.js.OrderedConsumer(ctx, l.stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{subject},
			DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:    start,
		})
		if err != nil {
			return err
		}
		cc, err = c.Consume(func(m jetstream.Msg) {
			md, err := m.Metadata()
			if err != nil {
				return
			}
			fn(Entry{Seq: parseSeq(m.Headers()), StreamSeq: md.Sequence.Stream, Data: m.Data(), Header: m.Headers()})
		}, jetstream.PullMaxBytes(readBatchBytes))
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("follow %s: %w", subject, err)
	}
	unhook := context.AfterFunc(ctx, cc.Stop)
	// Stopping also deletes the consumer (see Reader.Close).
	return tail, func() { unhook(); cc.Stop(); deleteConsumer(l.js, l.stream, c) }, nil
}
