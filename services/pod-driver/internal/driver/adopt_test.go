package driver

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// statusKinds lists the status events of a session, in order.
func (e *driverEnv) statusKinds(t *testing.T, id string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	subject := bus.EventsSubject(id)
	tail, err := e.store.Events().Tail(ctx, subject)
	if err != nil || tail == 0 {
		return nil
	}
	r, err := e.store.Events().Read(ctx, subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var kinds []string
	for {
		ent, _, _, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		var ev contract.Event
		if json.Unmarshal(ent.Data, &ev) == nil && ev.Type == contract.EventStatus {
			kinds = append(kinds, ev.Status.Kind)
		}
		if ent.Seq >= tail {
			return kinds
		}
	}
}

// A resumed (or queued) session gets an adopt request racing its start
// command, in either order: it runs, it is never failed "workload lost".
func TestAdoptRacingStartOfResumedSessionStartsIt(t *testing.T) {
	e := newDriverEnv(t)
	resumed := func(r *session.Record) {
		r.CreatedAt = time.Now().Add(-time.Hour).UTC() // an old session, resumed now
		r.Apps[0].Generation, r.Apps[0].Trigger = 3, contract.TriggerResume
	}
	for _, order := range [][]string{
		{bus.SubjectCmdAdopt, bus.SubjectCmdStart},
		{bus.SubjectCmdStart, bus.SubjectCmdAdopt},
		{bus.SubjectCmdAdopt}, // the start command was lost
	} {
		id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, resumed)
		for _, subject := range order {
			e.command(t, startOrAdopt(subject, id), id)
		}
		e.waitStatus(t, id, contract.StatusRunning)
		// (An adopt that wins may take the recovery path, which records
		// starting again first; it never records failed.) The record turns
		// running before its event is appended (the status outbox): wait
		// for the event too.
		var kinds []string
		testkit.Eventually(t, 30*time.Second, func() bool {
			kinds = e.statusKinds(t, id)
			return len(kinds) > 0 && kinds[len(kinds)-1] == contract.StatusRunning
		}, "%v: the running status event", order)
		if slices.Contains(kinds, contract.StatusFailed) {
			t.Fatalf("%v: status events = %v, want ending running, never failed", order, kinds)
		}
	}
}

// A resume whose start command arrives while the previous owner still
// holds the owner key (it recorded the suspend and has not released the
// key yet) starts once the key is released, instead of being dropped as
// "owned by another driver" and left to the supervisor's adoption.
func TestStartWaitsForThePreviousOwnersKey(t *testing.T) {
	e := newDriverEnv(t)
	ctx := context.Background()
	resumed := func(r *session.Record) { r.Apps[0].Generation, r.Apps[0].Trigger = 2, contract.TriggerResume }
	id := e.watchSession(t, contract.Status{Kind: contract.StatusStarting}, resumed)
	owners, err := e.js.KeyValue(ctx, bus.BucketOwners)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := owners.Create(ctx, id, []byte("previous-owner"))
	if err != nil {
		t.Fatal(err)
	}
	e.command(t, bus.CmdStartSubject(id), id)
	// The start is taken and tried while the key is held: the session is
	// not started by anyone else meanwhile.
	testkit.Eventually(t, 10*time.Second, func() bool {
		c, err := e.js.Consumer(ctx, bus.StreamCmd, bus.ConsumerDrivers)
		return err == nil && c.CachedInfo().Delivered.Consumer >= 2 // the only command, delivered again
	}, "the start redelivered while the previous owner's key is held")
	if st := e.status(t, id); st.Kind != contract.StatusStarting {
		t.Fatalf("status while the key is held = %+v, want starting", st)
	}
	if err := owners.Delete(ctx, id, jetstream.LastRevision(rev)); err != nil {
		t.Fatal(err)
	}
	e.waitStatus(t, id, contract.StatusRunning)
	v, err := owners.Get(ctx, id)
	if err != nil || string(v.Value()) != "driver-test" {
		t.Fatalf("owner key after the start = %v, %v; want driver-test", v, err)
	}
}
