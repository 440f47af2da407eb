package session_test

import (
	"context"
	"testing"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// TestTerminalStatusReleasesLogTails: a process that wrote a session's
// events and io keeps nothing of its logs once the terminal status is in
// the log (issue 20: each retained session used to cost every writer a
// cached tail and its window index until eviction), and a later append
// reads the tail from the stream again: sequences continue.
func TestTerminalStatusReleasesLogTails(t *testing.T) {
	ctx := context.Background()
	_, store := processStore(t, testkit.StartJetStream(t), bus.RoleDriver)
	var ids []string
	for range 3 {
		id := contract.NewSessionID()
		if err := store.Create(ctx, session.Record{ID: id, Mode: contract.ModeRun, Status: contract.Status{Kind: contract.StatusStarting},
			Apps: []session.App{{Name: "app", IO: contract.IOTTY}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Emit(ctx, id, contract.Event{Type: contract.EventProgress, Phase: contract.PhaseProvision, Message: "Starting workload"}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusRunning}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := store.IO().Append(ctx, bus.IOSubject(id, "app"), []byte{contract.TagStdout, 'h', 'i'}, nil); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if e, i := store.Events().Cached(), store.IO().Cached(); e != 3 || i != 3 {
		t.Fatalf("live sessions: %d event tails and %d io tails cached, want 3 and 3", e, i)
	}
	code := 0
	for n, id := range ids {
		if _, err := store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusExited, Code: &code}, nil); err != nil {
			t.Fatal(err)
		}
		if e, i := store.Events().Cached(), store.IO().Cached(); e != 2-n || i != 2-n {
			t.Fatalf("after %d sessions ended: %d event tails and %d io tails cached, want %d and %d", n+1, e, i, 2-n, 2-n)
		}
	}
	// Released is not lost: the next entry follows the stored ones.
	seq, err := store.Emit(ctx, ids[0], contract.Event{Type: contract.EventProgress, Phase: contract.PhaseProvision, Message: "after"})
	if err != nil || seq != 4 {
		t.Fatalf("append after the release = %d, %v; want Runner-Seq 4 (progress, running, exited before it)", seq, err)
	}
	if kinds, terminal := statusEvents(t, store, ids[0]); len(kinds) != 2 || terminal != 1 {
		t.Fatalf("status events = %v (%d terminal), want running, exited", kinds, terminal)
	}
}
