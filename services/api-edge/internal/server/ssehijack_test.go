package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// sseCounts reports the hub's followers of subject, how many of them are
// hijacked clients the hub writes to directly, and the followers of every
// subject.
func sseCounts(s *Server, subject string) (followers, direct, all int) {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	for sub, t := range s.hub.topics {
		all += len(t.clients)
		if sub != subject {
			continue
		}
		for f := range t.clients {
			followers++
			if f.d != nil && f.d.mode == sseDirect {
				direct++
			}
		}
	}
	return followers, direct, all
}

// waitFor polls cond until it holds; a hang fails after a minute with what
// says.
func waitFor(t *testing.T, what func() string, cond func() bool) {
	t.Helper()
	if !testkit.Poll(context.Background(), time.Minute, cond) {
		t.Fatalf("gave up after a minute: %s", what())
	}
}

// rawSSE opens the event stream on a plain TCP connection (no client
// goroutines) and reads the response head; rcvbuf > 0 fixes the socket's
// receive buffer (a client that stops reading then backs up into the edge).
func rawSSE(t *testing.T, base, id string, rcvbuf int) (net.Conn, *http.Response) {
	t.Helper()
	d := &net.Dialer{}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf) }); err != nil {
				return err
			}
			return serr
		}
	}
	conn, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := fmt.Fprintf(conn, "GET /v1/sessions/%s/events HTTP/1.1\r\nHost: edge\r\nAccept: text/event-stream\r\n\r\n", id); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return conn, resp
}

// appendProgress appends n progress entries with message i and pad bytes
// of padding; the last is terminal when terminal is set.
func appendProgress(t *testing.T, ctx context.Context, w *bus.Log, subject string, n, pad int, terminal bool) {
	t.Helper()
	p := strings.Repeat("x", pad)
	for i := range n {
		h := nats.Header{}
		h.Set(bus.HeaderType, "progress")
		if terminal && i == n-1 {
			h.Set(bus.HeaderTerminal, "stopped")
		}
		if _, err := w.Append(ctx, subject, fmt.Appendf(nil, `{"type":"progress","message":"%d","pad":"%s"}`, i, p), h); err != nil {
			t.Fatal(err)
		}
	}
}

// readAll reads a stream to its end: every id must follow the one before
// it, the appended entries (ids after first) must carry messages 0, 1, …,
// and the stream must end cleanly (the chunked body's last chunk).
func readAll(sc *bufio.Scanner, first uint64) (n int, err error) {
	var last uint64
	for {
		f, ok := nextSSE(sc)
		if !ok {
			break
		}
		seq, perr := strconv.ParseUint(f.id, 10, 64)
		if perr != nil || seq != last+1 {
			return n, fmt.Errorf("id %q after %d", f.id, last)
		}
		last = seq
		if seq > first {
			var ev struct{ Message string }
			if err := json.Unmarshal([]byte(f.data), &ev); err != nil {
				return n, fmt.Errorf("event %d: %v", seq, err)
			}
			if ev.Message != fmt.Sprint(n) {
				return n, fmt.Errorf("event %d carries message %q, want %d", seq, ev.Message, n)
			}
			n++
		}
	}
	return n, sc.Err()
}

// Hijacked clients, written by the hub itself, receive every entry of a
// burst once and in order, and their streams end with the terminal entry
// as a complete chunked body.
func TestSSEHijackedBurstInOrder(t *testing.T) { sseBurst(t, true) }

// The same on net/http's path (writers that cannot be hijacked: HTTP/2,
// TLS): a goroutine per client reads its follower.
func TestSSENetHTTPBurstInOrder(t *testing.T) {
	sseHijack = false
	defer func() { sseHijack = true }()
	sseBurst(t, false)
}

func sseBurst(t *testing.T, hijack bool) {
	e := newEnv(t, nil)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	subject := bus.EventsSubject(id)
	writer := bus.NewLog(e.driver, bus.StreamEvents, 50_000_000)
	// Entries before the clients connect: their replay writes body bytes
	// before the connection is taken from net/http.
	appendProgress(t, ctx, writer, subject, 3, 10, false)
	first, err := writer.Tail(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	const clients, n = 20, 200
	results := make(chan error, clients)
	for range clients {
		req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/sessions/"+id+"/events", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 64<<10), 64<<10)
			got, err := readAll(sc, first)
			if err == nil && got != n {
				err = fmt.Errorf("%d appended entries, want %d", got, n)
			}
			results <- err
		}()
	}
	waitFor(t, func() string {
		f, d, _ := sseCounts(e.srv, subject)
		return fmt.Sprintf("%d followers, %d direct", f, d)
	},
		func() bool {
			f, d, _ := sseCounts(e.srv, subject)
			if !hijack {
				return f == clients && d == 0
			}
			return d == clients
		})
	// Sizes vary so that some frames fill a socket and take the pump.
	start := time.Now()
	for i := range n {
		h := nats.Header{}
		h.Set(bus.HeaderType, "progress")
		if i == n-1 {
			h.Set(bus.HeaderTerminal, "stopped")
		}
		pad := strings.Repeat("x", (i*7919)%(32<<10))
		if _, err := writer.Append(ctx, subject, fmt.Appendf(nil, `{"type":"progress","message":"%d","pad":"%s"}`, i, pad), h); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("appended in %v", time.Since(start))
	for range clients {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("received in %v", time.Since(start))
	waitFor(t, func() string { _, _, all := sseCounts(e.srv, subject); return fmt.Sprintf("%d followers left", all) },
		func() bool { _, _, all := sseCounts(e.srv, subject); return all == 0 })
}

// A client that stops reading (a raw socket with a small receive buffer)
// does not hold back the others: they receive the whole ~10 MB burst while
// it reads nothing. It then reads its stream: every entry once, in order
// (its hole refilled from the log), ending on the terminal entry.
func TestSSEStalledClientDoesNotDelayOthers(t *testing.T) {
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
	const n, big = 160, 64 << 10
	writer := bus.NewLog(e.driver, bus.StreamEvents, 4*n*big)
	appendProgress(t, ctx, writer, subject, 3, 10, false)
	first, err := writer.Tail(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	_, stalled := rawSSE(t, e.url, id, 4096)
	const fast = 4
	results := make(chan error, fast)
	for range fast {
		_, resp := rawSSE(t, e.url, id, 0)
		go func() {
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 2*big), 2*big)
			got, err := readAll(sc, first)
			if err == nil && got != n {
				err = fmt.Errorf("%d appended entries, want %d", got, n)
			}
			results <- err
		}()
	}
	waitFor(t, func() string {
		f, d, _ := sseCounts(e.srv, subject)
		return fmt.Sprintf("%d followers, %d direct", f, d)
	},
		func() bool { _, d, _ := sseCounts(e.srv, subject); return d == fast+1 })
	start := time.Now()
	appendProgress(t, ctx, writer, subject, n, big, true)
	for range fast {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("the %d reading clients received %d × 64 KiB in %v with one client stalled", fast, n, time.Since(start))
	sc := bufio.NewScanner(stalled.Body)
	sc.Buffer(make([]byte, 2*big), 2*big)
	got, err := readAll(sc, first)
	if err != nil {
		t.Fatalf("the stalled client's stream: %v after %d entries", err, got)
	}
	if got != n {
		t.Fatalf("the stalled client got %d appended entries, want %d", got, n)
	}
	if c := counter(t, repairs, "runner_edge_stream_repairs_total", "sse"); c == 0 {
		t.Fatal("runner_edge_stream_repairs_total{stream=sse} = 0: the stalled client was never behind its bound")
	}
}

// Hijacked streams cost no goroutine while idle, and a client that hangs
// up frees its follower, its presence count and its gauge at once (no
// write needed to notice).
func TestSSEDisconnectFreesResources(t *testing.T) {
	e := newEnv(t, nil)
	gauge := prometheus.NewRegistry()
	gauge.MustRegister(e.srv.m.sseClients)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	subject := bus.EventsSubject(id)
	open := func() float64 {
		mfs, err := gauge.Gather()
		if err != nil || len(mfs) == 0 {
			t.Fatalf("gather: %v", err)
		}
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	state := func() string {
		f, d, all := sseCounts(e.srv, subject)
		return fmt.Sprintf("%d followers (%d direct, %d on every subject), presence %v, gauge %v, %d goroutines", f, d, all, e.srv.presence.Snapshot()[id], open(), runtime.NumGoroutine())
	}
	freed := func() bool {
		_, _, all := sseCounts(e.srv, subject)
		return all == 0 && e.srv.presence.Snapshot()[id] == 0 && open() == 0
	}
	// One client first: the edge's shared watcher and heartbeat start.
	c0, _ := rawSSE(t, e.url, id, 0)
	waitFor(t, state, func() bool { _, d, _ := sseCounts(e.srv, subject); return d == 1 })
	_ = c0.Close()
	waitFor(t, state, freed)
	base := runtime.NumGoroutine()
	const k = 200
	conns := make([]net.Conn, k)
	for i := range conns {
		conns[i], _ = rawSSE(t, e.url, id, 0)
	}
	waitFor(t, state, func() bool { _, d, _ := sseCounts(e.srv, subject); return d == k })
	if got := e.srv.presence.Snapshot()[id]; got != k {
		t.Fatalf("presence = %d with %d clients", got, k)
	}
	// A goroutine per client would add at least k, for as long as the
	// clients stay connected; the handshakes' own goroutines wind down.
	waitFor(t, func() string {
		return fmt.Sprintf("%d goroutines with %d idle clients, %d before: a goroutine per client", runtime.NumGoroutine(), k, base)
	}, func() bool { return runtime.NumGoroutine() <= base+20 })
	for _, c := range conns {
		_ = c.Close()
	}
	waitFor(t, state, freed)
	waitFor(t, state, func() bool { return runtime.NumGoroutine() <= base+2 })
}

// TestSSEShutdownMidHijack: the edge stopping in the middle of a stream's
// hijack ends that stream once it is set up, and every other, and Wait
// returns. The shutdown used to free the stream while the hijack was still
// setting it up (a data race under -race).
func TestSSEShutdownMidHijack(t *testing.T) {
	e := newEnv(t, nil)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	// A stream hijacked before the shutdown.
	c0, _ := rawSSE(t, e.url, id, 0)
	var once sync.Once
	stop := func(d *sseConn) {
		once.Do(func() {
			e.cancel()
			// The stream must not be ended (its connection closed, its
			// follower freed) while the hijack still sets it up.
			if testkit.Poll(context.Background(), 200*time.Millisecond, func() bool {
				d.h.mu.Lock()
				defer d.h.mu.Unlock()
				return d.mode == sseClosed
			}) {
				t.Error("the shutdown ended the stream in the middle of its hijack")
			}
		})
	}
	e.srv.hijackHook.Store(&stop)
	c1, resp := rawSSE(t, e.url, id, 0)
	for _, c := range []net.Conn{c0, c1} {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	}
	// Both streams end: the edge closes their connections (the client
	// resumes elsewhere from its last id), so each reader sees the end of
	// the stream, not the deadline.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("the stream hijacked during the shutdown did not end: %v", err)
	}
	if _, err := io.Copy(io.Discard, c0); err != nil {
		t.Fatalf("the stream hijacked before the shutdown did not end: %v", err)
	}
	e.shutdown()
	done := make(chan struct{})
	go func() { e.srv.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Wait did not return after the shutdown")
	}
}

// A hijacked stream carries the heartbeat comment (6.3).
func TestSSEHijackedHeartbeat(t *testing.T) {
	old := heartbeatEvery
	heartbeatEvery = 50 * time.Millisecond
	defer func() { heartbeatEvery = old }()
	e := newEnv(t, nil)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	_, resp := rawSSE(t, e.url, id, 0)
	waitFor(t, func() string { return "no direct client" }, func() bool { _, d, _ := sseCounts(e.srv, bus.EventsSubject(id)); return d == 1 })
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == ": heartbeat" {
			if sc.Scan() && sc.Text() == "" {
				return
			}
			t.Fatalf("heartbeat not followed by a blank line: %q", sc.Text())
		}
	}
	t.Fatalf("stream ended without a heartbeat: %v", sc.Err())
}

// Many clients connecting at once replay the same range (sharing reads of
// the log when they overlap): each gets every entry once, in order, then
// the live ones.
func TestSSEConcurrentReplays(t *testing.T) {
	e := newEnv(t, nil)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	subject := bus.EventsSubject(id)
	writer := bus.NewLog(e.driver, bus.StreamEvents, 50_000_000)
	appendProgress(t, ctx, writer, subject, 100, 100, false)
	const clients = 100
	results := make(chan error, clients)
	gets := bus.DirectGets()
	for range clients {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/sessions/"+id+"/events", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- err
				return
			}
			defer resp.Body.Close()
			got, err := readAll(bufio.NewScanner(resp.Body), 0)
			if err == nil && got != 110 {
				err = fmt.Errorf("%d entries, want 110", got)
			}
			results <- err
		}()
	}
	waitFor(t, func() string { f, _, _ := sseCounts(e.srv, subject); return fmt.Sprintf("%d followers", f) },
		func() bool { f, _, _ := sseCounts(e.srv, subject); return f == clients })
	t.Logf("%d clients replayed 100 entries with %d direct gets", clients, bus.DirectGets()-gets)
	for i := 100; i < 110; i++ {
		h := nats.Header{}
		h.Set(bus.HeaderType, "progress")
		if i == 109 {
			h.Set(bus.HeaderTerminal, "stopped")
		}
		if _, err := writer.Append(ctx, subject, fmt.Appendf(nil, `{"type":"progress","message":"%d"}`, i), h); err != nil {
			t.Fatal(err)
		}
	}
	for range clients {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
}

// A stream that ends cleanly leaves its connection open for the client's
// next request (the contract's connection: keep-alive), as net/http does
// for a stream it wrote itself: Go's and browsers' clients reuse it. Both
// paths, hijacked and not.
func TestSSEConnectionServesTheNextRequest(t *testing.T) {
	t.Run("hijacked", func(t *testing.T) { sseKeepAlive(t) })
	t.Run("net/http", func(t *testing.T) {
		sseHijack = false
		defer func() { sseHijack = true }()
		sseKeepAlive(t)
	})
}

func sseKeepAlive(t *testing.T) {
	e := newEnv(t, nil)
	id := e.do(t, "POST", "/v1/sessions", validCreate(), nil).created(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subject := bus.EventsSubject(id)
	writer := bus.NewLog(e.driver, bus.StreamEvents, 50_000_000)
	conn, resp := rawSSE(t, e.url, id, 0)
	if sseHijack {
		waitFor(t, func() string { _, d, _ := sseCounts(e.srv, subject); return fmt.Sprintf("%d direct", d) },
			func() bool { _, d, _ := sseCounts(e.srv, subject); return d == 1 })
	}
	appendProgress(t, ctx, writer, subject, 5, 10, true)
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("read the stream to its end: %v", err)
	}
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	// The response reader holds no bytes beyond the body's last chunk: the
	// next response is read from the connection afresh.
	if _, err := fmt.Fprintf(conn, "GET /v1/health HTTP/1.1\r\nHost: edge\r\n\r\n"); err != nil {
		t.Fatalf("send the next request on the stream's connection: %v", err)
	}
	next, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("next request on the stream's connection: %v (the connection was closed)", err)
	}
	defer next.Body.Close()
	if next.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/health on the stream's connection = %d, want 200", next.StatusCode)
	}
	if resp.Close {
		t.Errorf("the stream's response asked to close the connection")
	}
}
