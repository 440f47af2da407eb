package server

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
)

// A client that connects while a terminal status waits in the record's
// outbox (its writer died after the transition) is not sent away without
// it: the stream follows until the supervisor delivers the event, then
// ends on it.
func TestSSEWaitsForTerminalEventInOutbox(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	id := contract.NewSessionID()
	now := time.Now().UTC()
	exited := contract.Status{Kind: contract.StatusExited, Code: contract.IntPtr(0)}
	rec := session.Record{ID: id, Mode: contract.ModeRun, Status: contract.Status{Kind: contract.StatusStarting}, CreatedAt: now,
		Apps: []session.App{{Name: "app", Entry: "telo.yaml", IO: contract.IOStreams, Ports: []contract.PortMapping{}}}}
	if err := e.store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusRunning}, nil); err != nil {
		t.Fatal(err)
	}
	// What a writer dying between the two steps of SetStatus leaves.
	if _, err := e.store.Update(ctx, id, func(r *session.Record) error {
		r.Status, r.ExitedAt = exited, &now
		r.Outbox = []session.PendingStatus{{ID: "status-" + id + "-test", At: now, Status: exited}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodGet, e.url+"/v1/sessions/"+id+"/events", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var events []string
	sc := bufio.NewScanner(res.Body)
	flushed := false
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			events = append(events, v)
			if !flushed {
				// The supervisor's tick delivers the pending event.
				flushed = true
				if err := e.store.FlushStatus(ctx, id); err != nil {
					t.Fatalf("FlushStatus() = %v", err)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read stream: %v (events %q)", err, events)
	}
	if len(events) != 2 || !strings.Contains(events[0], `"running"`) || !strings.Contains(events[1], `"exited"`) {
		t.Fatalf("stream = %q, want running then exited, then its end", events)
	}
}
