package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

// runner is the all-in-one, in this process, on a random port.
type runner struct {
	url, natsURL string
	dataDir      string
}

func startRunner(tb testing.TB, vars map[string]string) runner {
	tb.Helper()
	return startRunnerLog(tb, vars, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// startRunnerLog is startRunner with the all-in-one logging to log.
func startRunnerLog(tb testing.TB, vars map[string]string, log *slog.Logger) runner {
	tb.Helper()
	vars["RUNNER_DATA_DIR"] = tb.TempDir()
	vars["RUNNER_KERNEL_COMMAND"] = kernelBin
	vars["RUNNER_WORKSPACE_SERVER_COMMAND"] = serverBin
	cfg, err := allinone.LoadConfig(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- allinone.Run(ctx, cfg, allinone.Deps{Logger: log, Listener: ln,
			Ready: func(_ net.Addr, u string) { ready <- u }})
	}()
	r := runner{url: "http://" + ln.Addr().String(), dataDir: vars["RUNNER_DATA_DIR"]}
	select {
	case r.natsURL = <-ready:
	case err := <-done:
		tb.Fatalf("runner: %v", err)
	}
	tb.Cleanup(func() { cancel(); <-done })
	return r
}

func (r runner) create(tb testing.TB, body any) string {
	tb.Helper()
	data, _ := json.Marshal(body)
	resp, err := http.Post(r.url+"/v1/sessions", "application/json", strings.NewReader(string(data)))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct{ SessionID string }
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 || json.Unmarshal(b, &c) != nil {
		tb.Fatalf("create = %d %s", resp.StatusCode, b)
	}
	return c.SessionID
}

func runSession(man string, inspect bool) map[string]any {
	return map[string]any{
		"bundle":  map[string]any{"entryRelativePath": "telo.yaml", "files": []map[string]any{{"relativePath": "telo.yaml", "contents": man}}},
		"env":     map[string]any{},
		"config":  map[string]any{"image": "telorun/node:latest-slim", "pullPolicy": "missing"},
		"inspect": inspect,
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSSEFanout: 1,000 SSE subscribers on one session; each sample
// appends one event and waits until every subscriber has it. Reported: the
// delivery latency to the last subscriber, fanoutEvents samples an
// iteration. Each subscriber's deliveries are checked on their own: every
// event exactly once and in order (a duplicate or a miss at any one
// subscriber fails the benchmark), SSE ids increasing, every data line
// JSON. One untimed event first (every subscriber connected and
// delivering), and one after the last timed one, so a late duplicate of
// the last timed event is caught too.
func BenchmarkSSEFanout(b *testing.B) {
	const subscribers = 1000
	r := startRunner(b, map[string]string{"RUNNER_WATCH_SESSIONS": "true"})
	id := r.create(b, runSession("kind: Telo.Application\nmetadata:\n  name: quiet\n", true))
	// Events are appended as the driver does, with its credential.
	kp, err := bus.LoadSeed(bus.SeedFile(allinone.CredentialsDir(r.dataDir), bus.RoleDriver))
	if err != nil {
		b.Fatal(err)
	}
	auth, err := bus.ClientOptions(bus.RoleDriver, kp, nil)
	if err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(r.natsURL, auth...)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store, err := session.Open(context.Background(), js, 5_000_000)
	if err != nil {
		b.Fatal(err)
	}
	// Let the session settle (running, kernel started) so only our events flow.
	settled := func() bool {
		r, err := store.Events().Tail(context.Background(), "runner.evt."+id)
		rec, _, gerr := store.Get(context.Background(), id)
		return err == nil && gerr == nil && rec.Status.Kind == contract.StatusRunning && r > 0
	}
	if !testkit.Poll(context.Background(), 30*time.Second, settled) {
		b.Fatal("session did not reach running")
	}
	tr := &http.Transport{MaxIdleConnsPerHost: subscribers, MaxConnsPerHost: 0}
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tail, err := store.Events().Tail(ctx, "runner.evt."+id)
	if err != nil {
		b.Fatal(err)
	}
	// round is the event being delivered: how many subscribers have it,
	// closed when all do.
	var mu sync.Mutex
	var cur, have int
	var done chan struct{}
	var missing []bool
	errs := make(chan error, subscribers)
	var wg sync.WaitGroup
	for s := range subscribers {
		req, _ := http.NewRequestWithContext(ctx, "GET", r.url+"/v1/sessions/"+id+"/events?lastEventId="+fmt.Sprint(tail), nil)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			defer resp.Body.Close()
			next := 0 // the mark this subscriber must see next
			var lastID uint64
			fail := func(format string, args ...any) {
				errs <- fmt.Errorf("subscriber %d: "+format, append([]any{s}, args...)...)
			}
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				if v, ok := strings.CutPrefix(line, "id: "); ok {
					n, err := strconv.ParseUint(v, 10, 64)
					if err != nil || n <= lastID {
						fail("SSE id %q after %d", v, lastID)
						return
					}
					lastID = n
					continue
				}
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok {
					continue
				}
				var ev struct{ Message string }
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					fail("data %q: %v", data, err)
					return
				}
				v, ok := strings.CutPrefix(ev.Message, "bench-mark-")
				if !ok {
					continue
				}
				k, err := strconv.Atoi(v)
				if err != nil || k != next {
					fail("got mark %q, want %d (each event exactly once, in order)", v, next)
					return
				}
				next++
				mu.Lock()
				if k == cur && missing[s] {
					missing[s] = false
					if have++; have == subscribers {
						close(done)
					}
				}
				mu.Unlock()
			}
			if ctx.Err() == nil {
				fail("stream ended after %d marks: %v", next, sc.Err())
			}
		})
	}
	// deliver appends mark i and returns when every subscriber has it.
	deliver := func(i int) time.Duration {
		mu.Lock()
		cur, have, done, missing = i, 0, make(chan struct{}), make([]bool, subscribers)
		for s := range missing {
			missing[s] = true
		}
		ch := done
		mu.Unlock()
		t0 := time.Now()
		if _, err := store.Emit(ctx, id, contract.Event{Type: contract.EventProgress, Phase: "boot", Message: fmt.Sprintf("bench-mark-%08d", i)}); err != nil {
			b.Fatal(err)
		}
		select {
		case <-ch:
			return time.Since(t0)
		case err := <-errs:
			b.Fatal(err)
		case <-time.After(30 * time.Second):
			mu.Lock()
			var lost []int
			for s, m := range missing {
				if m && len(lost) < 10 {
					lost = append(lost, s)
				}
			}
			b.Fatalf("event %d reached %d of %d subscribers within 30 s (first missing: %v)", i, have, subscribers, lost)
		}
		return 0
	}
	deliver(0) // warm-up: every subscriber delivering
	var lat []time.Duration
	for b.Loop() {
		for range fanoutEvents {
			lat = append(lat, deliver(len(lat)+1))
		}
	}
	deliver(len(lat) + 1) // a late duplicate of the last timed event would arrive before this one
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	latency(b, fmt.Sprintf("one event to all %d subscribers (each checked: every event once, in order)", subscribers), "", lat, 0.5, 0.95)
}

// fanoutEvents is BenchmarkSSEFanout's samples per iteration: p95 needs
// 100 samples, -benchtime=3x gives 102.
const fanoutEvents = 34

// BenchmarkEditToRun: an editor saves a manifest through
// POST /v1/sessions/:id/workspace and waits for the app's `run started`
// event on its SSE stream, editsPerIteration samples an iteration after
// one untimed edit. The devkernel's own file-watch poll (50 ms) and
// debounce (100 ms) are part of the edit-to-run figure; runner- is the
// runner's own share: the POST's round trip (the file is written when it
// returns) plus the time from the kernel stamping Kernel.Starting to the
// editor reading `run started` (relay, projection, JetStream, SSE). Every
// data line must parse as JSON and every `run started` follow a
// Kernel.Starting: anything else fails the benchmark.
func BenchmarkEditToRun(b *testing.B) {
	r := startRunner(b, map[string]string{"RUNNER_WATCH_SESSIONS": "true", "RUNNER_WATCH_RELOAD_LIMIT": "100000"})
	man := "kind: Telo.Application\nmetadata:\n  name: edit\n"
	body := map[string]any{
		"mode":   "watch",
		"bundle": map[string]any{"entryRelativePath": "telo.yaml", "files": []map[string]any{{"relativePath": "telo.yaml", "contents": man}}},
		"env":    map[string]any{}, "config": map[string]any{"image": "telorun/node:latest-slim", "pullPolicy": "missing"},
		"apps": []map[string]any{{"name": "app", "entryRelativePath": "telo.yaml"}},
	}
	id := r.create(b, body)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", r.url+"/v1/sessions/"+id+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	type runStarted struct {
		gen int
		lag time.Duration // kernel's Kernel.Starting stamp → this event read
		err error
	}
	started := make(chan runStarted, 64)
	go func() {
		defer close(started)
		fail := func(err error) {
			if ctx.Err() == nil {
				started <- runStarted{err: err}
			}
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var stamp time.Time
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev struct {
				Type, Phase string
				Generation  int
				Frame       struct {
					Event     string
					Timestamp time.Time
				}
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				fail(fmt.Errorf("event %s: %v", data, err))
				return
			}
			if ev.Frame.Event == "Kernel.Starting" {
				if ev.Frame.Timestamp.IsZero() {
					fail(fmt.Errorf("Kernel.Starting with no timestamp: %s", data))
					return
				}
				stamp = ev.Frame.Timestamp
			}
			if ev.Type == "run" && ev.Phase == "started" {
				if stamp.IsZero() {
					fail(fmt.Errorf("run started with no Kernel.Starting before it: %s", data))
					return
				}
				started <- runStarted{gen: ev.Generation, lag: time.Since(stamp)}
				stamp = time.Time{}
			}
		}
		fail(fmt.Errorf("event stream ended: %v", sc.Err()))
	}()
	next := func(want int) runStarted {
		select {
		case s := <-started:
			if s.err != nil {
				b.Fatal(s.err)
			}
			if s.gen != want {
				b.Fatalf("run started generation %d, want %d", s.gen, want)
			}
			return s
		case <-time.After(30 * time.Second):
			b.Fatalf("no run started of generation %d within 30 s", want)
		}
		return runStarted{}
	}
	next(1)
	gen := 1
	edit := func() (all, own time.Duration) {
		gen++
		e := fmt.Sprintf(`{"write":[{"path":"telo.yaml","content":%q}]}`, man+fmt.Sprintf("# edit %d\n", gen))
		t0 := time.Now()
		wr, err := http.Post(r.url+"/v1/sessions/"+id+"/workspace", "application/json", strings.NewReader(e))
		if err != nil {
			b.Fatalf("write: %v", err)
		}
		wr.Body.Close()
		if wr.StatusCode != 200 {
			b.Fatalf("write = %d", wr.StatusCode)
		}
		post := time.Since(t0)
		s := next(gen)
		return time.Since(t0), post + s.lag
	}
	edit() // warm-up, not counted
	var lat, own []time.Duration
	for b.Loop() {
		for range editsPerIteration {
			l, o := edit()
			lat, own = append(lat, l), append(own, o)
		}
	}
	latency(b, "edit → run started", "", lat, 0.5, 0.95)
	latency(b, "the runner's share (POST round trip + Kernel.Starting → run started read)", "runner-", own, 0.5, 0.95)
}

// editsPerIteration is BenchmarkEditToRun's samples per iteration: p95
// needs 100 samples, -benchtime=3x gives 102.
const editsPerIteration = 34
