package server

import (
	"context"
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
