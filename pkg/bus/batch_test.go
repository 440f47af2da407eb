package bus_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// readAll reads every retained entry of subject, in order, checking that
// the Runner-Seqs are contiguous from first.
func readAll(t *testing.T, js jetstream.JetStream, subject string, first, n uint64) []bus.Entry {
	t.Helper()
	ctx := context.Background()
	r, err := bus.NewLog(js, bus.StreamEvents, 1<<30).Read(ctx, subject, first-1)
	if err != nil {
		t.Fatalf("Read() = %v", err)
	}
	defer r.Close()
	var out []bus.Entry
	for want := first; want < first+n; want++ {
		e, gap, _, err := r.Next()
		if err != nil || gap || e.Seq != want {
			t.Fatalf("Next() = seq %d gap %v err %v, want %d", e.Seq, gap, err, want)
		}
		out = append(out, e)
	}
	return out
}

// Several writers, each appending batches and single entries to the same
// subject at once: every entry is stored once, Runner-Seqs stay contiguous,
// and each batch's entries are consecutive and in order (a batch is stored
// whole; the first entry's expected-sequence check fences it).
func TestAppendBatchConcurrentWithOtherWriters(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	subject := bus.EventsSubject("cccccccccccc")
	const writers, batches, size = 4, 15, 7
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		log := bus.NewLog(js, bus.StreamEvents, 1<<30)
		wg.Go(func() {
			for b := range batches {
				datas := make([][]byte, size)
				for i := range datas {
					datas[i] = fmt.Appendf(nil, "w%d-b%d-%d", w, b, i)
				}
				first, err := log.AppendBatch(ctx, subject, datas, nil)
				if err != nil {
					errs <- err
					return
				}
				if first == 0 {
					errs <- fmt.Errorf("w%d b%d: first seq 0", w, b)
					return
				}
				if _, err := log.Append(ctx, subject, fmt.Appendf(nil, "w%d-single%d", w, b), nil); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	all := readAll(t, js, subject, 1, writers*batches*(size+1))
	seen := map[string]bool{}
	for i := 0; i < len(all); i++ {
		d := string(all[i].Data)
		if seen[d] {
			t.Fatalf("entry %q stored twice", d)
		}
		seen[d] = true
		var w, b, k int
		if n, _ := fmt.Sscanf(d, "w%d-b%d-%d", &w, &b, &k); n == 3 && k == 0 {
			for j := 1; j < size; j++ {
				if want := fmt.Sprintf("w%d-b%d-%d", w, b, j); string(all[i+j].Data) != want {
					t.Fatalf("entry %d = %q, want %q: a batch's entries are consecutive", all[i+j].Seq, all[i+j].Data, want)
				}
			}
		}
	}
}

// A batch published again after its answer was lost (here: the same
// message ids from a writer that never saw the first answer) is recognised
// as landed: nothing is stored twice and the first entry's Runner-Seq is
// reported.
func TestAppendBatchRetryOfLandedBatchStoresNothing(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	subject := bus.EventsSubject("dddddddddddd")
	log := bus.NewLog(js, bus.StreamEvents, 1<<30)
	if _, err := log.Append(ctx, subject, []byte("before"), nil); err != nil {
		t.Fatal(err)
	}
	batch := func() ([][]byte, []nats.Header) {
		var datas [][]byte
		var hdrs []nats.Header
		for i := range 3 {
			datas = append(datas, fmt.Appendf(nil, "e%d", i))
			hdrs = append(hdrs, nats.Header{jetstream.MsgIDHeader: []string{fmt.Sprintf("batch-e%d", i)}})
		}
		return datas, hdrs
	}
	d, h := batch()
	first, err := log.AppendBatch(ctx, subject, d, h)
	if err != nil || first != 2 {
		t.Fatalf("AppendBatch() = %d, %v; want 2", first, err)
	}
	d, h = batch()
	again, err := bus.NewLog(js, bus.StreamEvents, 1<<30).AppendBatch(ctx, subject, d, h)
	if err != nil || again != 2 {
		t.Fatalf("AppendBatch() again = %d, %v; want 2 (the landed batch)", again, err)
	}
	tail, err := log.Tail(ctx, subject)
	if err != nil || tail != 4 {
		t.Fatalf("Tail() = %d, %v; want 4: the retry stored nothing", tail, err)
	}
	for i, e := range readAll(t, js, subject, 2, 3) {
		if want := fmt.Sprintf("e%d", i); string(e.Data) != want {
			t.Fatalf("entry %d = %q, want %q", e.Seq, e.Data, want)
		}
	}
}

// Batches keep the byte window: old entries are trimmed as with Append.
func TestAppendBatchKeepsTheWindow(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	subject := bus.EventsSubject("eeeeeeeeeeee")
	log := bus.NewLog(js, bus.StreamEvents, 1000)
	for b := range 20 {
		datas := make([][]byte, 5)
		for i := range datas {
			datas[i] = fmt.Appendf(nil, "%02d-%d-%s", b, i, make([]byte, 40))
		}
		if _, err := log.AppendBatch(ctx, subject, datas, nil); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	kept := info.State.Subjects[subject]
	// 100 entries of ~46 bytes; the window is 1,000 bytes plus a 1/16 slack.
	if kept == 0 || kept > 1000*17/16/46+1 {
		t.Fatalf("%d entries kept, want the newest ~1,000 bytes", kept)
	}
	tail, err := log.Tail(ctx, subject)
	if err != nil || tail != 100 {
		t.Fatalf("Tail() = %d, %v; want 100", tail, err)
	}
}

// On a stream provisioned without atomic batches (an older runner's), a
// batch's entries are appended one by one: nothing is lost.
func TestAppendBatchWithoutAtomicBatches(t *testing.T) {
	srv := testkit.StartJetStream(t)
	testkit.Provision(t, srv, bus.Limits{})
	_, js := testkit.Connect(t, srv, bus.RoleDriver)
	_, admin := testkit.Connect(t, srv, bus.RoleProvisioner)
	ctx := context.Background()
	s, err := admin.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowAtomicPublish = false
	if _, err := admin.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("disable atomic batches: %v", err)
	}
	subject := bus.EventsSubject("ffffffffffff")
	log := bus.NewLog(js, bus.StreamEvents, 1<<30)
	first, err := log.AppendBatch(ctx, subject, [][]byte{[]byte("a"), []byte("b"), []byte("c")}, nil)
	if err != nil || first != 1 {
		t.Fatalf("AppendBatch() = %d, %v; want 1", first, err)
	}
	for i, e := range readAll(t, js, subject, 1, 3) {
		if want := string(rune('a' + i)); string(e.Data) != want {
			t.Fatalf("entry %d = %q, want %q", e.Seq, e.Data, want)
		}
	}
}
