package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// ioSession creates a run session whose one app "web" has io mode, and
// returns its id and a log that appends to the app's channel as the
// driver does (with the driver's credential).
func ioSession(t *testing.T, e *testEnv, mode string) (string, *bus.Log, string) {
	t.Helper()
	id := e.do(t, "POST", "/v1/sessions", validCreate(set("apps", []any{body{"name": "web", "entryRelativePath": "telo.yaml", "io": mode}})), nil).created(t)
	return id, bus.NewLog(e.driver, bus.StreamIO, 100_000_000), bus.IOSubject(id, "web")
}

// dialIO opens /io and reads the seq control frame.
func dialIO(t *testing.T, e *testEnv, id string, lastSeq int) *websocket.Conn {
	t.Helper()
	url := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + id + "/io?lastSeq=" + strconv.Itoa(lastSeq)
	c, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatalf("dial /io: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	kind, data, err := c.ReadMessage()
	var f struct{ Type string }
	if err != nil || kind != websocket.TextMessage || json.Unmarshal(data, &f) != nil || f.Type != "seq" {
		t.Fatalf("first frame = %d %q %v, want the seq control frame", kind, data, err)
	}
	return c
}

// A client that stops reading holds a bounded amount of memory on the edge
// (its send queue and its hub follower; the rest stays in the log), is not
// cut off, and once it reads again gets every byte, in order, over the
// real WebSocket.
func TestIOSlowClientBoundedAndComplete(t *testing.T) {
	// The client reads nothing while the output is appended; keep the
	// edge's write deadline (the cut-off for a client that reads nothing at
	// all) out of the way on a loaded machine.
	old := ioWriteDeadline
	ioWriteDeadline = 2 * time.Minute
	defer func() { ioWriteDeadline = old }()
	e := newEnv(t, nil)
	id, log, subject := ioSession(t, e, "tty")
	c := dialIO(t, e, id, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	// 16 MiB in 64 KiB entries while the client reads nothing: far more
	// than the socket buffers and the edge's bound absorb.
	const entries, size = 256, 64 << 10
	chunk := make([]byte, size)
	chunk[0] = 0 // tty tag
	for i := range entries {
		binary.BigEndian.PutUint32(chunk[1:], uint32(i+1))
		if _, err := log.Append(ctx, subject, chunk, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until the edge filled everything it will fill: what it holds
	// for the socket stopped growing.
	held := settled(t, "the bytes the edge holds for a non-reading io client", e.srv.ioHeld.v.Load)
	bound := int64(ioSendQueue)*(size+5) + ioFollowBytes + size
	if held > bound {
		t.Errorf("a non-reading client held %d bytes on the edge, want <= %d", held, bound)
	}
	if held == 0 {
		t.Errorf("held = 0: the bound was not exercised")
	}
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	for want := uint32(1); want <= entries; want++ {
		kind, data, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("after seq %d: %v (a slow client must be slowed, not cut off)", want-1, err)
		}
		if kind != websocket.BinaryMessage {
			t.Fatalf("after seq %d: text frame %s", want-1, data)
		}
		if got := binary.BigEndian.Uint32(data); got != want || len(data) != 4+size || binary.BigEndian.Uint32(data[5:]) != want {
			t.Fatalf("frame seq %d (payload %d, %d bytes), want %d", got, binary.BigEndian.Uint32(data[5:]), len(data), want)
		}
	}
	t.Logf("a non-reading client held at most %d bytes (bound %d)", held, bound)
}

// Resize frames on a streams app are answered from the socket's reader
// goroutine while the main loop relays output to a client that is not
// reading. The handler's old "slow" flag was written by the reader and read
// by the loop without synchronisation (a data race under -race); the reply
// frames now wait for room like output does, and everything arrives.
func TestIOStreamsResizeWhileSlow(t *testing.T) {
	old := ioWriteDeadline
	ioWriteDeadline = 2 * time.Minute // the client reads nothing for a while
	defer func() { ioWriteDeadline = old }()
	e := newEnv(t, nil)
	id, log, subject := ioSession(t, e, "streams")
	c := dialIO(t, e, id, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	chunk := make([]byte, 64<<10)
	chunk[0] = 1 // stdout
	// Fill the socket (the client reads nothing yet).
	const output, more, resizes = 256, 16, 2000
	for range output {
		if _, err := log.Append(ctx, subject, chunk, nil); err != nil {
			t.Fatal(err)
		}
	}
	settled(t, "the bytes the edge holds for a non-reading io client", e.srv.ioHeld.v.Load)
	// Resize replies queue behind it, from the reader goroutine, while
	// more output meets the full queue in the main loop.
	wrote := make(chan error, 1)
	go func() {
		for range resizes {
			if err := c.WriteMessage(websocket.TextMessage, []byte(`{"type":"resize","cols":80,"rows":24}`)); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	for range more {
		if _, err := log.Append(ctx, subject, chunk, nil); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	frames, errs := 0, 0
	for frames < output+more || errs < resizes {
		kind, data, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("after %d frames and %d resize errors: %v", frames, errs, err)
		}
		if kind == websocket.BinaryMessage {
			frames++
			continue
		}
		if !strings.Contains(string(data), "resize_unsupported") {
			t.Fatalf("text frame %s", data)
		}
		errs++
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("write resize: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the resize writer did not finish")
	}
}

// settled waits until value stops changing (the same for 300 ms) and is
// not zero, failing after 30 s with what it waited for; it returns it.
func settled(t *testing.T, what string, value func() int64) int64 {
	t.Helper()
	last, since := value(), time.Now()
	if !testkit.Poll(context.Background(), 30*time.Second, func() bool {
		if v := value(); v != last {
			last, since = v, time.Now()
		}
		return last != 0 && time.Since(since) >= 300*time.Millisecond
	}) {
		t.Fatalf("%s did not settle within 30s (last %d)", what, last)
	}
	return last
}

// A terminal status event that JetStream refused (a stale writer's publish,
// seen on the subject's core traffic) does not end a live session's io
// socket: the record says the session is not terminal.
func TestIOIgnoresRefusedTerminalPublish(t *testing.T) {
	e := newEnv(t, nil)
	id, log, subject := ioSession(t, e, "tty")
	c := dialIO(t, e, id, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := nats.Header{}
	h.Set(bus.HeaderSeq, "999")
	h.Set(bus.HeaderType, "status")
	h.Set(bus.HeaderTerminal, "stopped")
	stale := &nats.Msg{Subject: bus.EventsSubject(id), Data: []byte(`{"type":"status","status":{"status":"stopped"}}`), Header: h}
	if _, err := e.driver.PublishMsg(ctx, stale, jetstream.WithExpectLastSequencePerSubject(1<<40)); err == nil {
		t.Fatal("the stale publish was stored")
	}
	if err := e.driverNC.Flush(); err != nil { // the server has routed it to the edge
		t.Fatal(err)
	}
	// A wrong drain closes the socket once it delivered the tail it saw:
	// each round trip gives it the chance, and the socket must outlive
	// them all.
	for i := range 5 {
		want := fmt.Sprint("after ", i)
		if _, err := log.Append(ctx, subject, []byte("\x00"+want), nil); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		kind, data, err := c.ReadMessage()
		if err != nil || kind != websocket.BinaryMessage || string(data[5:]) != want {
			t.Fatalf("read = %d %q %v, want %q appended after the refused terminal publish", kind, data, err, want)
		}
	}
}
