package session_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// processStore is one process's view of the registry: its own connection.
func processStore(t *testing.T, s *testkit.Server, role string) (*nats.Conn, *session.Store) {
	t.Helper()
	testkit.Provision(t, s, bus.Limits{})
	nc, err := nats.Connect(s.ClientURL(), s.ClientOptions(t, role)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	store, err := session.Open(context.Background(), js, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return nc, store
}

// statusEvents returns the kinds of the status events in the session's log
// and how many entries carry the Runner-Terminal header.
func statusEvents(t *testing.T, store *session.Store, id string) (kinds []string, terminal int) {
	t.Helper()
	ctx := context.Background()
	subject := bus.EventsSubject(id)
	tail, err := store.Events().Tail(ctx, subject)
	if err != nil || tail == 0 {
		return nil, 0
	}
	r, err := store.Events().Read(ctx, subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for {
		e, _, _, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		var ev contract.Event
		if err := json.Unmarshal(e.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type == contract.EventStatus {
			kinds = append(kinds, ev.Status.Kind)
		}
		if e.Header.Get(bus.HeaderTerminal) != "" {
			terminal++
		}
		if e.Seq == tail {
			return kinds, terminal
		}
	}
}

func newRecord(t *testing.T, store *session.Store, id string) {
	t.Helper()
	rec := session.Record{ID: id, Mode: contract.ModeRun, Status: contract.Status{Kind: contract.StatusStarting}, CreatedAt: time.Now().UTC()}
	if err := store.Create(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

// A writer whose process dies between the transition and the event append
// (its connection goes with it) leaves the event in the record's outbox;
// another process's flush delivers it, once, however often it flushes.
func TestSetStatusDyingBetweenStepsEventDeliveredOnce(t *testing.T) {
	srv := testkit.StartJetStream(t)
	ncA, a := processStore(t, srv, bus.RoleDriver)
	_, b := processStore(t, srv, bus.RoleSupervisor)
	ctx := context.Background()
	const id = "aaaaaaaaaaaa"
	newRecord(t, b, id)

	session.SetAfterStatusCAS(a, func() error {
		ncA.Close() // the process dies here
		return errors.New("killed")
	})
	exited := contract.Status{Kind: contract.StatusExited, Code: new(int)}
	if _, err := a.SetStatus(ctx, id, exited, nil); err == nil {
		t.Fatal("SetStatus() through a dying process = nil error")
	}
	rec, _, err := b.Get(ctx, id)
	if err != nil || rec.Status.Kind != contract.StatusExited || len(rec.Outbox) != 1 {
		t.Fatalf("record after the crash = %+v, %v, want exited with one pending event", rec, err)
	}
	if kinds, _ := statusEvents(t, b, id); len(kinds) != 0 {
		t.Fatalf("status events before recovery = %v, want none (the crash came first)", kinds)
	}
	// An SSE client following the log from the start sees the event once
	// recovery flushes it.
	follow, err := b.Events().Read(ctx, bus.EventsSubject(id), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer follow.Close()
	for range 3 { // the supervisor's tick, again and again
		if err := b.FlushStatus(ctx, id); err != nil {
			t.Fatalf("FlushStatus() = %v", err)
		}
	}
	e, _, _, err := follow.Next()
	if err != nil || e.Header.Get(bus.HeaderTerminal) == "" {
		t.Fatalf("follower got %q (%v), want the terminal status event", e.Data, err)
	}
	kinds, terminal := statusEvents(t, b, id)
	if fmt.Sprint(kinds) != "[exited]" || terminal != 1 {
		t.Fatalf("status events after recovery = %v (%d terminal), want [exited] once", kinds, terminal)
	}
	if rec, _, _ := b.Get(ctx, id); len(rec.Outbox) != 0 {
		t.Fatalf("outbox after recovery = %+v, want empty", rec.Outbox)
	}
}

// The next transition of a session delivers what an earlier writer left in
// the outbox first, so status events keep the transitions' order.
func TestSetStatusDeliversEarlierPendingEventsFirst(t *testing.T) {
	srv := testkit.StartJetStream(t)
	ncA, a := processStore(t, srv, bus.RoleDriver)
	_, b := processStore(t, srv, bus.RoleSupervisor)
	ctx := context.Background()
	const id = "bbbbbbbbbbbb"
	newRecord(t, b, id)
	session.SetAfterStatusCAS(a, func() error { ncA.Close(); return errors.New("killed") })
	if _, err := a.SetStatus(ctx, id, contract.Status{Kind: contract.StatusRunning}, nil); err == nil {
		t.Fatal("SetStatus() through a dying process = nil error")
	}
	// The adopter records the loss.
	if _, err := b.SetStatus(ctx, id, contract.Status{Kind: contract.StatusFailed, Message: "workload lost"}, nil); err != nil {
		t.Fatalf("SetStatus(failed) = %v", err)
	}
	if err := b.FlushStatus(ctx, id); err != nil {
		t.Fatal(err)
	}
	if kinds, terminal := statusEvents(t, b, id); fmt.Sprint(kinds) != "[running failed]" || terminal != 1 {
		t.Fatalf("status events = %v (%d terminal), want [running failed], one terminal", kinds, terminal)
	}
}

// A writer that appended the event but died before dropping it from the
// outbox: a flush finds the event in the log and does not append it again.
func TestFlushStatusAfterAppendedEventDoesNotDouble(t *testing.T) {
	srv := testkit.StartJetStream(t)
	_, a := processStore(t, srv, bus.RoleDriver)
	ctx := context.Background()
	const id = "cccccccccccc"
	newRecord(t, a, id)
	if _, err := a.SetStatus(ctx, id, contract.Status{Kind: contract.StatusStopped}, nil); err != nil {
		t.Fatal(err)
	}
	// Put the delivered entry back, as if the process died before the
	// outbox update: its id is the event's Nats-Msg-Id.
	m, err := a.JetStream().Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	last, err := m.GetLastMsgForSubject(ctx, bus.EventsSubject(id))
	if err != nil {
		t.Fatal(err)
	}
	pending := session.PendingStatus{ID: last.Header.Get(jetstream.MsgIDHeader), After: last.Sequence - 1, At: time.Now().UTC(), Status: contract.Status{Kind: contract.StatusStopped}}
	if pending.ID == "" {
		t.Fatal("status event carries no Nats-Msg-Id")
	}
	if _, err := a.Update(ctx, id, func(r *session.Record) error { r.Outbox = []session.PendingStatus{pending}; return nil }); err != nil {
		t.Fatal(err)
	}
	_, b := processStore(t, srv, bus.RoleSupervisor)
	if err := b.FlushStatus(ctx, id); err != nil {
		t.Fatal(err)
	}
	if kinds, terminal := statusEvents(t, b, id); fmt.Sprint(kinds) != "[stopped]" || terminal != 1 {
		t.Fatalf("status events = %v (%d terminal), want [stopped] once", kinds, terminal)
	}
	if rec, _, _ := b.Get(ctx, id); len(rec.Outbox) != 0 {
		t.Fatalf("outbox = %+v, want empty", rec.Outbox)
	}
}
