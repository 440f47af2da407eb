package server

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// Publishing one start twice (a retry after a lost acknowledgement)
// queues it once: its Nats-Msg-Id names the start request. A later start
// of the same session (a resume) is queued again.
func TestPublishStartIsDeduplicatedPerRequest(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	id := contract.NewSessionID()
	requested := time.Now().UTC().Truncate(time.Millisecond)
	for range 2 {
		if err := e.srv.publishStart(ctx, id, requested); err != nil {
			t.Fatal(err)
		}
	}
	_, admin := testkit.Connect(t, e.ns, testkit.Admin) // an observer: no role may read the queue's state
	cmds, err := admin.Stream(ctx, bus.StreamCmd)
	if err != nil {
		t.Fatal(err)
	}
	count := func() uint64 {
		info, err := cmds.Info(ctx, jetstream.WithSubjectFilter(bus.CmdStartSubject(id)))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[bus.CmdStartSubject(id)]
	}
	if n := count(); n != 1 {
		t.Fatalf("start commands queued after two publishes of one start = %d, want 1", n)
	}
	if err := e.srv.publishStart(ctx, id, requested.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("start commands queued after a later start = %d, want 2", n)
	}
}

// A create answers 201 once the session is stored, without waiting for
// its start command to be queued: with the command stream gone the
// session is still created (starting, its start requested at its
// creation), and the start lands once the stream is back.
func TestCreateAnswersBeforeTheStartIsQueued(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, admin := testkit.Connect(t, e.ns, testkit.Admin)
	if err := admin.DeleteStream(ctx, bus.StreamCmd); err != nil {
		t.Fatal(err)
	}
	id := e.do(t, http.MethodPost, "/v1/sessions", validCreate(), nil).created(t)
	rec := e.record(t, id)
	if rec.Status.Kind != contract.StatusStarting || rec.StartRequestedAt == nil || !rec.StartRequestedAt.Equal(rec.CreatedAt) {
		t.Fatalf("record status %q, startRequestedAt %v, want starting, requested at its creation %v", rec.Status.Kind, rec.StartRequestedAt, rec.CreatedAt)
	}
	testkit.Provision(t, e.ns, bus.Limits{})
	cons, err := e.driver.Consumer(ctx, bus.StreamCmd, bus.ConsumerDrivers)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
	if err != nil {
		t.Fatalf("the start command did not land once the stream was back: %v", err)
	}
	if msg.Subject() != bus.CmdStartSubject(id) {
		t.Errorf("command subject = %s, want %s", msg.Subject(), bus.CmdStartSubject(id))
	}
}
