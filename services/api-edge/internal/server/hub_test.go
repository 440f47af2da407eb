package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
)

// A client too slow for its live buffer loses nothing: the hole is filled
// from the log, ids stay contiguous, and the stream still ends on the
// terminal status.
func TestSSESlowClientRepairsFromLog(t *testing.T) {
	old := sseFollowBuffer
	sseFollowBuffer = 2
	defer func() { sseFollowBuffer = old }()
	e := newEnv(t, nil)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fastReader(t, ctx, e.url+"/v1/sessions/"+id+"/events")
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/sessions/"+id+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	const n = 400
	go func() {
		for i := range n {
			if _, err := e.store.Emit(context.Background(), id, contract.Event{Type: contract.EventProgress, Phase: "boot", Message: fmt.Sprint(i)}); err != nil {
				t.Error(err)
				return
			}
		}
		if _, err := e.store.SetStatus(context.Background(), id, contract.Status{Kind: contract.StatusStopped}, nil); err != nil {
			t.Error(err)
		}
	}()
	sc := bufio.NewScanner(resp.Body)
	var ids []string
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "id: ") {
			ids = append(ids, l[4:])
			if len(ids)%50 == 0 {
				time.Sleep(20 * time.Millisecond) //nolint:forbidigo // be a slow client on purpose
			}
		}
	}
	if len(ids) != n+1 {
		t.Fatalf("got %d events, want %d", len(ids), n+1)
	}
	for i, got := range ids {
		if want := fmt.Sprint(i + 1); got != want {
			t.Fatalf("event %d id = %s, want %s", i, got, want)
		}
	}
}

// fastReader follows the session's events and discards them: a client
// that keeps up, so the hub moves on and a slow client on the same edge
// falls behind (with a single client the hub waits for it instead).
func fastReader(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
}

// sseReader reads an SSE response's frames.
type sseFrame struct{ id, event, data string }

func readSSE(t *testing.T, sc *bufio.Scanner) sseFrame {
	t.Helper()
	var f sseFrame
	for sc.Scan() {
		l := sc.Text()
		switch {
		case l == "":
			if f.id != "" || f.event != "" {
				return f
			}
		case strings.HasPrefix(l, "id: "):
			f.id = l[4:]
		case strings.HasPrefix(l, "event: "):
			f.event = l[7:]
		case strings.HasPrefix(l, "data: "):
			f.data = l[6:]
		}
	}
	t.Fatalf("stream ended: %v", sc.Err())
	return f
}

// Two writers on one subject: one publishes with a stale expected-last-
// sequence (JetStream refuses it, but core subscribers of the subject see
// the publish, Runner-Seq and all), the other appends the real entry with
// that Runner-Seq. The stream carries the stored entry, never the refused
// one.
func TestSSEDeliversOnlyStoredEntries(t *testing.T) {
	e := newEnv(t, nil)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subject := bus.EventsSubject(id)
	writer := bus.NewLog(e.driver, bus.StreamEvents, 5_000_000)
	tail, err := writer.Tail(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/sessions/"+id+"/events?lastEventId="+fmt.Sprint(tail), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	next := tail + 1
	// The stale writer: claims the next Runner-Seq, expecting a stream
	// position that is no longer the subject's tail.
	h := nats.Header{}
	h.Set(bus.HeaderSeq, fmt.Sprint(next))
	h.Set(bus.HeaderType, "progress")
	refused := &nats.Msg{Subject: subject, Data: []byte(`{"type":"progress","phase":"boot","message":"refused"}`), Header: h}
	if _, err := e.driver.PublishMsg(ctx, refused, jetstream.WithExpectLastSequencePerSubject(1<<40)); err == nil {
		t.Fatal("the stale publish was stored")
	}
	if _, err := e.store.Emit(ctx, id, contract.Event{Type: contract.EventProgress, Phase: "boot", Message: "stored"}); err != nil {
		t.Fatal(err)
	}
	f := readSSE(t, bufio.NewScanner(resp.Body))
	if f.id != fmt.Sprint(next) || !strings.Contains(f.data, `"stored"`) {
		t.Fatalf("frame = %+v, want id %d with the stored entry", f, next)
	}
}

// A slow client whose hole was partly evicted from the window before it
// was repaired: every id is written once, in increasing order (the lag
// repair once wrote the live entry that triggered it a second time).
func TestSSELagRepairWritesEachEntryOnce(t *testing.T) {
	old := sseFollowBuffer
	sseFollowBuffer = 1
	defer func() { sseFollowBuffer = old }()
	e := newEnv(t, nil)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subject := bus.EventsSubject(id)
	// A writer with a window of two entries: holes are evicted while the
	// client is behind.
	const size = 4 << 10
	writer := bus.NewLog(e.driver, bus.StreamEvents, 2*size)
	fastReader(t, ctx, e.url+"/v1/sessions/"+id+"/events")
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/sessions/"+id+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	const n = 2000
	written := make(chan struct{})
	defer func() { <-written }() // before cancel: the last append is acknowledged
	go func() {
		defer close(written)
		pad := strings.Repeat("x", size)
		for i := range n {
			h := nats.Header{}
			h.Set(bus.HeaderType, "progress")
			if i == n-1 {
				h.Set(bus.HeaderTerminal, "stopped")
			}
			if _, err := writer.Append(ctx, subject, fmt.Appendf(nil, `{"type":"progress","message":"%d","pad":"%s"}`, i, pad), h); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 2*size), 2*size)
	var last uint64
	seen := 0
	for sc.Scan() {
		l, ok := strings.CutPrefix(sc.Text(), "id: ")
		if !ok {
			continue
		}
		id, _ := strconv.ParseUint(l, 10, 64)
		if id <= last {
			t.Fatalf("id %d after %d: written twice or out of order", id, last)
		}
		last = id
		if seen++; seen%10 == 0 {
			time.Sleep(5 * time.Millisecond) //nolint:forbidigo // be a slow client on purpose
		}
	}
	if last < n || sc.Err() != nil {
		t.Fatalf("stream ended at id %d (%v), want the terminal entry (>= %d)", last, sc.Err(), n)
	}
}
