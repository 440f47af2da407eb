package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Log is an ordered log per subject on one stream: every entry carries a
// contiguous sequence (header Runner-Seq, starting at 1) even when several
// processes append to the same subject, and each subject keeps a bounded
// byte window of history.
//
// Appends use JetStream's expected-last-subject-sequence check: the appender
// names the stream sequence it believes is the subject's tail, and on a
// conflict it reads what the other writers appended and retries. No
// sequencer process exists.
//
// A Log is safe for concurrent use. Appends to one subject from one process
// are serialised; appends to different subjects run in parallel.
type Log struct {
	js     jetstream.JetStream
	stream string
	budget int64
	slack  int64

	mu    sync.Mutex
	tails map[string]*tail

	hmu sync.Mutex
	h   jetstream.Stream // bound once: every operation by name, no stream info per call

	trimFailures atomic.Uint64
}

// NewLog returns a log over stream whose subjects each retain at most
// budget bytes of payload (the newest entry is always kept).
func NewLog(js jetstream.JetStream, stream string, budget int64) *Log {
	return &Log{js: js, stream: stream, budget: budget, slack: budget / 16, tails: make(map[string]*tail)}
}

// handle is the stream's handle, looked up once. Looking it up costs a
// stream-info request, which only the stream's leader answers; a bound
// handle reads by direct get (any replica answers: AllowDirect), so reads
// go on while a cluster elects a new leader.
func (l *Log) handle(ctx context.Context) (jetstream.Stream, error) {
	l.hmu.Lock()
	defer l.hmu.Unlock()
	if l.h != nil {
		return l.h, nil
	}
	h, err := l.js.Stream(ctx, l.stream)
	if err != nil {
		return nil, err
	}
	l.h = h
	return h, nil
}

// Entry is one log entry.
type Entry struct {
	Seq       uint64 // Runner-Seq
	StreamSeq uint64 // JetStream stream sequence
	Data      []byte
	Header    nats.Header
}

type window struct {
	streamSeq uint64
	size      int64
}

// tail is this process's knowledge of one subject's end.
type tail struct {
	mu            sync.Mutex
	loaded        bool
	lastStreamSeq uint64
	lastSeq       uint64
	win           []window // retained entries, oldest first
	bytes         int64
}

func (l *Log) tail(subject string) *tail {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.tails[subject]
	if !ok {
		t = &tail{}
		l.tails[subject] = t
	}
	return t
}

// Forget drops the cached tail of subject (after it was purged).
func (l *Log) Forget(subject string) {
	l.mu.Lock()
	delete(l.tails, subject)
	l.mu.Unlock()
}

// ForgetAll drops the cached tail of every subject pattern matches (a
// subject, or a prefix ending in ".>"): what this process knows of a
// session's end once it will not write there soon. The next Append to such
// a subject reads its tail from the stream again, so forgetting is always
// safe; it costs only that read.
func (l *Log) ForgetAll(pattern string) {
	l.mu.Lock()
	for k := range l.tails {
		if k == pattern || subjectMatches(pattern, k) {
			delete(l.tails, k)
		}
	}
	l.mu.Unlock()
}

// Cached is how many subjects' tails this process holds.
func (l *Log) Cached() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.tails)
}

// Append publishes data as the next entry of subject and returns its
// Runner-Seq. hdr may carry extra headers; it is modified.
//
// An append is idempotent: every publish of one logical entry carries the
// same Nats-Msg-Id (the caller's, when hdr already has one, else a fresh
// one per call), so a publish retried after a lost acknowledgement is
// de-duplicated by JetStream (within the stream's 2-minute duplicate
// window) and reported as the entry it already is; the expected-last-
// subject-sequence check that makes the retry look stale is resolved by
// reading the tail and trying again with the same id. Append gives up
// after a minute without an answer (or when ctx ends). A caller that
// retries a failed Append should pass the same Nats-Msg-Id header, within
// the duplicate window, so the retry cannot store the entry twice.
//
// Once the publish was acknowledged Append succeeds: trimming the window
// afterwards is best effort (a failure is logged, counted by TrimFailures
// and retried by the next append), never an append error, so no caller
// retries an entry that is stored.
func (l *Log) Append(ctx context.Context, subject string, data []byte, hdr nats.Header) (uint64, error) {
	t := l.tail(subject)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.loaded {
		if err := l.catchUp(ctx, subject, t); err != nil {
			return 0, err
		}
		t.loaded = true
	}
	return l.appendLocked(ctx, subject, t, data, hdr)
}

// appendLocked is Append with t locked and loaded.
func (l *Log) appendLocked(ctx context.Context, subject string, t *tail, data []byte, hdr nats.Header) (uint64, error) {
	if hdr == nil {
		hdr = nats.Header{}
	}
	if hdr.Get(jetstream.MsgIDHeader) == "" {
		hdr.Set(jetstream.MsgIDHeader, nuid.Next())
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: hdr}
	wait := 10 * time.Millisecond
	first := time.Now()
	for attempt := 0; ; attempt++ {
		seq := t.lastSeq + 1
		hdr.Set(HeaderSeq, strconv.FormatUint(seq, 10))
		ack, err := l.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(t.lastStreamSeq))
		if err == nil {
			if ack.Duplicate {
				// An earlier publish of this entry landed (its ack was
				// lost): report that entry, and learn the tail.
				return l.landed(ctx, subject, t, ack.Sequence)
			}
			t.lastStreamSeq = ack.Sequence
			t.lastSeq = seq
			t.win = append(t.win, window{streamSeq: ack.Sequence, size: int64(len(data))})
			t.bytes += int64(len(data))
			if err := l.trim(ctx, subject, t); err != nil {
				l.trimFailures.Add(1)
				slog.Warn("trim log window; retried at the next append", "subject", subject, "err", err)
			}
			return seq, nil
		}
		if attempt > 1000 || ctx.Err() != nil {
			return 0, fmt.Errorf("append %s: %w", subject, err)
		}
		var apiErr *jetstream.APIError
		switch {
		case isWrongLastSeq(err):
			// Another writer appended, or our own earlier publish landed.
		case errors.As(err, &apiErr):
			return 0, fmt.Errorf("append %s: %w", subject, err)
		default:
			// No answer (timeout, reconnecting): the entry may or may not
			// be stored. Publish it again under the same id, but only
			// while JetStream still remembers the id.
			if err := retryPause(ctx, first, &wait, err); err != nil {
				return 0, fmt.Errorf("append %s: %w", subject, err)
			}
		}
		if err := l.catchUp(ctx, subject, t); err != nil {
			return 0, err
		}
	}
}

// MaxBatch bounds the entries of one AppendBatch (JetStream's atomic
// batches hold at most 1,000 messages).
const MaxBatch = 256

// AppendBatch appends datas (each with its header in hdrs, which may be nil
// or hold nils) as consecutive entries of subject, in order, and returns
// the Runner-Seq of the first. The entries travel as one JetStream atomic
// batch: one round trip for all of them, stored all or none, the first
// carrying the expected-last-subject-sequence check that fences Append's
// other writers — so a queue of events costs one wait, not one per event.
// Every entry has its own Nats-Msg-Id: a batch retried after a lost answer
// that had landed is recognised, never stored twice.
func (l *Log) AppendBatch(ctx context.Context, subject string, datas [][]byte, hdrs []nats.Header) (uint64, error) {
	if len(datas) == 0 {
		return 0, errors.New("append batch: no entries")
	}
	if len(datas) > MaxBatch {
		return 0, fmt.Errorf("append batch: %d entries, at most %d", len(datas), MaxBatch)
	}
	msgs := make([]*nats.Msg, len(datas))
	for i, d := range datas {
		var h nats.Header
		if i < len(hdrs) && hdrs[i] != nil {
			h = hdrs[i]
		} else {
			h = nats.Header{}
		}
		if h.Get(jetstream.MsgIDHeader) == "" {
			h.Set(jetstream.MsgIDHeader, nuid.Next())
		}
		msgs[i] = &nats.Msg{Subject: subject, Data: d, Header: h}
	}
	if len(msgs) == 1 {
		return l.Append(ctx, subject, msgs[0].Data, msgs[0].Header)
	}
	t := l.tail(subject)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.loaded {
		if err := l.catchUp(ctx, subject, t); err != nil {
			return 0, err
		}
		t.loaded = true
	}
	nc := l.js.Conn()
	wait := 10 * time.Millisecond
	first := time.Now()
	for attempt := 0; ; attempt++ {
		batch := nuid.Next()
		for i, m := range msgs {
			m.Header.Set(HeaderSeq, strconv.FormatUint(t.lastSeq+1+uint64(i), 10))
			m.Header.Set(headerBatchID, batch)
			m.Header.Set(headerBatchSeq, strconv.Itoa(i+1))
			m.Header.Del(headerExpectedLastSubjSeq)
			m.Header.Del(headerBatchCommit)
		}
		msgs[0].Header.Set(headerExpectedLastSubjSeq, strconv.FormatUint(t.lastStreamSeq, 10))
		last := msgs[len(msgs)-1]
		last.Header.Set(headerBatchCommit, "1")
		ack, err := l.publishBatch(ctx, nc, msgs)
		if err == nil {
			// A committed batch's entries are consecutive in the stream.
			n := uint64(len(msgs))
			for i, m := range msgs {
				t.win = append(t.win, window{streamSeq: ack.Sequence - n + 1 + uint64(i), size: int64(len(m.Data))})
				t.bytes += int64(len(m.Data))
			}
			firstSeq := t.lastSeq + 1
			t.lastStreamSeq = ack.Sequence
			t.lastSeq += n
			if err := l.trim(ctx, subject, t); err != nil {
				l.trimFailures.Add(1)
				slog.Warn("trim log window; retried at the next append", "subject", subject, "err", err)
			}
			return firstSeq, nil
		}
		if attempt > 1000 || ctx.Err() != nil {
			return 0, fmt.Errorf("append batch %s: %w", subject, err)
		}
		var apiErr *jetstream.APIError
		switch {
		case isWrongLastSeq(err):
			// Another writer appended, or an earlier attempt landed.
		case errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeBatchDuplicate:
			// An earlier attempt of this batch landed (its answer was lost):
			// its entries are the tail's last ones. Learn the tail and
			// report where the first one is.
			if err := l.catchUp(ctx, subject, t); err != nil {
				return 0, err
			}
			return l.findEntry(ctx, subject, t, msgs[0].Header.Get(jetstream.MsgIDHeader), len(msgs))
		case errors.As(err, &apiErr) && (apiErr.ErrorCode == jsErrCodeBatchDisabled || apiErr.ErrorCode == jsErrCodeBatchTooMany):
			// A stream provisioned without atomic batches, or too many
			// batches in flight on it: the entries go one by one (nothing
			// of the refused batch was stored).
			var firstSeq uint64
			for i, m := range msgs {
				for _, h := range []string{headerBatchID, headerBatchSeq, headerBatchCommit, headerExpectedLastSubjSeq} {
					m.Header.Del(h)
				}
				seq, err := l.appendLocked(ctx, subject, t, m.Data, m.Header)
				if err != nil {
					return 0, err
				}
				if i == 0 {
					firstSeq = seq
				}
			}
			return firstSeq, nil
		case errors.As(err, &apiErr) && apiErr.ErrorCode != jsErrCodeBatchIncomplete:
			return 0, fmt.Errorf("append batch %s: %w", subject, err)
		default:
			// No answer, or a batch message lost on the way (a
			// reconnect): the batch landed whole or not at all. Publish
			// it again under the same ids while JetStream remembers them.
			if err := retryPause(ctx, first, &wait, err); err != nil {
				return 0, fmt.Errorf("append batch %s: %w", subject, err)
			}
		}
		if err := l.catchUp(ctx, subject, t); err != nil {
			return 0, err
		}
	}
}

// JetStream's atomic batch headers and the errors AppendBatch tells apart.
const (
	headerBatchID             = "Nats-Batch-Id"
	headerBatchSeq            = "Nats-Batch-Sequence"
	headerBatchCommit         = "Nats-Batch-Commit"
	headerExpectedLastSubjSeq = "Nats-Expected-Last-Subject-Sequence"
	jsErrCodeBatchIncomplete  = jetstream.ErrorCode(10176) // atomic publish batch is incomplete
	jsErrCodeBatchDuplicate   = jetstream.ErrorCode(10201) // atomic publish batch contains duplicate message id
	jsErrCodeBatchDisabled    = jetstream.ErrorCode(10174) // atomic publish is disabled
	jsErrCodeBatchTooMany     = jetstream.ErrorCode(10210) // atomic publish too many inflight
)

// publishBatch sends every message but the last without waiting and the
// last (the commit) as a request: JetStream answers the whole batch once.
func (l *Log) publishBatch(ctx context.Context, nc *nats.Conn, msgs []*nats.Msg) (*jetstream.PubAck, error) {
	for _, m := range msgs[:len(msgs)-1] {
		m.Reply = ""
		if err := nc.PublishMsg(m); err != nil {
			return nil, err
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	resp, err := nc.RequestMsgWithContext(ctx, msgs[len(msgs)-1])
	if err != nil {
		return nil, err
	}
	var r struct {
		jetstream.PubAck
		Error *jetstream.APIError `json:"error,omitempty"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("decode batch ack: %w", err)
	}
	if r.Error != nil {
		return nil, r.Error
	}
	if r.Stream == "" || r.Sequence == 0 {
		return nil, errors.New("batch ack without a sequence")
	}
	return &r.PubAck, nil
}

// findEntry returns the Runner-Seq of the entry published under msgID
// among the subject's last n entries (a batch that had landed).
func (l *Log) findEntry(ctx context.Context, subject string, t *tail, msgID string, n int) (uint64, error) {
	s, err := l.handle(ctx)
	if err != nil {
		return 0, err
	}
	from := len(t.win) - n
	for i := max(0, from-n); i < len(t.win); i++ {
		m, err := s.GetMsg(ctx, t.win[i].streamSeq)
		if err != nil {
			continue
		}
		if m.Header.Get(jetstream.MsgIDHeader) == msgID {
			return parseSeq(m.Header), nil
		}
	}
	return 0, fmt.Errorf("append batch %s: a duplicate batch whose entries are not in the window", subject)
}

// retryPause waits before an append is published again after no answer
// (err), doubling *wait up to a second; it returns an error once the
// first attempt is older than retryWindow or ctx ends.
func retryPause(ctx context.Context, first time.Time, wait *time.Duration, err error) error {
	if time.Since(first) > retryWindow {
		return fmt.Errorf("no answer for %v: %w", retryWindow, err)
	}
	tm := time.NewTimer(*wait)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return err
	case <-tm.C:
	}
	*wait = min(2**wait, time.Second)
	return nil
}

// retryWindow bounds how long Append publishes one entry again after
// getting no answer: half the streams' 2-minute duplicate window, so every
// retry of an entry that landed is still recognised as a duplicate.
const retryWindow = time.Minute

// landed returns the Runner-Seq of the entry stored at stream sequence
// streamSeq (a de-duplicated publish) after bringing t up to the tail.
func (l *Log) landed(ctx context.Context, subject string, t *tail, streamSeq uint64) (uint64, error) {
	if err := l.catchUp(ctx, subject, t); err != nil {
		return 0, err
	}
	s, err := l.handle(ctx)
	if err != nil {
		return 0, fmt.Errorf("append %s: %w", subject, err)
	}
	m, err := s.GetMsg(ctx, streamSeq)
	if err != nil {
		// Trimmed already: it is older than the tail.
		return 0, fmt.Errorf("append %s: read de-duplicated entry %d: %w", subject, streamSeq, err)
	}
	return parseSeq(m.Header), nil
}

// TrimFailures counts window trims that failed (each is retried by the
// next append to the subject).
func (l *Log) TrimFailures() uint64 { return l.trimFailures.Load() }

// trim purges the oldest entries once the window exceeds the budget by more
// than the slack, down to the budget, always keeping the newest entry. The
// cached window shrinks only once the purge succeeded, so a failed trim is
// tried again by the next append.
func (l *Log) trim(ctx context.Context, subject string, t *tail) error {
	if l.budget <= 0 || t.bytes <= l.budget+l.slack || len(t.win) < 2 {
		return nil
	}
	n := 0
	bytes := t.bytes
	for bytes > l.budget && len(t.win)-n > 1 {
		bytes -= t.win[n].size
		n++
	}
	keep := t.win[n].streamSeq
	s, err := l.handle(ctx)
	if err != nil {
		return fmt.Errorf("trim %s: %w", subject, err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(keep)); err != nil {
		return fmt.Errorf("trim %s: %w", subject, err)
	}
	t.bytes = bytes
	t.win = append(t.win[:0], t.win[n:]...)
	return nil
}

// catchUp reads every entry of subject after t.lastStreamSeq into t.
func (l *Log) catchUp(ctx context.Context, subject string, t *tail) error {
	return l.scan(ctx, subject, t.lastStreamSeq+1, func(e Entry) {
		t.lastStreamSeq = e.StreamSeq
		t.lastSeq = e.Seq
		t.win = append(t.win, window{streamSeq: e.StreamSeq, size: int64(len(e.Data))})
		t.bytes += int64(len(e.Data))
	})
}

// scan calls fn for every retained entry of subject from stream sequence
// from up to the subject's current tail, then returns.
func (l *Log) scan(ctx context.Context, subject string, from uint64, fn func(Entry)) error {
	s, err := l.handle(ctx)
	if err != nil {
		return fmt.Errorf("scan %s: %w", subject, err)
	}
	last, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("scan %s: %w", subject, err)
	}
	if last.Sequence < from {
		return nil
	}
	// A few missing entries (the usual conflict) are cheapest as direct
	// gets; a long history (first touch of a subject) streams through an
	// ordered consumer.
	seq := from
	for i := 0; i < 32 && seq <= last.Sequence; i++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("scan %s: %w", subject, err)
		}
		fn(Entry{Seq: parseSeq(m.Header), StreamSeq: m.Sequence, Data: m.Data, Header: m.Header})
		seq = m.Sequence + 1
	}
	if seq > last.Sequence {
		return nil
	}
	c, err := l.js.OrderedConsumer(ctx, l.stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    seq,
	})
	if err != nil {
		return fmt.Errorf("scan %s: %w", subject, err)
	}
	defer deleteConsumer(l.js, l.stream, c)
	it, err := c.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("scan %s: %w", subject, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			return fmt.Errorf("scan %s: %w", subject, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("scan %s: %w", subject, err)
		}
		fn(Entry{Seq: parseSeq(m.Headers()), StreamSeq: md.Sequence.Stream, Data: m.Data(), Header: m.Headers()})
		if md.Sequence.Stream >= last.Sequence || md.NumPending == 0 {
			return nil
		}
	}
}

// Tail returns the Runner-Seq of subject's newest entry (0 when empty).
// A bus that does not answer for a moment (a stream electing its leader
// after a node died) is waited for, up to tailPatience, not reported.
func (l *Log) Tail(ctx context.Context, subject string) (uint64, error) {
	var seq uint64
	err := Retry(ctx, tailPatience, func(ctx context.Context) error {
		hdr, err := l.lastBySubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			seq = 0
			return nil
		}
		if err != nil {
			return err
		}
		seq = parseSeq(hdr)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("tail %s: %w", subject, err)
	}
	return seq, nil
}

// lastBySubject reads the headers of subject's newest entry from the
// stream's leader (STREAM.MSG.GET). Not a direct get: with replicas, any
// replica answers those, and one that has not stored the newest entries
// yet answers an older one (a three-node test read 3 after 5 acknowledged
// appends) — a tail read low would open a gap between the replay and the
// live entries.
func (l *Log) lastBySubject(ctx context.Context, subject string) (nats.Header, error) {
	req, err := json.Marshal(map[string]string{"last_by_subj": subject})
	if err != nil {
		return nil, err
	}
	m, err := l.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+l.stream, req)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Header []byte `json:"hdrs"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("decode message get: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, errors.New("message get: empty answer")
	case len(resp.Message.Header) == 0:
		return nats.Header{}, nil
	}
	return nats.DecodeHeadersMsg(resp.Message.Header)
}

// Purge deletes every entry of subject (session eviction).
func (l *Log) Purge(ctx context.Context, subject string) error {
	s, err := l.handle(ctx)
	if err != nil {
		return fmt.Errorf("purge %s: %w", subject, err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return fmt.Errorf("purge %s: %w", subject, err)
	}
	l.ForgetAll(subject)
	return nil
}

func subjectMatches(pattern, subject string) bool {
	if n := len(pattern); n >= 2 && pattern[n-1] == '>' && pattern[n-2] == '.' {
		p := pattern[:n-1]
		return len(subject) > len(p) && subject[:len(p)] == p
	}
	return pattern == subject
}

func parseSeq(h nats.Header) uint64 {
	n, _ := strconv.ParseUint(h.Get(HeaderSeq), 10, 64)
	return n
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// Position returns the stream sequence of subject's newest entry (0 when
// empty): entries appended later have greater stream sequences.
func (l *Log) Position(ctx context.Context, subject string) (uint64, error) {
	s, err := l.handle(ctx)
	if err != nil {
		return 0, fmt.Errorf("position %s: %w", subject, err)
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("position %s: %w", subject, err)
	}
	return m.Sequence, nil
}

// Has reports whether a retained entry of subject after stream sequence
// after carries Nats-Msg-Id msgID (an append that landed).
func (l *Log) Has(ctx context.Context, subject, msgID string, after uint64) (bool, error) {
	found := false
	err := l.scan(ctx, subject, after+1, func(e Entry) {
		if e.Header.Get(jetstream.MsgIDHeader) == msgID {
			found = true
		}
	})
	return found, err
}
