package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
)

// A client too slow for its live buffer loses nothing: the hole is filled
// from the log, ids stay contiguous, and the stream still ends on the
// terminal entry. The client is really slow: its socket has a small
// receive buffer and it reads nothing until a fast client on the same edge
// has received every entry (about 10 MB, more than the edge's socket send
// buffer can take), so the hub must drop entries for it.
func TestSSESlowClientRepairsFromLog(t *testing.T) {
	// Bounded by bytes, not entries: with one large entry queued, the next
	// large one is dropped and the small one after it is queued behind the
	// hole, so both repairs run (the hole found in the live entries, and
	// the lagged client's refill once its queue is empty).
	oldN, oldBytes := sseFollowBuffer, sseFollowBytes
	sseFollowBuffer, sseFollowBytes = 1024, 100<<10
	defer func() { sseFollowBuffer, sseFollowBytes = oldN, oldBytes }()
	e := newEnv(t, nil)
	repairs := prometheus.NewRegistry()
	repairs.MustRegister(e.srv.m.streamRepairs)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	subject := bus.EventsSubject(id)
	const n, big, small = 320, 64 << 10, 1 << 10
	writer := bus.NewLog(e.driver, bus.StreamEvents, 4*n*big) // no eviction: no gap
	first, err := writer.Tail(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	fastDone := fastReader(t, ctx, e.url+"/v1/sessions/"+id+"/events")
	slowCtx, slowCancel := context.WithTimeout(ctx, 60*time.Second)
	defer slowCancel()
	resp := slowClient(t, slowCtx, e.url+"/v1/sessions/"+id+"/events")
	defer resp.Body.Close()
	for i := range n {
		h := nats.Header{}
		h.Set(bus.HeaderType, "progress")
		pad := strings.Repeat("x", small)
		if i%2 == 0 || i == n-1 {
			pad = strings.Repeat("x", big)
		}
		if i == n-1 {
			h.Set(bus.HeaderTerminal, "stopped")
		}
		if _, err := writer.Append(ctx, subject, fmt.Appendf(nil, `{"type":"progress","message":"%d","pad":"%s"}`, i, pad), h); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-fastDone:
	case <-ctx.Done():
		t.Fatal("the fast client did not receive the terminal entry")
	}
	// Only now does the slow client read.
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 2*big), 2*big)
	var ids []uint64
	var msgs []string
	for {
		f, ok := nextSSE(sc)
		if !ok {
			break
		}
		seq, err := strconv.ParseUint(f.id, 10, 64)
		if err != nil {
			t.Fatalf("frame id %q: %v", f.id, err)
		}
		ids = append(ids, seq)
		if seq > first {
			var ev struct{ Message string }
			if err := json.Unmarshal([]byte(f.data), &ev); err != nil {
				t.Fatalf("event %d data: %v", seq, err)
			}
			msgs = append(msgs, ev.Message)
		}
	}
	if sc.Err() != nil {
		t.Fatalf("the slow stream did not end on the terminal entry within 60s: %v after %d events (last id %v)", sc.Err(), len(ids), ids[max(len(ids)-1, 0):])
	}
	if uint64(len(ids)) != first+n {
		t.Fatalf("got %d events, want %d", len(ids), first+n)
	}
	for i, got := range ids {
		if want := uint64(i + 1); got != want {
			t.Fatalf("event %d id = %d, want %d (each once, in order)", i, got, want)
		}
	}
	for i, m := range msgs {
		if m != fmt.Sprint(i) {
			t.Fatalf("appended event %d carries message %q, want %d", i, m, i)
		}
	}
	// The repair ran: the hub dropped entries for this client and its
	// stream refilled them from the log.
	if got := counter(t, repairs, "runner_edge_stream_repairs_total", "sse"); got == 0 {
		t.Fatal("runner_edge_stream_repairs_total{stream=sse} = 0: the client was never repaired (not slow enough to lag)")
	}
}

// counter reads one series of a counter vector from reg.
func counter(t *testing.T, reg *prometheus.Registry, name, stream string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stream" && l.GetValue() == stream {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// slowClient opens url on a connection whose socket receive buffer is
// small (fixed, so the kernel does not grow it): what the client does not
// read backs up into the edge instead of the client's kernel.
func slowClient(t *testing.T, ctx context.Context, url string) *http.Response {
	t.Helper()
	d := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	client := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableCompression: true}}
	t.Cleanup(client.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s = %d", url, resp.StatusCode)
	}
	return resp
}

// nextSSE reads the next frame with an id; ok is false at the stream's end.
func nextSSE(sc *bufio.Scanner) (f sseFrame, ok bool) {
	for sc.Scan() {
		l := sc.Text()
		switch {
		case l == "":
			if f.id != "" {
				return f, true
			}
		case strings.HasPrefix(l, "id: "):
			f.id = l[4:]
		case strings.HasPrefix(l, "event: "):
			f.event = l[7:]
		case strings.HasPrefix(l, "data: "):
			f.data = l[6:]
		}
	}
	return f, false
}

// fastReader follows the session's events and discards them: a client
// that keeps up, so the hub moves on and a slow client on the same edge
// falls behind (with a single client the hub waits for it instead). The
// returned channel is closed when the server ended its stream.
func fastReader(t *testing.T, ctx context.Context, url string) <-chan struct{} {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	return done
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
			// The mechanism of this test, not a wait for a condition: a
			// reader slower than the writer, so holes open while it is
			// behind and are evicted before it repairs them.
			time.Sleep(5 * time.Millisecond) //nolint:forbidigo // be a slow client on purpose
		}
	}
	if last < n || sc.Err() != nil {
		t.Fatalf("stream ended at id %d (%v), want the terminal entry (>= %d)", last, sc.Err(), n)
	}
}
