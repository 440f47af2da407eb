package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
)

// The big workspace of issue 15: 10,000 files, 200 MB, one of them 50 MB.
const (
	bigFiles     = 10_000
	bigTotal     = 200 << 20
	bigOne       = 50 << 20
	bigWrite     = 20 << 20
	bigBatchSize = 6 << 20 // bytes of file content per POST while filling
)

// TestPrintBigWorkspace drives a watch session whose workspace is 10,000
// files / 200 MB with one 50 MB file through every operation that used to
// hit a size cliff: fill it over /v1, list its tree, read the big file, a
// 20 MB write, a manual checkpoint, an idle suspend, a resume and a PUT
// apps. Every step must succeed and leave the tree as written (it fails
// otherwise); it prints each step's time (n=1: one run) and the peak RSS
// of each service process and of the workspace server (the kernel's
// processes are the workload's, not ours).
func TestPrintBigWorkspace(t *testing.T) {
	r := startServiceRig(t, map[string][]string{
		"api-edge":        {"RUNNER_WATCH_SESSIONS=true", "RUNNER_WATCH_RELOAD_LIMIT=1000000"},
		"pod-driver":      {"LOG_LEVEL=info"},
		"workspace-proxy": {"LOG_LEVEL=info"},
		"supervisor":      {"RUNNER_WATCH_IDLE_SECONDS=3", "RUNNER_SUPERVISOR_TICK_MS=200", "RUNNER_WORKSPACE_CHECKPOINT_SECONDS=3600"},
	})
	peaks := watchPeaks(t, r)
	c := &bigClient{base: r.base, rig: r}
	man := func(name string) string {
		return "kind: Telo.Application\nmetadata:\n  name: " + name + "\n"
	}
	id := c.createWatch(t, map[string]string{"telo.yaml": man("big"), "b/telo.yaml": man("b")})
	awake := openBigEvents(t, r.base, id)
	awake.wait(t, 120*time.Second, `"phase":"started"`, `"app":"app"`)

	type step struct {
		name string
		took time.Duration
		note string
	}
	var steps []step
	timed := func(name string, f func() string) {
		t.Helper()
		start := time.Now()
		note := f()
		steps = append(steps, step{name, time.Since(start), note})
	}

	// Fill: 9,999 files of ~15 KB in change sets of ~6 MB, then the 50 MB one.
	want := map[string]string{} // path → sha256
	timed("fill 9,999 files (150 MB) over POST /workspace", func() string {
		per := (bigTotal - bigOne) / (bigFiles - 1)
		var batch []map[string]any
		size, posts := 0, 0
		for i := range bigFiles - 1 {
			p := fmt.Sprintf("src/d%02d/s%02d/f%05d.txt", i%100, (i/100)%10, i)
			content := bigText(i, per)
			batch = append(batch, map[string]any{"path": p, "content": content})
			want[p] = sha(content)
			if size += per; size >= bigBatchSize || i == bigFiles-2 {
				c.write(t, id, batch)
				batch, size = nil, 0
				posts++
			}
		}
		return fmt.Sprintf("%d POSTs", posts)
	})
	big := bigText(-1, bigOne)
	want["big/big.txt"] = sha(big)
	timed("write the 50 MB file (one POST)", func() string {
		c.write(t, id, []map[string]any{{"path": "big/big.txt", "content": big}})
		return "200"
	})
	var treeJSON string
	timed("GET /workspace (tree)", func() string {
		var n int
		treeJSON, n = c.tree(t, id, want)
		return fmt.Sprintf("%d files, %d KB", n, len(treeJSON)>>10)
	})
	timed("read the 50 MB file", func() string {
		code, body := c.do(t, "GET", "/v1/sessions/"+id+"/workspace/file?path=big/big.txt", nil)
		var f struct {
			Content string `json:"content"`
			Size    int    `json:"size"`
		}
		if code != 200 || json.Unmarshal(body, &f) != nil {
			t.Fatalf("read big/big.txt = %d %.200s", code, body)
		}
		if f.Size != bigOne || sha(f.Content) != want["big/big.txt"] {
			t.Fatalf("read big/big.txt: size %d, content hash %s; want %d, %s", f.Size, sha(f.Content), bigOne, want["big/big.txt"])
		}
		return fmt.Sprintf("%d bytes, content equal", f.Size)
	})
	timed("write a 20 MB file", func() string {
		content := bigText(-2, bigWrite)
		want["w/write20.txt"] = sha(content)
		c.write(t, id, []map[string]any{{"path": "w/write20.txt", "content": content}})
		var n int
		treeJSON, n = c.tree(t, id, want)
		return fmt.Sprintf("tree now %d files", n)
	})
	timed("POST checkpoints (manual)", func() string {
		code, body := c.do(t, "POST", "/v1/sessions/"+id+"/checkpoints", map[string]any{})
		if code != http.StatusCreated {
			t.Fatalf("checkpoint = %d %s", code, body)
		}
		return strings.TrimSpace(string(body))
	})
	timed("idle suspend (last client gone → suspended)", func() string {
		awake.close()
		c.waitStatus(t, id, "suspended", 10*time.Minute)
		return "suspended"
	})
	timed("resume (POST → running, tree equal)", func() string {
		if code, body := c.do(t, "POST", "/v1/sessions/"+id+"/resume", nil); code != http.StatusAccepted {
			t.Fatalf("resume = %d %s", code, body)
		}
		awake = openBigEvents(t, r.base, id)
		c.waitStatus(t, id, "running", 3*time.Minute)
		if got, _ := c.tree(t, id, want); got != treeJSON {
			t.Fatal("tree after resume differs from the tree before the suspend")
		}
		return "tree equal"
	})
	timed("PUT apps (→ new app started, tree equal)", func() string {
		put := map[string]any{"apps": []map[string]any{{"name": "app", "entryRelativePath": "telo.yaml"}, {"name": "b", "entryRelativePath": "b/telo.yaml"}}}
		if code, body := c.do(t, "PUT", "/v1/sessions/"+id+"/apps", put); code != http.StatusAccepted {
			t.Fatalf("PUT apps = %d %s", code, body)
		}
		awake.wait(t, 10*time.Minute, `"phase":"started"`, `"app":"b"`)
		if got, _ := c.tree(t, id, want); got != treeJSON {
			t.Fatal("tree after PUT apps differs from the tree before it")
		}
		return "tree equal"
	})
	awake.close()

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "big workspace: %d files, %d MB (one %d MB file); n=1 (one run of each step)\t\t\n", len(want), (bigTotal+bigWrite)>>20, bigOne>>20)
	for _, s := range steps {
		fmt.Fprintf(tw, "%s\t%v\t%s\n", s.name, s.took.Round(time.Millisecond), s.note)
	}
	_ = tw.Flush()
	fmt.Println("peak RSS (VmHWM) of each process over the whole run:")
	for _, name := range peaks.names() {
		fmt.Printf("  %-18s %6.1f MiB\n", name, float64(peaks.get(name))/(1<<20))
	}
}

// bigText is size bytes of text, different for each i.
func bigText(i, size int) string {
	var b strings.Builder
	b.Grow(size + 64)
	for line := 0; b.Len() < size; line++ {
		fmt.Fprintf(&b, "file %d line %06d: the quick brown fox jumps over the lazy dog\n", i, line)
	}
	return b.String()[:size]
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// bigClient is a /v1 client for the big workspace.
type bigClient struct {
	base string
	rig  *memRig
}

func (c *bigClient) do(tb testing.TB, method, path string, body any) (int, []byte) {
	tb.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			tb.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		tb.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read: %v", method, path, err)
	}
	return resp.StatusCode, data
}

func (c *bigClient) createWatch(tb testing.TB, files map[string]string) string {
	tb.Helper()
	var fl []map[string]any
	for p, content := range files {
		fl = append(fl, map[string]any{"relativePath": p, "contents": content})
	}
	code, body := c.do(tb, "POST", "/v1/sessions", map[string]any{
		"mode":   "watch",
		"bundle": map[string]any{"entryRelativePath": "telo.yaml", "files": fl},
		"env":    map[string]any{},
		"config": map[string]any{"image": "telorun/node:latest-slim", "pullPolicy": "missing"},
		"apps":   []map[string]any{{"name": "app", "entryRelativePath": "telo.yaml"}},
	})
	var created struct{ SessionID string }
	if code != http.StatusCreated || json.Unmarshal(body, &created) != nil {
		tb.Fatalf("create = %d %s", code, body)
	}
	return created.SessionID
}

func (c *bigClient) write(tb testing.TB, id string, writes []map[string]any) {
	tb.Helper()
	if code, body := c.do(tb, "POST", "/v1/sessions/"+id+"/workspace", map[string]any{"write": writes}); code != 200 {
		tb.Fatalf("POST workspace (%d files) = %d %.300s", len(writes), code, body)
	}
}

// tree lists the workspace and checks every file of want is in it with
// its hash; it returns the listing and its file count.
func (c *bigClient) tree(tb testing.TB, id string, want map[string]string) (string, int) {
	tb.Helper()
	code, body := c.do(tb, "GET", "/v1/sessions/"+id+"/workspace", nil)
	var doc struct {
		Files []struct{ Path, Hash string } `json:"files"`
	}
	if code != 200 || json.Unmarshal(body, &doc) != nil {
		tb.Fatalf("GET workspace = %d %.300s", code, body)
	}
	have := make(map[string]string, len(doc.Files))
	for _, f := range doc.Files {
		have[f.Path] = f.Hash
	}
	for p, h := range want {
		if have[p] != h {
			tb.Fatalf("tree: %s has hash %q, want %s (%d files listed)", p, have[p], h, len(doc.Files))
		}
	}
	return string(body), len(doc.Files)
}

func (c *bigClient) waitStatus(tb testing.TB, id, kind string, within time.Duration) {
	tb.Helper()
	var last string
	ok := testkit.Poll(context.Background(), within, func() bool {
		code, body := c.do(tb, "GET", "/v1/sessions/"+id, nil)
		var doc struct {
			Status struct{ Kind string } `json:"status"`
		}
		if code != 200 || json.Unmarshal(body, &doc) != nil {
			last = fmt.Sprintf("%d %.200s", code, body)
			return false
		}
		last = string(body)
		if doc.Status.Kind == "failed" && kind != "failed" {
			tb.Fatalf("session %s failed while waiting for %s: %s", id, kind, body)
		}
		return doc.Status.Kind == kind
	})
	if !ok {
		tb.Fatalf("session %s not %s within %v (last: %s)%s", id, kind, within, last, c.dump())
	}
}

// dump saves each service's goroutines (pprof) for a wait that failed.
func (c *bigClient) dump() string {
	if c.rig == nil {
		return ""
	}
	out := "; goroutines of each service in"
	for svc, ops := range c.rig.ops {
		resp, err := http.Get(ops + "/debug/pprof/goroutine?debug=2")
		if err != nil {
			continue
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		f := filepath.Join(os.TempDir(), "bigworkspace-goroutines-"+svc+".txt")
		if os.WriteFile(f, data, 0o644) == nil {
			out += " " + f
		}
	}
	return out
}

// bigEvents is an open SSE stream of one session (it holds the session
// awake: presence).
type bigEvents struct {
	lines  chan string
	cancel context.CancelFunc
	done   chan struct{}
}

func openBigEvents(tb testing.TB, base, id string) *bigEvents {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/sessions/"+id+"/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		cancel()
		tb.Fatalf("GET events: %v %v", err, resp)
	}
	e := &bigEvents{lines: make(chan string, 1<<16), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		defer close(e.lines)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "data: ") {
				e.lines <- line[6:]
			}
		}
	}()
	tb.Cleanup(e.close)
	return e
}

// wait reads events until one contains every part.
func (e *bigEvents) wait(tb testing.TB, within time.Duration, parts ...string) {
	tb.Helper()
	deadline := time.After(within)
	for {
		select {
		case line, ok := <-e.lines:
			if !ok {
				tb.Fatalf("event stream ended before an event with %q", parts)
			}
			match := true
			for _, p := range parts {
				match = match && strings.Contains(line, p)
			}
			if match {
				return
			}
		case <-deadline:
			tb.Fatalf("no event with %q within %v", parts, within)
		}
	}
}

func (e *bigEvents) close() { e.cancel(); <-e.done }

// peaks samples the peak RSS (VmHWM) of each service process and of every
// workspace-server process (each incarnation), every 100 ms until tb ends.
type peaks struct {
	mu sync.Mutex
	by map[string]int64
}

func (p *peaks) note(name string, v int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.by[name] = max(p.by[name], v)
}

func (p *peaks) get(name string) int64 { p.mu.Lock(); defer p.mu.Unlock(); return p.by[name] }

func (p *peaks) names() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := append([]string{}, services...)
	if _, ok := p.by["workspace-server"]; ok {
		out = append(out, "workspace-server")
	}
	return out
}

func watchPeaks(tb testing.TB, r *memRig) *peaks {
	p := &peaks{by: map[string]int64{}}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	sample := func() {
		for name, pr := range r.procs {
			if v := vmHWM(pr.cmd.Process.Pid); v > 0 {
				p.note(name, v)
			}
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/exe")
		for _, exe := range procs {
			if target, err := os.Readlink(exe); err == nil && target == serverBin {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(exe)))
				if v := vmHWM(pid); v > 0 {
					p.note("workspace-server", v)
				}
			}
		}
	}
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			sample()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	tb.Cleanup(func() { cancel(); <-stopped })
	return p
}

// vmHWM is a process's peak resident set in bytes (0 when it is gone).
func vmHWM(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
