package bench

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
)

// Resume workspace: 1,000 files, about 10 MB (990 YAML-like text files of
// 10 KiB, ten 100 KiB binaries), two apps.
const (
	resumeTextFiles   = 990
	resumeTextSize    = 10 << 10
	resumeBinaryFiles = 10
	resumeBinarySize  = 100 << 10
)

// BenchmarkResume: POST /v1/sessions/:id/resume of an idle-suspended
// two-app watch session whose workspace is 1,000 files / about 10 MB, on
// the local backend, timed from the request to the moment the client has
// read both apps' `run started` on the session's SSE stream (issue 15's
// goal: ≤ 1 s). Each op waits, untimed, for the idle suspend (1 s idle,
// no client attached) and then resumes once; the first resume is a
// warm-up, not counted. The breakdown comes from the runner's own log
// records of each resume: loading the checkpoint manifest, the seed's
// fetches and change-set posts (summed over their parallel workers, so
// they overlap) and its wall time, and kernel start (from the seed's end
// to the client reading the last `run started`).
//
//	cd bench && go test -run '^$' -bench BenchmarkResume -benchtime 10x .
//
// BENCH_DEBUG=1 also prints every message the runner logs, with its time,
// to see where a slow resume spent its time.
func BenchmarkResume(b *testing.B) {
	logs := &captured{}
	r := startRunnerLog(b, map[string]string{"RUNNER_WATCH_SESSIONS": "true", "RUNNER_BODY_LIMIT_BYTES": "33554432",
		"RUNNER_WATCH_IDLE_SECONDS": "1", "RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "1", "RUNNER_SUPERVISOR_TICK_MS": "100"},
		slog.New(logs))
	files, total := resumeBundle()
	id := r.create(b, map[string]any{
		"mode":   "watch",
		"bundle": map[string]any{"entryRelativePath": "web/telo.yaml", "files": files},
		"env":    map[string]any{},
		"config": map[string]any{"image": "telorun/node:latest-slim", "pullPolicy": "missing"},
		"apps": []map[string]any{
			{"name": "web", "entryRelativePath": "web/telo.yaml", "io": "tty"},
			{"name": "worker", "entryRelativePath": "worker/telo.yaml", "io": "streams"},
		},
	})
	b.Logf("workspace: %d files, %.1f MB", len(files), float64(total)/1e6)

	// Read up to both apps' first run: each resume reads what follows.
	lastID := ""
	ctx, cancel := context.WithCancel(b.Context())
	events := openEvents(ctx, b, r.url+"/v1/sessions/"+id+"/events", "")
	for pending := map[string]bool{"web": true, "worker": true}; len(pending) > 0; {
		select {
		case ev, ok := <-events:
			if !ok {
				b.Fatal("event stream ended before both apps started")
			}
			lastID = ev.id
			if ev.Type == "run" && ev.Phase == "started" {
				delete(pending, ev.App)
			}
		case <-time.After(2 * time.Minute):
			b.Fatalf("apps %v not started within 2 minutes of the create", pending)
		}
	}
	cancel()
	var took, load, seed, fetch, post, kernel []time.Duration
	resume := func() {
		if !testkit.Poll(b.Context(), 2*time.Minute, func() bool { return r.status(b, id) == "suspended" }) {
			b.Fatalf("session %s not suspended: %s", id, r.status(b, id))
		}
		mark := logs.len()
		ctx, cancel := context.WithCancel(b.Context())
		defer cancel() // the stream closes: the idle clock runs again
		events := openEvents(ctx, b, r.url+"/v1/sessions/"+id+"/events", lastID)
		t0 := time.Now()
		if code, body := r.call(b, "POST", "/v1/sessions/"+id+"/resume"); code != http.StatusAccepted {
			b.Fatalf("resume = %d %s", code, body)
		}
		pending := map[string]bool{"web": true, "worker": true}
		deadline := time.After(time.Minute)
		var done time.Time
		for len(pending) > 0 {
			select {
			case ev, ok := <-events:
				if !ok {
					b.Fatal("event stream ended before both apps started")
				}
				lastID = ev.id
				if ev.Type == "run" && ev.Phase == "started" && pending[ev.App] {
					delete(pending, ev.App)
					done = time.Now()
				}
			case <-deadline:
				b.Fatalf("apps %v not started within a minute of the resume", pending)
			}
		}
		took = append(took, done.Sub(t0))
		manifest, ok1 := logs.find(mark, "checkpoint manifest loaded")
		seeded, ok2 := logs.find(mark, "workspace seeded")
		if !ok1 || !ok2 {
			b.Fatalf("the resume logged no manifest load (%v) or seed (%v): not a restore", ok1, ok2)
		}
		if n := seeded.attrs["written"].Int64(); n != int64(len(files))+1 {
			b.Fatalf("the seed wrote %d files, want %d (the workspace and the marker)", n, len(files)+1)
		}
		load = append(load, manifest.attrs["took"].Duration())
		seed = append(seed, seeded.attrs["took"].Duration())
		fetch = append(fetch, seeded.attrs["fetch"].Duration())
		post = append(post, seeded.attrs["post"].Duration())
		kernel = append(kernel, done.Sub(seeded.at))
	}
	resume() // warm-up, not counted
	took, load, seed, fetch, post, kernel = nil, nil, nil, nil, nil, nil
	for b.Loop() {
		resume()
	}
	latency(b, "resume → every app's run started (1,000 files / 10 MB, two apps)", "", took, 0.5, 0.95)
	latency(b, "  load the checkpoint manifest", "load-", load, 0.5)
	latency(b, "  seed, wall (fetch and post overlap)", "seed-", seed, 0.5)
	latency(b, "    fetch, summed over the parallel fetches", "fetch-", fetch, 0.5)
	latency(b, "    post change sets, summed over those in flight", "post-", post, 0.5)
	latency(b, "  kernel start: seed done → both run started read", "kernel-", kernel, 0.5)
}

// resumeBundle is the benchmark workspace as bundle files, and its bytes.
func resumeBundle() ([]map[string]any, int) {
	rnd := rand.New(rand.NewPCG(15, 15))
	files := []map[string]any{
		{"relativePath": "web/telo.yaml", "contents": "kind: Telo.Application\nmetadata:\n  name: web\n  version: 1.0.0\n"},
		{"relativePath": "worker/telo.yaml", "contents": "kind: Telo.Application\nmetadata:\n  name: worker\n  version: 1.0.0\n"},
	}
	total := 0
	for i := range resumeTextFiles - 2 {
		data := textFile(rnd, i, resumeTextSize)
		total += len(data)
		files = append(files, map[string]any{"relativePath": fmt.Sprintf("apps/app-%02d/src/module-%04d.yaml", i%25, i), "contents": string(data)})
	}
	for i := range resumeBinaryFiles {
		data := make([]byte, resumeBinarySize)
		for j := range data {
			data[j] = byte(rnd.Uint32())
		}
		total += len(data)
		files = append(files, map[string]any{"relativePath": fmt.Sprintf("assets/image-%02d.bin", i), "contents": base64.StdEncoding.EncodeToString(data), "encoding": "base64"})
	}
	return files, total
}

// sseEvent is one event of a session stream with the fields used here.
type sseEvent struct {
	id               string
	Type, Phase, App string
}

// openEvents streams the session's events after lastID ("" from the
// start) until ctx ends.
func openEvents(ctx context.Context, tb testing.TB, url, lastID string) <-chan sseEvent {
	tb.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		tb.Fatalf("GET events = %d", resp.StatusCode)
	}
	out := make(chan sseEvent, 256)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev)
			case line == "" && ev.id != "":
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
				ev = sseEvent{}
			}
		}
	}()
	return out
}

// captured is a slog.Handler keeping the records a benchmark reads.
type captured struct {
	mu    sync.Mutex
	recs  []record
	attrs []slog.Attr // of a derived handler
	root  *captured   // nil for the root
}

type record struct {
	msg   string
	at    time.Time
	attrs map[string]slog.Value
}

func (c *captured) base() *captured {
	if c.root != nil {
		return c.root
	}
	return c
}

func (c *captured) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (c *captured) Handle(_ context.Context, r slog.Record) error {
	if os.Getenv("BENCH_DEBUG") != "" {
		fmt.Fprintln(os.Stderr, r.Time.Format(time.StampMilli), r.Message)
	}
	if r.Message != "checkpoint manifest loaded" && r.Message != "workspace seeded" {
		return nil
	}
	rec := record{msg: r.Message, at: r.Time, attrs: map[string]slog.Value{}}
	for _, a := range c.attrs {
		rec.attrs[a.Key] = a.Value.Resolve()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Resolve()
		return true
	})
	root := c.base()
	root.mu.Lock()
	root.recs = append(root.recs, rec)
	root.mu.Unlock()
	return nil
}

func (c *captured) WithAttrs(as []slog.Attr) slog.Handler {
	return &captured{attrs: append(slices.Clone(c.attrs), as...), root: c.base()}
}

func (c *captured) WithGroup(string) slog.Handler { return c }

func (c *captured) len() int {
	root := c.base()
	root.mu.Lock()
	defer root.mu.Unlock()
	return len(root.recs)
}

// find returns the first record named msg from index from on.
func (c *captured) find(from int, msg string) (record, bool) {
	root := c.base()
	root.mu.Lock()
	defer root.mu.Unlock()
	for _, r := range root.recs[from:] {
		if r.msg == msg {
			return r, true
		}
	}
	return record{}, false
}
