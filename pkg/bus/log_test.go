package bus_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

func setup(t *testing.T, l bus.Limits) jetstream.JetStream {
	t.Helper()
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, l)
	_, js := testkit.Connect(t, s, bus.RoleDriver)
	return js
}

func TestAppendConcurrentWritersContiguous(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	const writers, each = 6, 40
	subject := bus.EventsSubject("aaaaaaaaaaaa")
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		// Each writer is its own Log, as separate processes would be.
		log := bus.NewLog(js, bus.StreamEvents, 1<<30)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := log.Append(ctx, subject, fmt.Appendf(nil, "w%d-%d", w, i), nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Append() = %v", err)
	}
	r, err := bus.NewLog(js, bus.StreamEvents, 1<<30).Read(ctx, subject, 0)
	if err != nil {
		t.Fatalf("Read() = %v", err)
	}
	defer r.Close()
	seen := map[string]bool{}
	for want := uint64(1); want <= writers*each; want++ {
		e, gap, _, err := r.Next()
		if err != nil {
			t.Fatalf("Next() = %v", err)
		}
		if gap || e.Seq != want {
			t.Fatalf("Next() seq = %d gap = %v, want %d no gap", e.Seq, gap, want)
		}
		if seen[string(e.Data)] {
			t.Fatalf("duplicate payload %q", e.Data)
		}
		seen[string(e.Data)] = true
	}
}

func TestReadResumesFromAnyPointThenFollows(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	log := bus.NewLog(js, bus.StreamEvents, 1<<30)
	subject := bus.EventsSubject("bbbbbbbbbbbb")
	for i := 1; i <= 20; i++ {
		if _, err := log.Append(ctx, subject, fmt.Appendf(nil, "e%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, after := range []uint64{0, 1, 7, 19, 20} {
		t.Run(fmt.Sprint(after), func(t *testing.T) {
			r, err := log.Read(ctx, subject, after)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			for want := after + 1; want <= 20; want++ {
				e, gap, _, err := r.Next()
				if err != nil || gap || e.Seq != want || string(e.Data) != fmt.Sprintf("e%d", want) {
					t.Fatalf("Next() = %d %q gap=%v err=%v, want %d", e.Seq, e.Data, gap, err, want)
				}
			}
			// Live follow: an append after the replay arrives next.
			go func() { _, _ = bus.NewLog(js, bus.StreamEvents, 1<<30).Append(ctx, subject, []byte("live"), nil) }()
			e, _, _, err := r.Next()
			if err != nil || string(e.Data) != "live" {
				t.Fatalf("Next() live = %q %v, want live", e.Data, err)
			}
		})
		// Keep later subtests' expectations simple: drop the live entries.
		subject = bus.EventsSubject(fmt.Sprintf("bbbbbbbbbb%02d", after))
		for i := 1; i <= 20; i++ {
			if _, err := log.Append(ctx, subject, fmt.Appendf(nil, "e%d", i), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestByteBudgetTrimsAndReportsGap(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	const budget = 1600
	log := bus.NewLog(js, bus.StreamIO, budget)
	subject := bus.IOSubject("cccccccccccc", "app")
	chunk := make([]byte, 100)
	for range 100 {
		if _, err := log.Append(ctx, subject, chunk, nil); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := js.Stream(ctx, bus.StreamIO)
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	kept := info.State.Subjects[subject]
	if kept < budget/100 || kept > (budget+budget/16)/100 {
		t.Fatalf("retained %d entries, want between %d and %d", kept, budget/100, (budget+budget/16)/100)
	}
	r, err := log.Read(ctx, subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	e, gap, _, err := r.Next()
	if err != nil || !gap || e.Seq != 100-kept+1 {
		t.Fatalf("Next() = seq %d gap %v err %v, want seq %d with gap", e.Seq, gap, err, 100-kept+1)
	}
	// A reader positioned inside the window sees no gap.
	r2, err := log.Read(ctx, subject, 99)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if e, gap, _, err := r2.Next(); err != nil || gap || e.Seq != 100 {
		t.Fatalf("Next() = seq %d gap %v err %v, want 100 without gap", e.Seq, gap, err)
	}
	if tail, err := log.Tail(ctx, subject); err != nil || tail != 100 {
		t.Fatalf("Tail() = %d, %v, want 100", tail, err)
	}
	// The newest entry is kept even when it alone exceeds the budget.
	if _, err := log.Append(ctx, subject, make([]byte, 4*budget), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := log.Append(ctx, subject, make([]byte, 4*budget), nil); err != nil {
		t.Fatal(err)
	}
	info, _ = s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if got := info.State.Subjects[subject]; got != 1 {
		t.Fatalf("retained %d entries after oversize appends, want 1", got)
	}
}

// A new Log continues the subject's sequence — in the same process, after
// a stale Log, and after the nats-server itself restarted on the same store
// directory (a new process with a new Log): no Runner-Seq is reused and
// every entry written before the restart is still read back in order.
func TestAppendAfterRestartContinuesSequence(t *testing.T) {
	dir := t.TempDir()
	s := testkit.StartJetStream(t, dir)
	testkit.Provision(t, s, bus.Limits{})
	nc, js := testkit.Connect(t, s, bus.RoleDriver)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subject := bus.EventsSubject("dddddddddddd")
	var want []string
	a := bus.NewLog(js, bus.StreamEvents, 1<<20)
	for i := range 5 {
		want = append(want, fmt.Sprint("x", i))
		if _, err := a.Append(ctx, subject, []byte(want[i]), nil); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh Log continues at 6.
	b := bus.NewLog(js, bus.StreamEvents, 1<<20)
	seq, err := b.Append(ctx, subject, []byte("y"), nil)
	if err != nil || seq != 6 {
		t.Fatalf("Append() = %d, %v, want 6", seq, err)
	}
	// And the first Log, now stale, catches up instead of reusing 6.
	seq, err = a.Append(ctx, subject, []byte("z"), nil)
	if err != nil || seq != 7 {
		t.Fatalf("stale Append() = %d, %v, want 7", seq, err)
	}
	want = append(want, "y", "z")

	// Restart the server on the same store directory, and the writer.
	nc.Close()
	s.Shutdown()
	s.WaitForShutdown()
	s2 := testkit.StartJetStream(t, dir)
	_, js2 := testkit.Connect(t, s2, bus.RoleDriver)
	c := bus.NewLog(js2, bus.StreamEvents, 1<<20)
	seq, err = c.Append(ctx, subject, []byte("after restart"), nil)
	if err != nil || seq != 8 {
		t.Fatalf("Append() after the restart = %d, %v, want 8", seq, err)
	}
	want = append(want, "after restart")
	r, err := c.Read(ctx, subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i, w := range want {
		e, _, _, err := r.Next()
		if err != nil {
			t.Fatalf("read entry %d after the restart: %v", i+1, err)
		}
		if e.Seq != uint64(i+1) || string(e.Data) != w {
			t.Fatalf("entry %d after the restart = seq %d %q, want seq %d %q", i+1, e.Seq, e.Data, i+1, w)
		}
	}
}

func TestProvisionIdempotentWithLimits(t *testing.T) {
	s := testkit.StartJetStream(t)
	_, prov := testkit.Connect(t, s, bus.RoleProvisioner)
	_, js := testkit.Connect(t, s, testkit.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := bus.Limits{OwnerTTL: 9 * time.Second, MaxMsgsPerSubject: 1234}
	for range 2 {
		if err := bus.Provision(ctx, prov, l); err != nil {
			t.Fatalf("Provision() = %v", err)
		}
	}
	log := bus.NewLog(js, bus.StreamEvents, 1<<20)
	if _, err := log.Append(ctx, bus.EventsSubject("eeeeeeeeeeee"), []byte("kept"), nil); err != nil {
		t.Fatal(err)
	}
	if err := bus.Provision(ctx, prov, l); err != nil {
		t.Fatalf("third Provision() = %v", err)
	}
	for _, name := range []string{bus.StreamEvents, bus.StreamIO, bus.StreamCmd} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if name != bus.StreamCmd && st.CachedInfo().Config.MaxMsgsPerSubject != 1234 {
			t.Errorf("%s MaxMsgsPerSubject = %d, want 1234", name, st.CachedInfo().Config.MaxMsgsPerSubject)
		}
		if name == bus.StreamCmd && st.CachedInfo().Config.Retention != jetstream.WorkQueuePolicy {
			t.Errorf("%s retention = %v, want work queue", name, st.CachedInfo().Config.Retention)
		}
	}
	if st, _ := js.Stream(ctx, bus.StreamEvents); st.CachedInfo().State.Msgs != 1 {
		t.Errorf("events stream lost messages on re-provision: %d", st.CachedInfo().State.Msgs)
	}
	for _, b := range []string{bus.BucketSessions, bus.BucketOwners, bus.BucketPresence, bus.BucketAdmission, bus.BucketCheckpoints, bus.BucketBuilds} {
		kv, err := js.KeyValue(ctx, b)
		if err != nil {
			t.Fatalf("bucket %s: %v", b, err)
		}
		st, _ := kv.Status(ctx)
		if b == bus.BucketOwners && st.TTL() != 9*time.Second {
			t.Errorf("%s TTL = %v, want 9s", b, st.TTL())
		}
		if b == bus.BucketBuilds && st.TTL() != bus.BuildLockTTL {
			t.Errorf("%s TTL = %v, want %v", b, st.TTL(), bus.BuildLockTTL)
		}
	}
	for _, o := range []string{bus.ObjectBundles, bus.ObjectBlobs} {
		if _, err := js.ObjectStore(ctx, o); err != nil {
			t.Fatalf("object store %s: %v", o, err)
		}
	}
}

func TestUpdateJSONConcurrentCAS(t *testing.T) {
	js := setup(t, bus.Limits{})
	ctx := context.Background()
	kv, _ := js.KeyValue(ctx, bus.BucketAdmission)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if _, _, err := bus.UpdateJSON(ctx, kv, "counter", true, func(n *int) error { *n++; return nil }); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got, _, err := bus.GetJSON[int](ctx, kv, "counter")
	if err != nil || got != 80 {
		t.Fatalf("counter = %d, %v, want 80", got, err)
	}
}
