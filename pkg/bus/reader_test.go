package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
)

// fill appends n entries "<subject>-<i>" to each subject, interleaved, so
// the subjects' entries are spread over the stream as io channels are.
func fill(t *testing.T, log *bus.Log, n int, subjects ...string) {
	t.Helper()
	ctx := context.Background()
	for i := 1; i <= n; i++ {
		for _, s := range subjects {
			if _, err := log.Append(ctx, s, fmt.Appendf(nil, "%s-%d", s, i), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A range read starts at the requested position and reads only what is
// asked: its round trips do not grow with the retained window.
func TestReadRangeStartsWhereTheReaderIs(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	log := bus.NewLog(js, bus.StreamIO, 1<<30)
	a, b := bus.IOSubject("dddddddddddd", "a"), bus.IOSubject("dddddddddddd", "b")
	const n = 3000
	fill(t, log, n, a, b)
	for _, c := range []struct{ after, upTo uint64 }{
		{0, 5}, {1, 2}, {7, 300}, {n - 1, n}, {n - 10, n}, {1500, 1501}, {n, n + 5}, {n - 3, n + 5},
	} {
		before := bus.DirectGets()
		var got []uint64
		err := log.ReadRange(ctx, a, c.after, c.upTo, func(e bus.Entry, gap bool) error {
			if gap {
				t.Errorf("after %d: gap at %d", c.after, e.Seq)
			}
			if want := fmt.Sprintf("%s-%d", a, e.Seq); string(e.Data) != want {
				t.Errorf("after %d: entry %d = %q, want %q", c.after, e.Seq, e.Data, want)
			}
			got = append(got, e.Seq)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := min(c.upTo, n) - min(c.after, n)
		if uint64(len(got)) != want || (want > 0 && (got[0] != c.after+1 || got[len(got)-1] != c.after+want)) {
			t.Fatalf("ReadRange(%d, %d) = %v, want %d..%d", c.after, c.upTo, got, c.after+1, c.after+want)
		}
		// Locating costs a bounded number of probes (interpolation over
		// 6,000 stream entries), then one batch per 256 entries.
		gets := bus.DirectGets() - before
		if limit := 16 + want/256; gets > limit {
			t.Errorf("ReadRange(%d, %d) took %d direct gets, want <= %d", c.after, c.upTo, gets, limit)
		}
	}
}

// A reader from the start (a new SSE client) needs no search: one batch,
// one direct get, from the subject's first entry.
func TestReadRangeFromStartIsOneRequest(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	log := bus.NewLog(js, bus.StreamIO, 1<<30)
	a, b := bus.IOSubject("eeeeeeeeeeee", "a"), bus.IOSubject("eeeeeeeeeeee", "b")
	fill(t, log, 50, a, b)
	before := bus.DirectGets()
	var got []uint64
	if err := log.ReadRange(ctx, a, 0, 10, func(e bus.Entry, gap bool) error {
		if gap {
			t.Errorf("gap at %d", e.Seq)
		}
		got = append(got, e.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[1 2 3 4 5 6 7 8 9 10]" {
		t.Fatalf("ReadRange(0, 10) = %v", got)
	}
	if gets := bus.DirectGets() - before; gets != 1 {
		t.Fatalf("ReadRange(0, 10) took %d direct gets, want 1", gets)
	}
}

// Reading after an evicted position reports the gap on the first entry.
func TestReadRangeReportsEvictedGap(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	log := bus.NewLog(js, bus.StreamIO, 1000)
	s := bus.IOSubject("eeeeeeeeeeee", "a")
	for range 50 {
		if _, err := log.Append(ctx, s, make([]byte, 100), nil); err != nil {
			t.Fatal(err)
		}
	}
	var seqs []uint64
	var gaps []bool
	if err := log.ReadRange(ctx, s, 3, 50, func(e bus.Entry, gap bool) error {
		seqs, gaps = append(seqs, e.Seq), append(gaps, gap)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seqs) == 0 || seqs[0] <= 4 || !gaps[0] || seqs[len(seqs)-1] != 50 {
		t.Fatalf("ReadRange(3, 50) = %v gaps %v, want a gap then ..50", seqs, gaps)
	}
	for i, g := range gaps[1:] {
		if g || seqs[i+1] != seqs[i]+1 {
			t.Fatalf("ReadRange(3, 50) = %v gaps %v, want contiguous after the first", seqs, gaps)
		}
	}
}

// Follow sees what the stream stored, in order, and never a publish that
// JetStream refused: a second writer's stale expected-last-sequence publish
// reaches core subscribers of the subject but not the follower.
func TestFollowSkipsRefusedPublishes(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	log := bus.NewLog(js, bus.StreamEvents, 1<<30)
	s := bus.EventsSubject("ffffffffffff")
	fill(t, log, 3, s)
	got := make(chan bus.Entry, 16)
	tail, stop, err := log.Follow(ctx, s, func(e bus.Entry) { got <- e })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if tail != 3 {
		t.Fatalf("Follow() tail = %d, want 3", tail)
	}
	// A stale writer: claims seq 4 expecting stream sequence 1 (refused).
	h := nats.Header{}
	h.Set(bus.HeaderSeq, "4")
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: s, Data: []byte("refused"), Header: h}, jetstream.WithExpectLastSequencePerSubject(1)); err == nil {
		t.Fatal("stale publish was accepted")
	}
	if _, err := log.Append(ctx, s, []byte("real"), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-got:
		if e.Seq != 4 || string(e.Data) != "real" {
			t.Fatalf("followed %d %q, want 4 \"real\"", e.Seq, e.Data)
		}
	case <-ctx.Done():
		t.Fatal("no entry followed")
	}
}

// TestClosedReadersLeaveNoConsumer: a stream takes at most 1,000
// consumers by default and an ordered consumer nobody deletes lingers for
// five minutes, so 1,000 reads in a row used to make every following read
// fail "maximum consumers limit reached" (an SSE client of an ended
// session then got an empty 200). Closed readers and stopped follows (the
// edge's hub) leave no consumer: 1,200 of each in a row all work, and none
// is left on the stream.
func TestClosedReadersLeaveNoConsumer(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	log := bus.NewLog(js, bus.StreamEvents, 1<<20)
	const sessions = 1200
	for i := range sessions {
		if _, err := log.Append(ctx, bus.EventsSubject(fmt.Sprintf("r%011d", i)), []byte("e"), nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := range sessions {
		r, err := log.Read(ctx, bus.EventsSubject(fmt.Sprintf("r%011d", i)), 0)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		e, _, _, err := r.Next()
		r.Close()
		if err != nil || e.Seq != 1 || string(e.Data) != "e" {
			t.Fatalf("read %d: entry %d %q, %v; want 1 \"e\"", i, e.Seq, e.Data, err)
		}
	}
	// The edge's hub follows a subject through an ordered consumer too.
	for i := range sessions {
		tail, stop, err := log.Follow(ctx, bus.EventsSubject(fmt.Sprintf("r%011d", i)), func(bus.Entry) {})
		if err != nil || tail != 1 {
			t.Fatalf("follow %d: tail %d, %v; want 1", i, tail, err)
		}
		stop()
	}
	s, err := js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Fatalf("%d consumers left on %s after every reader was closed, want 0", info.State.Consumers, bus.StreamEvents)
	}
}
