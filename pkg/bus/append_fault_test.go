package bus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// faultJS is a real JetStream with faults injected on the client side:
// publishes whose acknowledgement is lost after the server stored them,
// and purges that fail.
type faultJS struct {
	jetstream.JetStream
	mu sync.Mutex
	// loseAcks is how many of the next publishes are stored but answered
	// with a timeout; -1 loses every one.
	loseAcks int
	// afterLost runs after a publish whose ack was lost (another writer
	// appending in the gap).
	afterLost func()
	failPurge atomic.Bool
	published atomic.Int64
}

func (f *faultJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := f.JetStream.PublishMsg(ctx, m, opts...)
	f.published.Add(1)
	f.mu.Lock()
	lose := err == nil && f.loseAcks != 0
	if lose && f.loseAcks > 0 {
		f.loseAcks--
	}
	after := f.afterLost
	f.mu.Unlock()
	if lose {
		if after != nil {
			after()
		}
		return nil, nats.ErrTimeout
	}
	return ack, err
}

func (f *faultJS) setLoseAcks(n int) {
	f.mu.Lock()
	f.loseAcks = n
	f.mu.Unlock()
}

func (f *faultJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	s, err := f.JetStream.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return &faultStream{Stream: s, f: f}, nil
}

type faultStream struct {
	jetstream.Stream
	f *faultJS
}

func (s *faultStream) Purge(ctx context.Context, opts ...jetstream.StreamPurgeOpt) error {
	if s.f.failPurge.Load() {
		return errors.New("injected purge failure")
	}
	return s.Stream.Purge(ctx, opts...)
}

// stored returns the Runner-Seq and payload of every retained entry.
func stored(t *testing.T, js jetstream.JetStream, stream, subject string) (seqs []uint64, data []string) {
	t.Helper()
	ctx := context.Background()
	tail, err := bus.NewLog(js, stream, 1<<30).Tail(ctx, subject)
	if err != nil {
		t.Fatalf("Tail() = %v", err)
	}
	if tail == 0 {
		return nil, nil
	}
	r, err := bus.NewLog(js, stream, 1<<30).Read(ctx, subject, 0)
	if err != nil {
		t.Fatalf("Read() = %v", err)
	}
	defer r.Close()
	for {
		e, _, _, err := r.Next()
		if err != nil {
			t.Fatalf("Next() = %v", err)
		}
		seqs = append(seqs, e.Seq)
		data = append(data, string(e.Data))
		if e.Seq == tail {
			return seqs, data
		}
	}
}

func TestAppendLostAckStoredOnce(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	f := &faultJS{JetStream: js}
	log := bus.NewLog(f, bus.StreamIO, 1<<30)
	subject := bus.IOSubject("ffffffffffff", "app")
	if _, err := log.Append(ctx, subject, []byte("first"), nil); err != nil {
		t.Fatal(err)
	}
	// The second entry is stored but its ack is lost; meanwhile another
	// writer appends, so the retry meets both a stale tail and its own entry.
	other := bus.NewLog(js, bus.StreamIO, 1<<30)
	f.setLoseAcks(1)
	f.afterLost = func() {
		if _, err := other.Append(ctx, subject, []byte("other"), nil); err != nil {
			t.Errorf("other Append() = %v", err)
		}
	}
	seq, err := log.Append(ctx, subject, []byte("second"), nil)
	if err != nil || seq != 2 {
		t.Fatalf("Append() after a lost ack = %d, %v, want 2 (the entry that landed), nil", seq, err)
	}
	f.afterLost = nil
	if seq, err := log.Append(ctx, subject, []byte("third"), nil); err != nil || seq != 4 {
		t.Fatalf("next Append() = %d, %v, want 4", seq, err)
	}
	seqs, data := stored(t, js, bus.StreamIO, subject)
	if got, want := fmt.Sprint(seqs, data), fmt.Sprint([]uint64{1, 2, 3, 4}, []string{"first", "second", "other", "third"}); got != want {
		t.Fatalf("stored = %s, want %s", got, want)
	}
}

func TestAppendCallerRetryWithSameIDStoredOnce(t *testing.T) {
	js := setup(t, bus.Limits{})
	f := &faultJS{JetStream: js}
	log := bus.NewLog(f, bus.StreamIO, 1<<30)
	subject := bus.IOSubject("gggggggggggg", "app")
	// Every ack is lost until the caller's deadline: Append fails although
	// the entry is stored.
	f.setLoseAcks(-1)
	hdr := nats.Header{}
	hdr.Set(jetstream.MsgIDHeader, "chunk-1")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := log.Append(ctx, subject, []byte("once"), hdr)
	cancel()
	if err == nil {
		t.Fatal("Append() with every ack lost = nil error, want the deadline")
	}
	if f.published.Load() < 2 {
		t.Fatalf("published %d times, want the publish retried under the same id", f.published.Load())
	}
	// The caller retries with the same id: the stored entry is reported.
	f.setLoseAcks(0)
	hdr = nats.Header{}
	hdr.Set(jetstream.MsgIDHeader, "chunk-1")
	seq, err := log.Append(context.Background(), subject, []byte("once"), hdr)
	if err != nil || seq != 1 {
		t.Fatalf("retried Append() = %d, %v, want 1, nil", seq, err)
	}
	seqs, data := stored(t, js, bus.StreamIO, subject)
	if got, want := fmt.Sprint(seqs, data), fmt.Sprint([]uint64{1}, []string{"once"}); got != want {
		t.Fatalf("stored = %s, want %s", got, want)
	}
}

func TestAppendTrimFailureIsNotAnAppendError(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	f := &faultJS{JetStream: js}
	const budget = 1000
	log := bus.NewLog(f, bus.StreamIO, budget)
	subject := bus.IOSubject("hhhhhhhhhhhh", "app")
	f.failPurge.Store(true)
	chunk := make([]byte, 100)
	for i := 1; i <= 30; i++ {
		seq, err := log.Append(ctx, subject, chunk, nil)
		if err != nil || seq != uint64(i) {
			t.Fatalf("Append() #%d with failing trims = %d, %v, want %d, nil", i, seq, err, i)
		}
	}
	if log.TrimFailures() == 0 {
		t.Fatal("TrimFailures() = 0, want the failed trims counted")
	}
	seqs, _ := stored(t, js, bus.StreamIO, subject)
	if len(seqs) != 30 {
		t.Fatalf("stored %d entries while trims fail, want 30 (each once)", len(seqs))
	}
	// Trims work again: the next append brings the window to the budget.
	f.failPurge.Store(false)
	if _, err := log.Append(ctx, subject, chunk, nil); err != nil {
		t.Fatal(err)
	}
	seqs, _ = stored(t, js, bus.StreamIO, subject)
	if len(seqs) != budget/100 || seqs[len(seqs)-1] != 31 {
		t.Fatalf("after a working trim: %d entries ending at %v, want %d ending at 31", len(seqs), seqs, budget/100)
	}
}
