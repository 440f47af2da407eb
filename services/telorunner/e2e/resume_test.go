package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/api-edge/edge"
)

// edgeReplica is an api-edge replica on the runner's bus that a test can
// stop before it ends.
type edgeReplica struct {
	URL  string
	Stop func()
}

// startEdgeReplica runs an api-edge replica named id on r's NATS with the
// configuration vars; now, when set, is its reload budget's clock.
func startEdgeReplica(t *testing.T, r *runner, id string, vars map[string]string, now func() time.Time) *edgeReplica {
	t.Helper()
	cfg, err := edge.LoadConfig(env(vars))
	if err != nil {
		t.Fatal(err)
	}
	cfg.BaseImages.Enabled = false // the local backend runs no base images (as the all-in-one)
	nc := r.connect(t, bus.RoleEdge)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- edge.Run(ctx, cfg, edge.Deps{NC: nc, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Listener: ln, EdgeID: id, Now: now})
	}()
	var stopped bool
	e := &edgeReplica{URL: "http://" + ln.Addr().String()}
	e.Stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("edge %s Run() = %v", id, err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("edge %s did not stop within 60s", id)
		}
		nc.Close()
	}
	t.Cleanup(e.Stop)
	testkit.Eventually(t, 30*time.Second, func() bool {
		resp, err := http.Get(e.URL + "/v1/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "edge %s serving /v1/health", id)
	return e
}

// post sends an empty POST and returns the status and body, for goroutines
// that may not fail the test themselves.
func post(url string) (int, string, error) {
	resp, err := http.Post(url, "application/json", nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// reloader produces events on a watch session: each step reloads the app
// (POST reload) and waits, on its own event stream, for the generation the
// reload starts. It runs outside the test goroutine and reports through
// channels.
type reloader struct {
	t    *testing.T
	base string // the edge that takes the reloads
	id   string
	sse  *sseStream
	gen  int // the last generation seen started
}

func newReloader(t *testing.T, base, id string, gen int) *reloader {
	t.Helper()
	rl := &reloader{t: t, base: base, id: id, sse: openSSE(t, base+"/v1/sessions/"+id+"/events", nil)}
	// Catch up to the generation the caller saw started.
	rl.sse.until(t, 60*time.Second, isRun("app", "started", gen))
	rl.gen = gen
	return rl
}

// step reloads once and waits for the next generation to start.
func (rl *reloader) step() error {
	status, body, err := post(rl.base + "/v1/sessions/" + rl.id + "/reload")
	if err != nil {
		return err
	}
	if status != http.StatusAccepted {
		return fmt.Errorf("reload for generation %d = %d %s, want 202", rl.gen+1, status, body)
	}
	want := isRun("app", "started", rl.gen+1)
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-rl.sse.Events:
			if !ok {
				return fmt.Errorf("reloader's stream ended before generation %d started", rl.gen+1)
			}
			if want(ev) {
				rl.gen++
				return nil
			}
		case <-deadline:
			return fmt.Errorf("generation %d did not start within 30s of its reload", rl.gen+1)
		}
	}
}

// run reloads n times in the background; after the first `before` steps
// it waits for gate to close. The result arrives on the returned channel.
func (rl *reloader) run(n, before int, gate <-chan struct{}) <-chan error {
	out := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			if i == before {
				select {
				case <-gate:
				case <-time.After(60 * time.Second):
					out <- fmt.Errorf("the gate after step %d never opened", before)
					return
				}
			}
			if err := rl.step(); err != nil {
				out <- err
				return
			}
		}
		out <- nil
	}()
	return out
}

func waitErr(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("%s: not done within 3 minutes", what)
	}
}

// eventsAfter is the part of evs (a stream read from its start) after id
// last.
func eventsAfter(t *testing.T, evs []sseEvent, last int) []sseEvent {
	t.Helper()
	for i, e := range evs {
		if id, err := strconv.Atoi(e.ID); err == nil && id > last {
			return evs[i:]
		}
	}
	t.Fatalf("reference stream has no event after id %d: %s", last, summarize(evs))
	return nil
}

// sameEvents compares a resumed stream with the reference, event by event
// (id, type and data): no gap, no duplicate, order kept.
func sameEvents(t *testing.T, what string, got, want []sseEvent) {
	t.Helper()
	for i := 0; i < len(got) || i < len(want); i++ {
		switch {
		case i >= len(got):
			t.Fatalf("%s: missing event %d %+v (got %d events, want %d)\ngot  %s\nwant %s", what, i, want[i], len(got), len(want), summarize(got), summarize(want))
		case i >= len(want):
			t.Fatalf("%s: extra event %d %+v (got %d events, want %d)\ngot  %s\nwant %s", what, i, got[i], len(got), len(want), summarize(got), summarize(want))
		case got[i] != want[i]:
			t.Fatalf("%s: event %d = %+v, want %+v\ngot  %s\nwant %s", what, i, got[i], want[i], summarize(got), summarize(want))
		}
	}
}

// SSE resume with Last-Event-ID into a live stream (6.4): a client leaves
// mid-stream, events keep coming while it is away and while it resumes,
// and the resumed stream is exactly the reference stream's events after
// the resume point — on the same edge, and on a new edge after the one
// it read from was stopped.
func TestSSEResumeIntoLiveStream(t *testing.T) {
	budget := map[string]string{"RUNNER_WATCH_SESSIONS": "true", "RUNNER_WATCH_RELOAD_LIMIT": "1000"}
	r := watchRunner(t, budget)
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("live", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	// The reference: one client that never leaves.
	ref := openSSE(t, r.URL+c.StreamURL, nil)
	refEvents := ref.until(t, 60*time.Second, isRun("app", "started", 1))
	rl := newReloader(t, r.URL, c.SessionID, 1)

	// resume: a client on leave reads up to generation from, leaves; one
	// more generation happens while it is away; it resumes on resumeOn
	// while the reloader runs three more (the last two only once the
	// resumed stream is open). Its stream must be the reference's.
	resume := func(t *testing.T, leave *sseStream, from int, away func() (resumeOn string)) {
		evs := leave.until(t, 60*time.Second, isRun("app", "started", from))
		last, err := strconv.Atoi(evs[len(evs)-1].ID)
		if err != nil {
			t.Fatalf("event id %q", evs[len(evs)-1].ID)
		}
		resumeOn := away()
		if err := rl.step(); err != nil { // events the client must get replayed
			t.Fatal(err)
		}
		opened := make(chan struct{})
		done := rl.run(3, 1, opened)
		resumed := openSSE(t, resumeOn+c.StreamURL, map[string]string{"Last-Event-ID": strconv.Itoa(last)})
		close(opened)
		waitErr(t, done, "reloads while resumed")
		end := isRun("app", "started", rl.gen)
		got := resumed.until(t, 60*time.Second, end)
		refEvents = append(refEvents, ref.until(t, 60*time.Second, end)...)
		want := eventsAfter(t, refEvents, last)
		sameEvents(t, fmt.Sprintf("stream resumed after id %d", last), got, want)
		sseIDs(t, last, got)
		resumed.Close()
	}

	t.Run("same edge", func(t *testing.T) {
		a := openSSE(t, r.URL+c.StreamURL, nil)
		waitErr(t, rl.run(2, 2, nil), "reloads before the client leaves")
		resume(t, a, rl.gen, func() string {
			a.Close()
			return r.URL
		})
	})

	t.Run("after edge restart", func(t *testing.T) {
		vars := map[string]string{"RUNNER_WATCH_SESSIONS": "true", "RUNNER_WATCH_RELOAD_LIMIT": "1000"}
		e1 := startEdgeReplica(t, r, "edge-one", vars, nil)
		s := openSSE(t, e1.URL+c.StreamURL, nil)
		waitErr(t, rl.run(1, 1, nil), "reload before the edge stops")
		resume(t, s, rl.gen, func() string {
			e1.Stop()
			// The stopped edge ended the client's response.
			s.drain(t, 30*time.Second)
			return startEdgeReplica(t, r, "edge-two", vars, nil).URL
		})
	})
}

// ioLines writes lines prefix-from … prefix-to (each padded to about 100
// bytes) to c's stdin.
func ioLines(c *ioConn, prefix string, from, to int) error {
	for i := from; i <= to; i++ {
		line := fmt.Sprintf("%s-%03d-%s\n", prefix, i, strings.Repeat("x", 90))
		if err := c.WriteMessage(websocket.BinaryMessage, []byte(line)); err != nil {
			return fmt.Errorf("stdin line %d: %w", i, err)
		}
	}
	return nil
}

// ioEcho is the devkernel's echo of line i of prefix.
func ioEcho(prefix string, i int) string { return fmt.Sprintf("echo: %s-%03d-", prefix, i) }

// dataFrames keeps the data frames of fs.
func dataFrames(fs []ioFrame) []ioFrame {
	var out []ioFrame
	for _, f := range fs {
		if f.Text == "" {
			out = append(out, f)
		}
	}
	return out
}

// readToSeq reads c's frames until one with seq >= seq arrives.
func (c *ioConn) readToSeq(t *testing.T, timeout time.Duration, seq uint32) []ioFrame {
	t.Helper()
	var frames []ioFrame
	deadline := time.After(timeout)
	for {
		select {
		case f, ok := <-c.Frames:
			if !ok {
				t.Fatalf("io closed before seq %d (%v)", seq, <-c.CloseErr)
			}
			frames = append(frames, f)
			if f.Text == "" && f.Seq >= seq {
				return frames
			}
		case <-deadline:
			t.Fatalf("timed out waiting for io seq %d; got %d frames", seq, len(frames))
		}
	}
}

func lastSeq(fs []ioFrame) uint32 {
	for i := len(fs) - 1; i >= 0; i-- {
		if fs[i].Text == "" {
			return fs[i].Seq
		}
	}
	return 0
}

// io resume with lastSeq on a live session (7.2, 7.5): a client reads part
// of the output on edge A and leaves, output continues while it is away
// and while it resumes — on A, and on another edge B of the same bus —
// and every frame after lastSeq (seq and payload) is the reference
// client's, without gap or duplicate.
func TestIOResumeLiveSession(t *testing.T) {
	r := startRunner(t, nil)
	b := startEdgeReplica(t, r, "edge-b", map[string]string{}, nil)
	c := r.create(t, runBody(manifest("echoer", nil, nil), nil, true))
	openSSE(t, r.URL+c.StreamURL, nil).until(t, 60*time.Second, isStatus("running"))
	// The reference client reads everything and writes the session's
	// stdin: the kernel echoes each line, so output goes on as long as
	// lines are written.
	ref := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?lastSeq=0", nil)
	refFrames, _ := ref.readUntil(t, 30*time.Second, "tty=true")
	refFrames = dataFrames(refFrames)

	for _, tc := range []struct{ name, prefix, resumeOn string }{
		{"same edge", "same", r.URL},
		{"other edge", "other", b.URL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.prefix
			if err := ioLines(ref, p, 1, 20); err != nil {
				t.Fatal(err)
			}
			got, _ := ref.readUntil(t, 30*time.Second, ioEcho(p, 20))
			refFrames = append(refFrames, dataFrames(got)...)
			// Client A on edge A reads up to line 20 and leaves.
			a := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?lastSeq=0", nil)
			k := lastSeq(a.readToSeq(t, 30*time.Second, lastSeq(refFrames)))
			_ = a.Close()
			// Output while it is away.
			if err := ioLines(ref, p, 21, 40); err != nil {
				t.Fatal(err)
			}
			got, _ = ref.readUntil(t, 30*time.Second, ioEcho(p, 40))
			refFrames = append(refFrames, dataFrames(got)...)
			// Output while it resumes, the most of it once it is back.
			opened := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				if err := ioLines(ref, p, 41, 60); err != nil {
					done <- err
					return
				}
				select {
				case <-opened:
				case <-time.After(60 * time.Second):
					done <- fmt.Errorf("the resumed client never connected")
					return
				}
				done <- ioLines(ref, p, 61, 300)
			}()
			resumed := openIO(t, fmt.Sprintf("%s/v1/sessions/%s/io?lastSeq=%d", wsURL(tc.resumeOn), c.SessionID, k), nil)
			close(opened)
			waitErr(t, done, "stdin while resuming")
			rs, _ := resumed.readUntil(t, 60*time.Second, ioEcho(p, 300))
			got, _ = ref.readUntil(t, 60*time.Second, ioEcho(p, 300))
			refFrames = append(refFrames, dataFrames(got)...)
			// Both read to the same last frame.
			if l := lastSeq(rs); l < lastSeq(refFrames) {
				rs = append(rs, resumed.readToSeq(t, 30*time.Second, lastSeq(refFrames))...)
			} else if l > lastSeq(refFrames) {
				refFrames = append(refFrames, dataFrames(ref.readToSeq(t, 30*time.Second, l))...)
			}
			if len(rs) == 0 || rs[0].Text == "" || !strings.Contains(rs[0].Text, fmt.Sprintf(`"seq":%d,`, k)) {
				t.Fatalf("first frame after resume = %+v, want the seq control frame with seq %d", rs, k)
			}
			gotData := dataFrames(rs)
			var want []ioFrame
			for _, f := range refFrames {
				if f.Seq > k {
					want = append(want, f)
				}
			}
			if len(want) == 0 {
				t.Fatalf("no output after seq %d", k)
			}
			for i := 0; i < len(gotData) || i < len(want); i++ {
				switch {
				case i >= len(gotData):
					t.Fatalf("resumed after seq %d: frame %d (seq %d) missing; got %d frames, want %d", k, i, want[i].Seq, len(gotData), len(want))
				case i >= len(want):
					t.Fatalf("resumed after seq %d: extra frame %d (seq %d %q); got %d frames, want %d", k, i, gotData[i].Seq, gotData[i].Payload, len(gotData), len(want))
				case gotData[i].Seq != want[i].Seq || gotData[i].Tag != want[i].Tag || string(gotData[i].Payload) != string(want[i].Payload):
					t.Fatalf("resumed after seq %d: frame %d = seq %d tag %d %q, want seq %d tag %d %q", k, i, gotData[i].Seq, gotData[i].Tag, gotData[i].Payload, want[i].Seq, want[i].Tag, want[i].Payload)
				case gotData[i].Seq != k+uint32(i)+1:
					t.Fatalf("resumed after seq %d: frame %d has seq %d, want %d (no gap, no duplicate)", k, i, gotData[i].Seq, k+uint32(i)+1)
				}
			}
			_ = resumed.Close()
		})
	}
}
