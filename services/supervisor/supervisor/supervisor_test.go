package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats.go's object store leaves this waiter behind on some puts
		// (an upstream issue; see pkg/checkpoint).
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
	)
}

type env struct {
	nc       *nats.Conn // the supervisor's
	store    *session.Store
	lim      bus.Limits
	observer *nats.Conn // sees what the supervisor publishes (test-only identity)
}

func newEnv(t *testing.T) env {
	t.Helper()
	lim := bus.Limits{OwnerTTL: time.Second}
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, lim)
	nc, js := testkit.Connect(t, s, bus.RoleSupervisor)
	store, err := session.Open(context.Background(), js, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	observer, _ := testkit.Connect(t, s, testkit.Admin)
	return env{nc: nc, store: store, lim: lim, observer: observer}
}

func (e env) run(t *testing.T, cfg Config) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, Deps{NC: e.nc, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Limits: e.lim})
	}()
	var stopped bool
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func (e env) leader(t *testing.T) string {
	t.Helper()
	holder, _, err := e.store.Owner(context.Background(), bus.KeyLeader)
	if err != nil {
		return ""
	}
	return holder
}

// One active replica; a standby takes over when it goes, and a dead
// leader's key (no renewal) expires to the standby within a few seconds.
func TestLeaderElectionAndTakeover(t *testing.T) {
	e := newEnv(t)
	// A leader that died without releasing its key.
	if _, err := e.store.ClaimOwner(context.Background(), bus.KeyLeader, "ghost"); err != nil {
		t.Fatal(err)
	}
	stop := map[string]func(){
		"a": e.run(t, Config{ID: "a", Tick: 50 * time.Millisecond}),
		"b": e.run(t, Config{ID: "b", Tick: 50 * time.Millisecond}),
	}
	testkit.Eventually(t, 10*time.Second, func() bool { l := e.leader(t); return l == "a" || l == "b" }, "a live replica leads after the ghost's key expired")
	// Whichever replica won, the other takes over once it stops.
	first := e.leader(t)
	other := map[string]string{"a": "b", "b": "a"}[first]
	stop[first]()
	testkit.Eventually(t, 10*time.Second, func() bool { return e.leader(t) == other }, "%s takes over from %s", other, first)
}

// Terminal sessions are evicted after the exit TTL, live ones are not: a
// running session created long ago whose driver holds (and renews) its
// owner key keeps its record and its events through many reconciles.
func TestExitTTLEviction(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Hour)
	for id, st := range map[string]contract.Status{
		"aaaaaaaaaaaa": {Kind: contract.StatusExited, Code: contract.IntPtr(0)},
		"bbbbbbbbbbbb": {Kind: contract.StatusFailed, Message: "x"},
	} {
		if err := e.store.Create(ctx, session.Record{ID: id, Mode: contract.ModeRun, Status: st, ExitedAt: &old, CreatedAt: old}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.Emit(ctx, id, contract.StatusEvent(st)); err != nil {
			t.Fatal(err)
		}
	}
	recent := time.Now()
	if err := e.store.Create(ctx, session.Record{ID: "cccccccccccc", Mode: contract.ModeRun, Status: contract.Status{Kind: contract.StatusStopped}, ExitedAt: &recent, CreatedAt: recent}); err != nil {
		t.Fatal(err)
	}
	// The live one: running for an hour, owned by a driver that renews.
	const live = "kkkkkkkkkkkk"
	running := contract.Status{Kind: contract.StatusRunning, Endpoints: []contract.Endpoint{}}
	if err := e.store.Create(ctx, session.Record{ID: live, Mode: contract.ModeRun, Status: running, CreatedAt: old}); err != nil {
		t.Fatal(err)
	}
	liveTail, err := e.store.Emit(ctx, live, contract.StatusEvent(running))
	if err != nil {
		t.Fatal(err)
	}
	rev, err := e.store.ClaimOwner(ctx, live, "driver-a")
	if err != nil {
		t.Fatal(err)
	}
	e.run(t, Config{Tick: 50 * time.Millisecond, ExitTTL: 30 * time.Minute})
	testkit.Eventually(t, 10*time.Second, func() bool {
		_, _, err1 := e.store.Get(ctx, "aaaaaaaaaaaa")
		_, _, err2 := e.store.Get(ctx, "bbbbbbbbbbbb")
		return errors.Is(err1, session.ErrNotFound) && errors.Is(err2, session.ErrNotFound)
	}, "old terminal sessions evicted")
	// More reconciles, the live session's driver renewing meanwhile.
	for range 5 {
		ticks(t, e, 1)
		if rev, err = e.store.RenewOwner(ctx, live, "driver-a", rev); err != nil {
			t.Fatalf("renew the live session's owner key: %v", err)
		}
	}
	if _, _, err := e.store.Get(ctx, "cccccccccccc"); err != nil {
		t.Fatalf("recent terminal session evicted early: %v", err)
	}
	got, _, err := e.store.Get(ctx, live)
	if err != nil {
		t.Fatalf("live session: %v (evicted?)", err)
	}
	if got.Status.Kind != contract.StatusRunning {
		t.Fatalf("live session status = %+v, want running (untouched)", got.Status)
	}
	if tail, err := e.store.Events().Tail(ctx, bus.EventsSubject(live)); err != nil || tail != liveTail {
		t.Fatalf("live session's event tail = %d, %v; want %d (its events kept)", tail, err, liveTail)
	}
	if tail, err := e.store.Events().Tail(ctx, bus.EventsSubject("aaaaaaaaaaaa")); err != nil || tail != 0 {
		t.Fatalf("evicted session's events remain (tail %d, %v)", tail, err)
	}
}

// A running session with no owner gets an adoption request.
func TestOwnerlessSessionIsAdopted(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	now := time.Now()
	if err := e.store.Create(ctx, session.Record{ID: "dddddddddddd", Mode: contract.ModeRun, Status: contract.Status{Kind: contract.StatusRunning}, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sub, err := e.observer.SubscribeSync(bus.SubjectCmdAdopt)
	if err != nil {
		t.Fatal(err)
	}
	e.run(t, Config{Tick: 50 * time.Millisecond})
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no adopt request: %v", err)
	}
	if string(m.Data) != "dddddddddddd" {
		t.Fatalf("adopt request for %q", m.Data)
	}
}

// A status writer that died between the transition and its event left the
// event in the record's outbox: the supervisor delivers it, once.
func TestPendingStatusEventDeliveredOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const id = "eeeeeeeeeeee"
	old := time.Now().Add(-time.Minute).UTC()
	st := contract.Status{Kind: contract.StatusFailed, Message: "workload lost"}
	rec := session.Record{ID: id, Mode: contract.ModeRun, Status: st, ExitedAt: &old, CreatedAt: old,
		Outbox: []session.PendingStatus{{ID: "status-" + id + "-x", At: old, Status: st}}}
	if err := e.store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	r, err := e.store.Events().Read(ctx, bus.EventsSubject(id), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	e.run(t, Config{Tick: 50 * time.Millisecond})
	ev, _, _, err := r.Next()
	if err != nil || ev.Header.Get(bus.HeaderTerminal) == "" || ev.Seq != 1 {
		t.Fatalf("first event = %d %q (%v), want the terminal status as event 1", ev.Seq, ev.Data, err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		got, _, err := e.store.Get(ctx, id)
		return err == nil && len(got.Outbox) == 0
	}, "outbox emptied")
	// Several more ticks: nothing is appended again.
	for range 5 {
		// The leader key is renewed before each reconcile: a new revision
		// means the previous reconcile finished.
		rev := leaderRev(t, e)
		testkit.Eventually(t, 10*time.Second, func() bool { return leaderRev(t, e) > rev }, "another tick")
	}
	if tail, err := e.store.Events().Tail(ctx, bus.EventsSubject(id)); err != nil || tail != 1 {
		t.Fatalf("event log tail = %d, %v, want 1 (the status event once)", tail, err)
	}
}

func leaderRev(t *testing.T, e env) uint64 {
	t.Helper()
	_, rev, err := e.store.Owner(context.Background(), bus.KeyLeader)
	if err != nil {
		return 0
	}
	return rev
}

// ticks waits until the active supervisor finished n more reconciles.
func ticks(t *testing.T, e env, n int) {
	t.Helper()
	for range n {
		rev := leaderRev(t, e)
		testkit.Eventually(t, 10*time.Second, func() bool { return leaderRev(t, e) > rev }, "another tick")
	}
}

func publish(t *testing.T, e env, subject, id string) {
	t.Helper()
	js, err := jetstream.New(e.observer) // the edge's publish, not the supervisor's
	if err != nil {
		t.Fatal(err)
	}
	msg := &nats.Msg{Subject: subject, Data: []byte(id), Header: nats.Header{}}
	msg.Header.Set(bus.HeaderSession, id)
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

// A session resumed long after it was created whose start is slow — its
// command still queued, or taken by a driver that holds the owner key
// while the workload comes up — is never adopted, however old it is and
// however long the start takes.
func TestSlowStartOfResumedSessionIsNeverAdopted(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	old := time.Now().Add(-time.Hour).UTC()
	starting := contract.Status{Kind: contract.StatusStarting}
	const queued, claimed = "ffffffffffff", "gggggggggggg"
	for _, id := range []string{queued, claimed} {
		if err := e.store.Create(ctx, session.Record{ID: id, Mode: contract.ModeWatch, Status: starting, CreatedAt: old, StartRequestedAt: &old}); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, e, bus.CmdStartSubject(queued), queued) // no driver takes it yet
	// A driver took the other one: it holds the owner key (renewed, as a
	// live driver does) while its start takes long.
	rev, err := e.store.ClaimOwner(ctx, claimed, "driver-a")
	if err != nil {
		t.Fatal(err)
	}
	adopts, err := e.observer.SubscribeSync(bus.SubjectCmdAdopt)
	if err != nil {
		t.Fatal(err)
	}
	e.run(t, Config{Tick: 50 * time.Millisecond, AdoptAfter: 10 * time.Millisecond})
	deadline := time.Now().Add(3 * e.lim.OwnerTTL)
	for time.Now().Before(deadline) {
		ticks(t, e, 1)
		if rev, err = e.store.RenewOwner(ctx, claimed, "driver-a", rev); err != nil {
			t.Fatalf("renew owner key: %v", err)
		}
	}
	if m, err := adopts.NextMsg(10 * time.Millisecond); err == nil {
		t.Fatalf("adoption requested for %q during a slow start", m.Data)
	}
}

// A session whose driver died (its owner key expired, nothing queued) is
// adopted, within the owner TTL plus a tick; so is a starting session
// whose start command was lost, once the grace after its request passed.
func TestSessionWhoseOwnerDiedIsAdopted(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	now := time.Now().UTC()
	const died, lost = "hhhhhhhhhhhh", "iiiiiiiiiiii"
	if err := e.store.Create(ctx, session.Record{ID: died, Mode: contract.ModeWatch, Status: contract.Status{Kind: contract.StatusRunning}, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.ClaimOwner(ctx, died, "driver-gone"); err != nil {
		t.Fatal(err)
	}
	requested := now.Add(-time.Minute)
	if err := e.store.Create(ctx, session.Record{ID: lost, Mode: contract.ModeWatch, Status: contract.Status{Kind: contract.StatusStarting}, CreatedAt: now, StartRequestedAt: &requested}); err != nil {
		t.Fatal(err)
	}
	adopts, err := e.observer.SubscribeSync(bus.SubjectCmdAdopt)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.run(t, Config{Tick: 50 * time.Millisecond, AdoptAfter: 30 * time.Second})
	seen := map[string]time.Duration{}
	for len(seen) < 2 {
		m, err := adopts.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("adoption requests = %v, want both %s and %s: %v", seen, died, lost, err)
		}
		if _, ok := seen[string(m.Data)]; !ok {
			seen[string(m.Data)] = time.Since(start)
		}
	}
	if took := seen[died]; took < e.lim.OwnerTTL/2 || took > 2*e.lim.OwnerTTL+time.Second {
		t.Fatalf("adoption of the session whose owner died after %v, want once its key expired (TTL %v)", took, e.lim.OwnerTTL)
	}
	t.Logf("adoption requested %v after the owner's last renewal (owner TTL %v, tick 50ms)", seen[died], e.lim.OwnerTTL)
}

// An adopt request that reached no live driver (handed to one that died
// before acking it) is repeated once per owner TTL while the session stays
// ownerless, not once a minute: the repeat reaches a live driver within
// the failover bound.
func TestAdoptRequestRepeatsEachOwnerTTL(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const id = "jjjjjjjjjjjj"
	if err := e.store.Create(ctx, session.Record{ID: id, Mode: contract.ModeWatch, Status: contract.Status{Kind: contract.StatusRunning}, CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	e.run(t, Config{Tick: 50 * time.Millisecond, AdoptAfter: 30 * time.Second})
	js, err := jetstream.New(e.observer)
	if err != nil {
		t.Fatal(err)
	}
	stored := func() uint64 {
		st, err := js.Stream(ctx, bus.StreamCmd)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(bus.SubjectCmdAdopt))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[bus.SubjectCmdAdopt]
	}
	// Owner TTL 1 s: within 3.5 s at least three windows began, while a
	// per-minute window stores at most two requests.
	testkit.Eventually(t, 3500*time.Millisecond, func() bool { return stored() >= 3 },
		"adopt requests stored for an ownerless session: want one per owner TTL")
}

// A supervisor started while its bus does not answer for one of its
// buckets (a cluster still electing stream leaders after a full restart,
// here a bucket that is gone until the provisioner re-creates it) waits
// for it and then leads, instead of exiting.
func TestStartWaitsForItsBuckets(t *testing.T) {
	lim := bus.Limits{OwnerTTL: time.Second}
	s := testkit.StartJetStream(t)
	testkit.Provision(t, s, lim)
	_, admin := testkit.Connect(t, s, testkit.Admin)
	ctx := context.Background()
	if err := admin.DeleteKeyValue(ctx, bus.BucketSessions); err != nil {
		t.Fatal(err)
	}
	nc, _ := testkit.Connect(t, s, bus.RoleSupervisor)
	logs := &syncBuffer{}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(rctx, Config{ID: "a", Tick: 50 * time.Millisecond}, Deps{NC: nc, Logger: slog.New(slog.NewTextHandler(logs, nil)), Limits: lim})
	}()
	testkit.Eventually(t, 10*time.Second, func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run() ended while its bucket was missing: %v", err)
		default:
		}
		return strings.Contains(logs.String(), "bus not answering yet")
	}, "the supervisor reporting that it waits for its bus")
	testkit.Provision(t, s, lim)
	_, js := testkit.Connect(t, s, testkit.Admin)
	owners, err := js.KeyValue(ctx, bus.BucketOwners)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		v, err := owners.Get(ctx, bus.KeyLeader)
		return err == nil && string(v.Value()) == "a"
	}, "the supervisor leading once its buckets answer")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run() = %v", err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// The idle reaper decides on the tick's presence, but a client that comes
// back while the pre-suspend checkpoint runs keeps the session running:
// presence is read again at the moment the suspend would be asked for
// (stale-activity suspends are a reported failure of comparable
// products). Once the client leaves again, the session is suspended after
// a fresh idle window.
func TestIdleSuspendRereadsPresenceBeforeSuspending(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const id = "iiiiiiiiiiii"
	idle := time.Now().Add(-time.Hour).UTC()
	running := contract.Status{Kind: contract.StatusRunning, Endpoints: []contract.Endpoint{}}
	if err := e.store.Create(ctx, session.Record{ID: id, Mode: contract.ModeWatch, Status: running, CreatedAt: idle, IdleSince: &idle}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(e.observer)
	if err != nil {
		t.Fatal(err)
	}
	owners, err := js.KeyValue(ctx, bus.BucketOwners)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := owners.Create(ctx, id, []byte("driver-a"))
	if err != nil {
		t.Fatal(err)
	}
	// The owning driver renews its key (TTL 1 s) throughout.
	renewCtx, stopRenew := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-tick.C:
				if rev, err = owners.Update(renewCtx, id, []byte("driver-a"), rev); err != nil && renewCtx.Err() == nil {
					t.Errorf("renew the owner key: %v", err)
					return
				}
			}
		}
	}()
	defer func() { stopRenew(); <-renewed }()
	presence, err := js.KeyValue(ctx, bus.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	// The workspace's checkpoint: while the first one runs, a client
	// connects through an edge.
	var mu sync.Mutex
	checkpoints, suspends := 0, 0
	sub, err := e.observer.Subscribe(bus.WSSubject(id, bus.WSCheckpoint), func(m *nats.Msg) {
		mu.Lock()
		checkpoints++
		first := checkpoints == 1
		mu.Unlock()
		if first {
			if _, err := presence.Put(ctx, bus.PresenceKey(id, "edge-1"), []byte("1")); err != nil {
				t.Errorf("put presence: %v", err)
			}
		}
		_ = m.Respond([]byte(`{"id":"1"}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	sub2, err := e.observer.Subscribe(bus.CtlSubject(id, bus.CtlSuspend), func(m *nats.Msg) {
		mu.Lock()
		suspends++
		mu.Unlock()
		_ = m.Respond([]byte(`{}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub2.Unsubscribe() }()
	counts := func() (int, int) { mu.Lock(); defer mu.Unlock(); return checkpoints, suspends }

	e.run(t, Config{Tick: 50 * time.Millisecond, Idle: time.Second, CheckpointEvery: time.Hour})
	testkit.Eventually(t, 10*time.Second, func() bool { c, _ := counts(); return c >= 1 }, "the idle session's pre-suspend checkpoint")
	testkit.Eventually(t, 10*time.Second, func() bool {
		rec, _, err := e.store.Get(ctx, id)
		return err == nil && rec.IdleSince == nil
	}, "idleSince cleared once the returning client is seen")
	ticks(t, e, 5)
	if _, s := counts(); s != 0 {
		t.Fatalf("suspend asked %d times although a client came back during the checkpoint", s)
	}
	// The client leaves: a fresh idle window, then the suspend.
	if err := presence.Delete(ctx, bus.PresenceKey(id, "edge-1")); err != nil { // as the edge does
		t.Fatal(err)
	}
	left := time.Now()
	testkit.Eventually(t, 15*time.Second, func() bool { _, s := counts(); return s >= 1 }, "the suspend once the client left and the idle window passed (checkpoints, suspends = %v)", fmt.Sprint(counts()))
	if waited := time.Since(left); waited < time.Second {
		t.Fatalf("suspended %v after the client left, before the 1 s idle window", waited)
	}
}
