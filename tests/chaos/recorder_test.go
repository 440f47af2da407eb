package chaos

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// The client's own accounting can fail: a server that repeats or skips
// SSE ids or io seqs across a resume is caught. (These run without the
// binaries: a plain HTTP server plays the edge.)

func TestRecorderCatchesRepeatedAndSkippedEventIDs(t *testing.T) {
	var resumes []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resumes = append(resumes, r.Header.Get("Last-Event-ID"))
		w.Header().Set("Content-Type", "text/event-stream")
		// First connection: ids 1, 2. The resume from 2 repeats 2, then skips 3.
		ids := []int{1, 2}
		if len(resumes) > 1 {
			ids = []int{2, 4}
		}
		for _, id := range ids {
			fmt.Fprintf(w, "id: %d\nevent: progress\ndata: {\"type\":\"progress\"}\n\n", id)
		}
		fmt.Fprint(w, "event: gap\ndata: {\"reason\":\"buffer_evicted\"}\n\n")
	}))
	defer srv.Close()
	s := &session{id: "s1", edges: []string{srv.URL}}
	ctx := context.Background()
	s.followEvents(ctx, srv.URL, 5*time.Second)
	s.followEvents(ctx, srv.URL, 5*time.Second)
	if strings.Join(resumes, ",") != ",2" {
		t.Fatalf("Last-Event-ID sent = %q, want none then 2", resumes)
	}
	got := strings.Join(s.checkLog(), "\n")
	for _, want := range []string{"SSE duplicate: id 2 again after 2", "SSE gap: ids 3..3 never sent", "SSE gap: gap frame"} {
		if !strings.Contains(got, want) {
			t.Errorf("checkLog misses %q:\n%s", want, got)
		}
	}
}

func TestRecorderCatchesRepeatedAndSkippedIOSeqs(t *testing.T) {
	var asked []string
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		last := r.URL.Query().Get("lastSeq")
		asked = append(asked, last)
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, `{"type":"seq","seq":%s,"app":"web","io":"tty"}`, last))
		seqs := []uint32{1, 2}
		if last != "0" {
			seqs = []uint32{2, 4} // repeats 2, skips 3
		}
		for _, n := range seqs {
			f := make([]byte, 5, 16)
			binary.BigEndian.PutUint32(f, n)
			_ = c.WriteMessage(websocket.BinaryMessage, append(f, "x"...))
		}
		_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, ""))
	}))
	defer srv.Close()
	s := &session{id: "s1", edges: []string{srv.URL}}
	c := &ioChan{app: "web"}
	s.io = map[string]*ioChan{"web": c}
	ctx := context.Background()
	c.follow(ctx, s, srv.URL, 5*time.Second)
	c.follow(ctx, s, srv.URL, 5*time.Second)
	if strings.Join(asked, ",") != "0,2" {
		t.Fatalf("lastSeq sent = %q, want 0 then 2", asked)
	}
	got := strings.Join(s.checkLog(), "\n")
	for _, want := range []string{"io web duplicate: seq 2 again after 2", "io web gap: seqs 3..3 never sent"} {
		if !strings.Contains(got, want) {
			t.Errorf("checkLog misses %q:\n%s", want, got)
		}
	}
}
