package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// At the registry ceiling (RUNNER_MAX_SESSIONS=3) a create evicts the
// oldest ended session — oldest by when it ended, not by when it was
// created (5.4) — and keeps the newer ones.
func TestCeilingEvictsOldestEndedSession(t *testing.T) {
	r := startRunner(t, map[string]string{"RUNNER_MAX_SESSIONS": "3"})
	held := func() createdResp { return r.create(t, runBody(manifest("held", nil, nil), nil, true)) }
	brief := func() createdResp {
		c := r.create(t, runBody(manifest("brief", nil, map[string]any{"exitAfterMs": 100}), nil, false))
		evs := openSSE(t, r.URL+c.StreamURL, nil).drain(t, 60*time.Second)
		if last := evs[len(evs)-1]; !isStatus("exited")(last) {
			t.Fatalf("session %s ended with %+v, want exited", c.SessionID, last)
		}
		return c
	}
	status := func(c createdResp) int { return do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID, nil, nil).Status }
	want := func(step string, gone createdResp, kept ...createdResp) {
		t.Helper()
		if got := status(gone); got != http.StatusNotFound {
			t.Errorf("%s: GET %s (the oldest ended) = %d, want 404 (evicted)", step, gone.SessionID, got)
		}
		for _, k := range kept {
			if got := status(k); got != http.StatusOK {
				t.Errorf("%s: GET %s = %d, want 200 (newer, kept)", step, k.SessionID, got)
			}
		}
	}

	// Created first, ended last.
	s1 := held()
	sse1 := openSSE(t, r.URL+s1.StreamURL, nil)
	sse1.until(t, 60*time.Second, isStatus("running"))
	s2 := brief()
	s3 := brief()
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+s1.SessionID, nil, nil); resp.Status != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", resp.Status, resp.Body)
	}
	if evs := sse1.drain(t, 60*time.Second); !isStatus("stopped")(evs[len(evs)-1]) {
		t.Fatalf("held session ended with %s, want stopped", summarize(evs))
	}
	// Ended in the order s2, s3, s1; the registry is full.
	s4 := brief()
	want("4th create", s2, s1, s3, s4)
	s5 := brief()
	want("5th create", s3, s1, s4, s5)
	s6 := brief()
	want("6th create", s1, s4, s5, s6)
}

// The watch ceiling (RUNNER_WATCH_MAX_SESSIONS=2) holds across two edge
// replicas admitting at once: of eight simultaneous creates, four on each
// edge, exactly two are admitted and the others answer 409
// too_many_watch_sessions (2.3, 4.4.2 step 7); creates alternating
// between the edges stay refused; once one session ends, the other edge
// admits one again.
func TestWatchCeilingAcrossEdges(t *testing.T) {
	vars := map[string]string{"RUNNER_WATCH_SESSIONS": "true", "RUNNER_WATCH_MAX_SESSIONS": "2"}
	r := watchRunner(t, vars)
	b := startEdgeReplica(t, r, "edge-b", vars, nil)
	body, err := json.Marshal(watchBody(map[string]string{"telo.yaml": manifest("w", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		edge   string
		status int
		body   string
		err    error
	}
	create := func(base string) result {
		resp, err := http.Post(base+"/v1/sessions", "application/json", bytes.NewReader(body))
		if err != nil {
			return result{edge: base, err: err}
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return result{edge: base, status: resp.StatusCode, body: string(data)}
	}
	start := make(chan struct{})
	results := make(chan result, 8)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		base := r.URL
		if i%2 == 1 {
			base = b.URL
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results <- create(base)
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	var admitted []createdResp
	var all []string
	for res := range results {
		all = append(all, fmt.Sprintf("%s: %d %s %v", res.edge, res.status, res.body, res.err))
		switch {
		case res.err != nil:
			t.Errorf("create on %s: %v", res.edge, res.err)
		case res.status == http.StatusCreated:
			var c createdResp
			if err := json.Unmarshal([]byte(res.body), &c); err != nil {
				t.Fatalf("decode %s: %v", res.body, err)
			}
			admitted = append(admitted, c)
		case res.status != http.StatusConflict || !strings.Contains(res.body, `"error":"too_many_watch_sessions"`):
			t.Errorf("create on %s = %d %s, want 201 or 409 too_many_watch_sessions", res.edge, res.status, res.body)
		}
	}
	if len(admitted) != 2 {
		t.Fatalf("%d of 8 simultaneous creates admitted, want exactly 2 (the ceiling):\n%s", len(admitted), strings.Join(all, "\n"))
	}
	for _, c := range admitted {
		waitStatus(t, r, c.SessionID, "running", 60*time.Second)
	}
	// One edge after the other: each decides on the ledger as the other
	// left it.
	for i, base := range []string{r.URL, b.URL, r.URL, b.URL} {
		if res := create(base); res.status != http.StatusConflict || !strings.Contains(res.body, `"error":"too_many_watch_sessions"`) {
			t.Fatalf("create %d at the ceiling on %s = %d %s %v, want 409 too_many_watch_sessions", i, base, res.status, res.body, res.err)
		}
	}
	// A slot freed on edge A is seen by edge B once the session's stopped
	// status is out (the ledger follows the record before the event is
	// appended).
	ended := openSSE(t, r.URL+admitted[0].StreamURL, nil)
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+admitted[0].SessionID, nil, nil); resp.Status != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", resp.Status, resp.Body)
	}
	if evs := ended.drain(t, 60*time.Second); !isStatus("stopped")(evs[len(evs)-1]) {
		t.Fatalf("deleted session's stream ended with %s, want stopped", summarize(evs))
	}
	if res := create(b.URL); res.status != http.StatusCreated {
		t.Fatalf("create on edge B after a session ended = %d %s %v, want 201", res.status, res.body, res.err)
	}
	if res := create(r.URL); res.status != http.StatusConflict || !strings.Contains(res.body, `"error":"too_many_watch_sessions"`) {
		t.Fatalf("create on edge A at the ceiling again = %d %s %v, want 409 too_many_watch_sessions", res.status, res.body, res.err)
	}
}
