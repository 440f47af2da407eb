package session_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

func openStore(t *testing.T) *session.Store {
	t.Helper()
	_, _, store := testkit.Session(t, bus.Limits{}, bus.RoleEdge)
	return store
}

// admitted admits id and writes its record (status starting), as the
// edge's creation does.
func admitted(t *testing.T, store *session.Store, mode string, lim session.Limits) (string, error) {
	t.Helper()
	ctx := context.Background()
	id := contract.NewSessionID()
	if err := store.Admit(ctx, id, mode, lim); err != nil {
		return id, err
	}
	now := time.Now().UTC()
	rec := session.Record{ID: id, Mode: mode, Status: contract.Status{Kind: contract.StatusStarting}, CreatedAt: now, IdleSince: &now}
	if err := store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := store.Admitted(ctx, id); err != nil {
		t.Fatal(err)
	}
	return id, nil
}

func mustAdmit(t *testing.T, store *session.Store, mode string, lim session.Limits) string {
	t.Helper()
	id, err := admitted(t, store, mode, lim)
	if err != nil {
		t.Fatalf("Admit(%s) = %v", mode, err)
	}
	return id
}

// end moves a session to exited with exitedAt = at.
func end(t *testing.T, store *session.Store, id string, at time.Time) {
	t.Helper()
	store.SetClock(func() time.Time { return at })
	defer store.SetClock(time.Now)
	if _, err := store.SetStatus(context.Background(), id, contract.Status{Kind: contract.StatusExited, Code: new(int)}, nil); err != nil {
		t.Fatal(err)
	}
}

// suspend moves a watch session to suspended with idleSince = at.
func suspend(t *testing.T, store *session.Store, id string, at time.Time) {
	t.Helper()
	if _, err := store.SetStatus(context.Background(), id, contract.Status{Kind: contract.StatusSuspended}, func(r *session.Record) error {
		r.IdleSince = &at
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func ledger(t *testing.T, store *session.Store) session.Ledger {
	t.Helper()
	l, err := store.Ledger(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func gone(t *testing.T, store *session.Store, id string) bool {
	t.Helper()
	_, _, err := store.Get(context.Background(), id)
	if err != nil && !errors.Is(err, session.ErrNotFound) {
		t.Fatal(err)
	}
	return errors.Is(err, session.ErrNotFound)
}

func wantRefusal(t *testing.T, err error, code string) {
	t.Helper()
	var ce *contract.Error
	if !errors.As(err, &ce) || ce.Code != code {
		t.Fatalf("Admit() = %v, want %s", err, code)
	}
}

func TestSlotReadsBothLedgerFormats(t *testing.T) {
	var sl session.Slots
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := json.Unmarshal([]byte(`{"ids":{"a":"run","b":{"mode":"watch","at":"2026-11-29T12:00:00Z"}}}`), &sl); err != nil {
		t.Fatalf("Unmarshal() = %v", err)
	}
	if sl.IDs["a"] != (session.Slot{Mode: "run"}) || sl.IDs["b"] != (session.Slot{Mode: "watch", At: at}) {
		t.Errorf("slots = %+v", sl.IDs)
	}
	if err := json.Unmarshal([]byte(`{"ids":{"a":42}}`), &sl); err == nil {
		t.Error("Unmarshal(number slot) = nil, want an error")
	}
}

// At capacity the oldest reclaimable session goes first, whichever class:
// terminal by exitedAt, suspended by idleSince, however the transitions
// were ordered; live sessions and a resumed one never go.
func TestAdmitEvictsOldestReclaimable(t *testing.T) {
	store := openStore(t)
	lim := session.Limits{MaxSessions: 6}
	t0 := time.Now().UTC().Add(-time.Hour)
	a := mustAdmit(t, store, contract.ModeRun, lim)
	b := mustAdmit(t, store, contract.ModeRun, lim)
	c := mustAdmit(t, store, contract.ModeWatch, lim)
	resumed := mustAdmit(t, store, contract.ModeWatch, lim)
	live := mustAdmit(t, store, contract.ModeRun, lim)
	liveWatch := mustAdmit(t, store, contract.ModeWatch, lim)
	if n, err := store.CountLiveWatch(context.Background()); err != nil || n != 3 {
		t.Fatalf("CountLiveWatch() = %d, %v; want 3", n, err)
	}
	end(t, store, b, t0.Add(2*time.Minute))
	end(t, store, a, t0.Add(3*time.Minute))
	suspend(t, store, resumed, t0) // the oldest, but resumed below
	suspend(t, store, c, t0.Add(time.Minute))
	if _, err := store.SetStatus(context.Background(), resumed, contract.Status{Kind: contract.StatusStarting}, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := store.CountLiveWatch(context.Background()); err != nil || n != 2 {
		t.Fatalf("CountLiveWatch() after suspending and resuming = %d, %v; want 2", n, err)
	}
	for i, want := range []string{c, b, a} {
		mustAdmit(t, store, contract.ModeRun, lim)
		if !gone(t, store, want) {
			t.Fatalf("admission %d at capacity: session %s (expected victim) is still retained", i, want)
		}
		for _, kept := range []string{live, liveWatch, resumed} {
			if gone(t, store, kept) {
				t.Fatalf("admission %d at capacity evicted the live session %s", i, kept)
			}
		}
		if l := ledger(t, store); l.Total != 6 || len(l.Evicting) != 0 || len(l.Pending) != 0 {
			t.Fatalf("ledger after admission %d = %+v, want 6 retained and nothing in flight", i, l)
		}
	}
	_, err := admitted(t, store, contract.ModeRun, lim)
	wantRefusal(t, err, "too_many_sessions")
	// A session that ends later is reclaimable again (a new index entry).
	end(t, store, live, time.Now().UTC())
	mustAdmit(t, store, contract.ModeRun, lim)
	if !gone(t, store, live) {
		t.Error("the session that ended last was not reclaimed")
	}
}

// Two edges (two stores on one JetStream) admitting at once never exceed
// the ceilings: each reclaimable session is taken by exactly one admission
// and the rest are refused.
func TestAdmitExactAcrossEdges(t *testing.T) {
	s := testkit.StartJetStream(t)
	_, one := processStore(t, s, bus.RoleEdge)
	_, two := processStore(t, s, bus.RoleEdge)
	lim := session.Limits{MaxSessions: 20, MaxWatchSessions: 4}
	var ended []string
	for i := range 20 {
		id := mustAdmit(t, one, contract.ModeRun, lim)
		if i%2 == 0 {
			end(t, one, id, time.Now().UTC().Add(-time.Duration(i)*time.Second))
			ended = append(ended, id)
		}
	}
	var mu sync.Mutex
	codes := map[string]int{}
	var wg sync.WaitGroup
	for i := range 40 {
		store := one
		if i%2 == 1 {
			store = two
		}
		mode := contract.ModeRun
		if i%4 < 2 {
			mode = contract.ModeWatch
		}
		wg.Go(func() {
			_, err := admitted(t, store, mode, lim)
			code := "admitted"
			var ce *contract.Error
			if errors.As(err, &ce) {
				code = ce.Code
			} else if err != nil {
				code = err.Error()
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes["admitted"] != 10 || codes["admitted"]+codes["too_many_sessions"]+codes["too_many_watch_sessions"] != 40 {
		t.Errorf("outcomes = %v, want 10 admitted and the rest refused", codes)
	}
	for _, id := range ended {
		if !gone(t, one, id) {
			t.Errorf("reclaimable session %s still retained", id)
		}
	}
	l := ledger(t, two)
	if l.Total != 20 || len(l.Evicting) != 0 || len(l.Pending) != 0 || len(l.Watch) > 4 {
		t.Errorf("ledger = total %d, evicting %v, pending %v, watch %d; want 20, none, none, ≤ 4", l.Total, l.Evicting, l.Pending, len(l.Watch))
	}
	ids, err := one.SessionIDs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ids); n != 20 {
		t.Errorf("records = %d, want 20 (the ledger's count)", n)
	}
}

// The watch ceiling is exact across edges too.
func TestAdmitWatchCeilingAcrossEdges(t *testing.T) {
	s := testkit.StartJetStream(t)
	_, one := processStore(t, s, bus.RoleEdge)
	_, two := processStore(t, s, bus.RoleEdge)
	lim := session.Limits{MaxSessions: 100, MaxWatchSessions: 3}
	var mu sync.Mutex
	admittedN, refused := 0, 0
	var wg sync.WaitGroup
	for i := range 12 {
		store := one
		if i%2 == 1 {
			store = two
		}
		wg.Go(func() {
			_, err := admitted(t, store, contract.ModeWatch, lim)
			var ce *contract.Error
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admittedN++
			case errors.As(err, &ce) && ce.Code == "too_many_watch_sessions":
				refused++
			default:
				t.Errorf("Admit() = %v", err)
			}
		})
	}
	wg.Wait()
	if admittedN != 3 || refused != 9 {
		t.Errorf("admitted, refused = %d, %d; want 3, 9", admittedN, refused)
	}
}

// A status change whose writer dies after the record's compare-and-set
// leaves the ledger behind until FlushStatus syncs it, once: a repeated
// flush changes nothing.
func TestLedgerSyncSurvivesAWriterDying(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	lim := session.Limits{MaxSessions: 2}
	id := mustAdmit(t, store, contract.ModeWatch, lim)
	mustAdmit(t, store, contract.ModeRun, lim)
	died := errors.New("writer died")
	session.SetAfterStatusCAS(store, func() error { return died })
	now := time.Now().UTC()
	if _, err := store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusSuspended}, func(r *session.Record) error {
		r.IdleSince = &now
		return nil
	}); !errors.Is(err, died) {
		t.Fatalf("SetStatus() = %v, want the writer's death", err)
	}
	session.SetAfterStatusCAS(store, nil)
	if l := ledger(t, store); !l.Watch[id] {
		t.Fatalf("ledger synced although its writer died: %+v", l)
	}
	if _, err := session.AdmissionBucket(store).Get(ctx, bus.ReclaimKey(bus.ReclaimSuspended, id)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("reclaim entry before the flush: %v, want none", err)
	}
	for range 2 {
		if err := store.FlushStatus(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	l := ledger(t, store)
	if l.Watch[id] || l.Total != 2 {
		t.Errorf("ledger after the flushes = %+v, want the session out of the watch set and 2 retained", l)
	}
	e, err := session.AdmissionBucket(store).Get(ctx, bus.ReclaimKey(bus.ReclaimSuspended, id))
	if err != nil {
		t.Fatalf("reclaim entry after the flush: %v", err)
	}
	// Flushing again (nothing pending now) does not move the entry.
	if err := store.FlushStatus(ctx, id); err != nil {
		t.Fatal(err)
	}
	if again, err := session.AdmissionBucket(store).Get(ctx, bus.ReclaimKey(bus.ReclaimSuspended, id)); err != nil || again.Revision() != e.Revision() {
		t.Errorf("reclaim entry rewritten by a repeated flush: %v, %v", again, err)
	}
	kinds, _ := statusEvents(t, store, id)
	if fmt.Sprint(kinds) != "[suspended]" {
		t.Errorf("status events = %v, want [suspended] once", kinds)
	}
	// The suspended session is what the next admission reclaims.
	mustAdmit(t, store, contract.ModeRun, lim)
	if !gone(t, store, id) {
		t.Error("the suspended session was not reclaimed")
	}
}

// Evicting twice, or from two processes at once, frees one slot.
func TestEvictFreesOneSlot(t *testing.T) {
	s := testkit.StartJetStream(t)
	_, one := processStore(t, s, bus.RoleEdge)
	_, two := processStore(t, s, bus.RoleSupervisor)
	lim := session.Limits{MaxSessions: 10}
	id := mustAdmit(t, one, contract.ModeRun, lim)
	mustAdmit(t, one, contract.ModeRun, lim)
	end(t, one, id, time.Now().UTC())
	var wg sync.WaitGroup
	for _, store := range []*session.Store{one, two, one, two} {
		wg.Go(func() {
			if err := store.Evict(context.Background(), id); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := one.Evict(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if l := ledger(t, one); l.Total != 1 || len(l.Evicting) != 0 {
		t.Errorf("ledger = %+v, want 1 retained, nothing evicting", l)
	}
	if !gone(t, one, id) {
		t.Error("record still there")
	}
	for _, class := range []string{bus.ReclaimEnded, bus.ReclaimSuspended} {
		if _, err := session.AdmissionBucket(one).Get(context.Background(), bus.ReclaimKey(class, id)); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("reclaim entry %s after eviction: %v", class, err)
		}
	}
}

// A slot whose record never appeared (the creator died right after
// admission) is freed once past the grace.
func TestAdmitReclaimsACrashedCreation(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	lim := session.Limits{MaxSessions: 2}
	crashed := contract.NewSessionID()
	store.SetClock(func() time.Time { return time.Now().Add(-2 * time.Minute) })
	if err := store.Admit(ctx, crashed, contract.ModeWatch, lim); err != nil {
		t.Fatal(err)
	}
	store.SetClock(time.Now)
	mustAdmit(t, store, contract.ModeRun, lim)
	mustAdmit(t, store, contract.ModeRun, lim) // full without the crashed one's slot
	l := ledger(t, store)
	if _, ok := l.Pending[crashed]; ok || l.Watch[crashed] || l.Total != 2 {
		t.Errorf("ledger = %+v, want the crashed creation's slot freed", l)
	}
}

// The ledger's head does not grow with the retained sessions, and the
// registry is not capped below RUNNER_MAX_SESSIONS = 100,000.
func TestLedgerHeadStaysSmall(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	lim := session.Limits{MaxSessions: 100_000}
	for i := range 2000 {
		id := contract.NewSessionID()
		if err := store.Admit(ctx, id, contract.ModeRun, lim); err != nil {
			t.Fatal(err)
		}
		if err := store.Admitted(ctx, id); err != nil {
			t.Fatal(err)
		}
		if i == 9 {
			e, err := session.AdmissionBucket(store).Get(ctx, bus.KeyAdmissionLedger)
			if err != nil {
				t.Fatal(err)
			}
			if len(e.Value()) > 200 {
				t.Fatalf("ledger head at 10 sessions = %d bytes: %s", len(e.Value()), e.Value())
			}
		}
	}
	e, err := session.AdmissionBucket(store).Get(ctx, bus.KeyAdmissionLedger)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Value()) > 200 {
		t.Errorf("ledger head at 2,000 sessions = %d bytes, want the size it had at 10", len(e.Value()))
	}
	if l := ledger(t, store); l.Total != 2000 {
		t.Errorf("Total = %d, want 2000", l.Total)
	}
}

// A store written by an older runner (the one-value slots ledger) keeps
// admitting: its slots count, live watch sessions count against the
// ceiling, a slot without a record is reclaimed, an ended session is
// reclaimable, and the old value is dropped.
func TestLedgerBuiltFromTheFirstFormat(t *testing.T) {
	store := openStore(t)
	ctx := context.Background()
	live, ended, crashed := contract.NewSessionID(), contract.NewSessionID(), contract.NewSessionID()
	now := time.Now().UTC()
	if err := store.Create(ctx, session.Record{ID: live, Mode: contract.ModeWatch, Status: contract.Status{Kind: contract.StatusRunning}}); err != nil {
		t.Fatal(err)
	}
	if err := store.Create(ctx, session.Record{ID: ended, Mode: contract.ModeRun, Status: contract.Status{Kind: contract.StatusExited}, ExitedAt: &now}); err != nil {
		t.Fatal(err)
	}
	old := `{"ids":{"` + live + `":"watch","` + ended + `":{"mode":"run","at":"2026-11-29T12:00:00Z"},"` + crashed + `":"run"}}`
	if _, err := session.AdmissionBucket(store).Put(ctx, bus.KeyAdmissionSlots, []byte(old)); err != nil {
		t.Fatal(err)
	}
	if n, err := store.CountLiveWatch(ctx); err != nil || n != 1 {
		t.Fatalf("CountLiveWatch() = %d, %v; want 1", n, err)
	}
	if _, err := session.AdmissionBucket(store).Get(ctx, bus.KeyAdmissionSlots); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("first-format ledger still there: %v", err)
	}
	lim := session.Limits{MaxSessions: 3}
	mustAdmit(t, store, contract.ModeRun, lim) // the crashed creation's slot
	if gone(t, store, ended) {
		t.Fatal("the ended session was evicted while a crashed creation's slot was free")
	}
	mustAdmit(t, store, contract.ModeRun, lim) // the ended session's slot
	if !gone(t, store, ended) {
		t.Fatal("the ended session was not reclaimed")
	}
	_, err := admitted(t, store, contract.ModeRun, lim)
	wantRefusal(t, err, "too_many_sessions")
}

// A store decides on the head as it is, not as it last saw it: a slot
// another process freed is found, and a count it did not see is not
// overwritten.
func TestAdmitDecidesOnTheCurrentHead(t *testing.T) {
	s := testkit.StartJetStream(t)
	_, one := processStore(t, s, bus.RoleEdge)
	_, two := processStore(t, s, bus.RoleSupervisor)
	lim := session.Limits{MaxSessions: 2}
	first := mustAdmit(t, one, contract.ModeRun, lim)
	mustAdmit(t, one, contract.ModeRun, lim) // one's copy: full
	end(t, two, first, time.Now().UTC())
	if err := two.Evict(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	mustAdmit(t, one, contract.ModeRun, lim) // the slot two freed
	_, err := admitted(t, two, contract.ModeRun, lim)
	wantRefusal(t, err, "too_many_sessions")
	if l := ledger(t, one); l.Total != 2 {
		t.Errorf("Total = %d, want 2", l.Total)
	}
}
