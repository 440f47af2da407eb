package devkernel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startInspect serves hub from an in-process test server.
func startInspect(t *testing.T, hub *Hub, heartbeat time.Duration) *httptest.Server {
	t.Helper()
	h := &InspectHandler{Hub: hub, Heartbeat: heartbeat}
	srv := httptest.NewUnstartedServer(h)
	srv.Start()
	h.SelfURL = srv.URL
	t.Cleanup(func() {
		hub.Close()
		srv.Close()
	})
	return srv
}

func TestInspectReplayThenLive(t *testing.T) {
	hub := NewHub(nil)
	srv := startInspect(t, hub, 20*time.Millisecond)
	for i := range 3 {
		hub.Event(fmt.Sprintf("Test.Before%d", i), nil)
	}
	hub.Log("stdout", "a line")

	c := dialEvents(t, strings.TrimPrefix(srv.URL, "http://"))
	if got := c.header.Get("Content-Type"); got != "text/event-stream" {
		t.Errorf("Content-Type = %q, want text/event-stream", got)
	}
	if got := c.header.Get("Access-Control-Allow-Origin"); got != "*" {
		t.Errorf("Access-Control-Allow-Origin = %q, want *", got)
	}
	c.waitEvent(t, "Test.Before2", 1)
	hub.Event("Test.After", map[string]int{"n": 1})
	frames := c.waitEvent(t, "Test.After", 1)

	want := []string{"Test.Before0", "Test.Before1", "Test.Before2", "Test.After"}
	if got := events(frames); !reflect.DeepEqual(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
	stampRE := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)
	for _, f := range frames {
		if !stampRE.MatchString(f.Timestamp) {
			t.Errorf("timestamp %q is not RFC 3339 UTC with ms", f.Timestamp)
		}
	}
	if f := frames[3]; f.Kind != "log" || f.Stream != "stdout" || f.Line != "a line" {
		t.Errorf("frame 3 = %+v, want the stdout log frame", f)
	}
	if f := frames[4]; f.Kind != "event" || f.Payload["n"] != 1.0 {
		t.Errorf("frame 4 = %s, want kind event with payload n=1", f.Raw)
	}
	if f := frames[0]; !strings.Contains(f.Raw, `"payload":{}`) {
		t.Errorf("frame 0 = %s, want an empty payload object", f.Raw)
	}
	waitUntil(t, waitLong, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.pings > 0
	}, "a heartbeat comment")

	hub.Close()
	waitUntil(t, waitLong, c.ended, "the stream to end after the hub closes")
}

func TestHubReplayKeepsLastFrames(t *testing.T) {
	hub := NewHub(nil)
	for i := range ReplayFrames + 5 {
		hub.Event("Test.N"+strconv.Itoa(i), nil)
	}
	replay, sub := hub.subscribe()
	defer hub.unsubscribe(sub)
	if len(replay) != ReplayFrames {
		t.Fatalf("len(replay) = %d, want %d", len(replay), ReplayFrames)
	}
	for i, want := range map[int]string{0: "Test.N5", ReplayFrames - 1: "Test.N" + strconv.Itoa(ReplayFrames+4)} {
		if !strings.Contains(string(replay[i]), `"event":"`+want+`"`) {
			t.Errorf("replay[%d] = %s, want event %s", i, replay[i], want)
		}
	}
}

func TestHubDropsSlowClient(t *testing.T) {
	hub := NewHub(nil)
	_, slow := hub.subscribe()
	_, fast := hub.subscribe()
	defer hub.unsubscribe(fast)
	got := 0
	for i := range clientQueue + 10 {
		hub.Event("Test.N"+strconv.Itoa(i), nil) // must not block
		select {
		case <-fast.ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d did not reach the fast client", i)
		}
		got++
	}
	n := 0
	for range slow.ch { // closed once dropped
		n++
	}
	if n != clientQueue {
		t.Errorf("slow client got %d frames before the drop, want %d", n, clientQueue)
	}
	if got != clientQueue+10 {
		t.Errorf("fast client got %d frames, want %d", got, clientQueue+10)
	}
}

func TestInspectVersionAndNotFound(t *testing.T) {
	hub := NewHub(nil)
	hub.SetPorts([]Port{{Name: "http", Port: 3000, Protocol: "tcp"}, {Name: "dns", Port: 53, Protocol: "udp"}})
	srv := startInspect(t, hub, 0)

	code, body := httpGet(t, srv.URL+"/json/version")
	if code != http.StatusOK {
		t.Fatalf("GET /json/version = %d, want 200", code)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	want := map[string]any{
		"protocol": "telo-debug", "protocolVersion": 1.0, "url": srv.URL,
		"events": "/events", "eventsLog": "/events.jsonl", "blobs": "/blobs/",
		"appEndpoints": []any{
			map[string]any{"host": "", "port": 3000.0, "protocol": "tcp"},
			map[string]any{"host": "", "port": 53.0, "protocol": "udp"},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GET /json/version = %v, want %v", got, want)
	}
	for _, path := range []string{"/", "/events.jsonl", "/blobs/x", "/json"} {
		if code, _ := httpGet(t, srv.URL+path); code != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, code)
		}
	}
}
