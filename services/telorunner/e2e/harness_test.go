// Package e2e drives the all-in-one runner the way the editor does: only
// over HTTP, SSE and WebSocket, against a real embedded NATS JetStream, the
// local backend and real devkernel processes.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"

	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

var devkernel, workspaceServer, hostile string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "telorunner-e2e-bin")
	if err != nil {
		panic(err)
	}
	_, file, _, _ := runtime.Caller(0)
	driverDir := filepath.Join(filepath.Dir(file), "..", "..", "pod-driver")
	// Named telo: Kubernetes watch app containers run sh -c '… exec telo …'
	// and the stand-in kubelet puts the image program's directory first on PATH.
	devkernel = filepath.Join(dir, "telo")
	build := exec.Command("go", "build", "-o", devkernel, "./cmd/devkernel")
	build.Dir = filepath.Join(filepath.Dir(file), "..", "..", "..", "tools", "devkernel")
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build devkernel: %v\n%s", err, out)
		os.Exit(1)
	}
	// The hostile test kernel of the local backend's sandbox tests.
	hostile = filepath.Join(dir, "hostile")
	build = exec.Command("go", "build", "-o", hostile, "./internal/backend/local/testdata/hostile")
	build.Dir = driverDir
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build hostile kernel: %v\n%s", err, out)
		os.Exit(1)
	}
	workspaceServer = filepath.Join(dir, "workspace-server")
	build = exec.Command("go", "build", "-o", workspaceServer, "./cmd/workspace-server")
	build.Dir = filepath.Join(filepath.Dir(file), "..", "..", "workspace-proxy")
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build workspace-server: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// runner is an all-in-one under test.
type runner struct {
	URL     string
	NATSURL string
	DataDir string
	stop    func()
	// bus validates what the runner's embedded bus stores against
	// docs/asyncapi.yaml (schema_test.go); nil on an external NATS.
	bus *busWatch
}

// env builds a lookup over defaults plus overrides.
func env(overrides map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := overrides[k]
		return v, ok
	}
}

// startRunner starts the all-in-one on a random port with its own data dir.
func startRunner(t *testing.T, vars map[string]string) *runner {
	t.Helper()
	dataDir := t.TempDir()
	if vars == nil {
		vars = map[string]string{}
	}
	if _, ok := vars["RUNNER_DATA_DIR"]; !ok {
		vars["RUNNER_DATA_DIR"] = dataDir
	}
	if _, ok := vars["RUNNER_KERNEL_COMMAND"]; !ok {
		vars["RUNNER_KERNEL_COMMAND"] = devkernel
	}
	vars["RUNNER_WORKSPACE_SERVER_COMMAND"] = workspaceServer
	return startRunnerWith(t, vars)
}

func startRunnerWith(t *testing.T, vars map[string]string) *runner {
	t.Helper()
	cfg, err := allinone.LoadConfig(env(vars))
	if err != nil {
		t.Fatalf("LoadConfig() = %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("E2E_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	go func() {
		done <- allinone.Run(ctx, cfg, allinone.Deps{Logger: logger, Listener: ln, Ready: func(_ net.Addr, natsURL string) { ready <- natsURL }})
	}()
	r := &runner{URL: "http://" + ln.Addr().String(), DataDir: vars["RUNNER_DATA_DIR"]}
	select {
	case r.NATSURL = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("runner exited early: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("runner not ready in 30s")
	}
	var stopped bool
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		if r.bus != nil {
			r.bus.close(t)
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("runner Run() = %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("runner did not stop within 60s")
		}
	}
	t.Cleanup(r.stop)
	if vars["RUNNER_NATS_URL"] == "" {
		r.bus = watchBus(t, r)
	}
	return r
}

// connect opens a bus connection as role with the seed the all-in-one
// generated in its data dir, closed when t ends.
func (r *runner) connect(t *testing.T, role string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	kp, err := bus.LoadSeed(bus.SeedFile(allinone.CredentialsDir(r.DataDir), role))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := bus.ClientOptions(role, kp, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(r.NATSURL, append(auth, opts...)...)
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// --- HTTP helpers ---

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
}

func do(t *testing.T, method, url string, body any, hdr map[string]string) response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: data}
}

// manifest renders a devkernel manifest the way Telo writes one: each port
// a name-keyed entry whose variable (portEnv) is unset in these sessions, so
// the kernel resolves it to its default.
func manifest(name string, ports []int, x map[string]any) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kind: Telo.Application\nmetadata:\n  name: %s\n  version: 1.0.0\n", name)
	if len(ports) > 0 {
		b.WriteString("ports:\n")
		for i, p := range ports {
			fmt.Fprintf(&b, "  %s: {env: %s, default: %d, protocol: tcp}\n", portName(i), portEnv(name, i), p)
		}
	}
	if len(x) > 0 {
		b.WriteString("x-devkernel:\n")
		for k, v := range x {
			fmt.Fprintf(&b, "  %s: %v\n", k, v)
		}
	}
	return b.String()
}

// portName is the manifest name of an app's i-th port: http, http2, ...
func portName(i int) string {
	if i == 0 {
		return "http"
	}
	return fmt.Sprintf("http%d", i+1)
}

// portEnv is the variable that supplies app name's i-th port:
// PORT_<NAME>_<PORTNAME>, upper case, with every other character an
// underscore.
func portEnv(name string, i int) string {
	up := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name+"_"+portName(i))
	return "PORT_" + up
}

func runBody(man string, ports []int, inspect bool) map[string]any {
	pm := []map[string]any{}
	for _, p := range ports {
		pm = append(pm, map[string]any{"port": p, "protocol": "tcp"})
	}
	return map[string]any{
		"bundle":  map[string]any{"entryRelativePath": "telo.yaml", "files": []map[string]any{{"relativePath": "telo.yaml", "contents": man}}},
		"env":     map[string]any{},
		"config":  map[string]any{"image": "telorun/node:latest-slim", "pullPolicy": "missing"},
		"ports":   pm,
		"inspect": inspect,
	}
}

type createdResp struct {
	SessionID string `json:"sessionId"`
	StreamURL string `json:"streamUrl"`
	CreatedAt string `json:"createdAt"`
}

func (r *runner) create(t *testing.T, body any) createdResp {
	t.Helper()
	resp := do(t, "POST", r.URL+"/v1/sessions", body, nil)
	if resp.Status != http.StatusCreated {
		t.Fatalf("POST /v1/sessions = %d %s, want 201", resp.Status, resp.Body)
	}
	var c createdResp
	resp.json(t, &c)
	return c
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	handedMu.Lock()
	defer handedMu.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close() // only the number is wanted
		// The kernel may hand a just-closed port out again: never give the
		// same one twice (two apps of one session would conflict).
		if !handed[port] {
			handed[port] = true
			return port
		}
	}
}

var (
	handedMu sync.Mutex
	handed   = map[int]bool{}
)

// --- SSE client ---

type sseEvent struct {
	ID    string
	Event string
	Data  string
}

type sseStream struct {
	url    string
	Header http.Header
	Events chan sseEvent
	cancel context.CancelFunc
	closed chan struct{}
}

// openSSE connects to a session's event stream; Events is closed when the
// server ends the response.
func openSSE(t *testing.T, url string, hdr map[string]string) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Accept", "text/event-stream")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET %s = %d %s", url, resp.StatusCode, body)
	}
	s := &sseStream{url: url, Header: resp.Header, Events: make(chan sseEvent, 4096), cancel: cancel, closed: make(chan struct{})}
	go func() {
		defer close(s.closed)
		defer close(s.Events)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.Event != "" || ev.Data != "" {
					s.Events <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"):
			case strings.HasPrefix(line, "id: "):
				ev.ID = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.Event = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.Data = line[6:]
			}
		}
	}()
	t.Cleanup(s.Close)
	return s
}

func (s *sseStream) Close() {
	s.cancel()
	<-s.closed
}

// next waits for the next event matching pred, failing after timeout. It
// returns every event seen on the way (including the match, last).
func (s *sseStream) until(t *testing.T, timeout time.Duration, pred func(sseEvent) bool) []sseEvent {
	t.Helper()
	var seen []sseEvent
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-s.Events:
			if !ok {
				t.Fatalf("stream ended before the expected event; saw %s", summarize(seen))
			}
			seen = append(seen, ev)
			if pred(ev) {
				return seen
			}
		case <-deadline:
			t.Fatalf("timed out waiting for an event; saw %s\n%s", summarize(seen), s.diagnose())
		}
	}
}

// diagnose says, for a wait that timed out, what the session's record
// says and what a fresh connection to the same stream gets within 3 s:
// events a new client sees but this one did not point at delivery, none
// at all at the writer.
func (s *sseStream) diagnose() string {
	base, _, _ := strings.Cut(s.url, "?")
	base = strings.TrimSuffix(base, "/events")
	out := "diagnosis: "
	if resp, err := http.Get(base); err != nil {
		out += fmt.Sprintf("GET %s: %v", base, err)
	} else {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		resp.Body.Close()
		out += fmt.Sprintf("GET %s = %d %s", base, resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url, nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out + fmt.Sprintf("; a fresh stream: %v", err)
	}
	defer resp.Body.Close()
	var ids []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var last []string
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "id: ") {
			ids = append(ids, line[4:])
		}
		if strings.HasPrefix(line, "data: ") {
			if last = append(last, line[6:]); len(last) > 3 {
				last = last[1:]
			}
		}
	}
	return out + fmt.Sprintf("; a fresh stream got %d events in 3 s (ids %v), the last: %s", len(ids), ids, strings.Join(last, " | "))
}

// untilAll waits until every predicate has matched an event, in any
// order, and returns every event seen. A workload's status and its
// kernel's events are not ordered against each other: on Kubernetes the
// kernel can report its first run before the pod's status turns the
// session running, so waiting for one and then the other can miss the
// second.
func (s *sseStream) untilAll(t *testing.T, timeout time.Duration, preds ...func(sseEvent) bool) []sseEvent {
	t.Helper()
	matched := make([]bool, len(preds))
	left := len(preds)
	return s.until(t, timeout, func(e sseEvent) bool {
		for i, p := range preds {
			if !matched[i] && p(e) {
				matched[i] = true
				left--
			}
		}
		return left == 0
	})
}

// lastMatch is the last event of evs that pred matches (fails t if none).
func lastMatch(t *testing.T, evs []sseEvent, pred func(sseEvent) bool) sseEvent {
	t.Helper()
	for i := len(evs) - 1; i >= 0; i-- {
		if pred(evs[i]) {
			return evs[i]
		}
	}
	t.Fatalf("no matching event among %s", summarize(evs))
	return sseEvent{}
}

// drain collects events until the server closes the stream.
func (s *sseStream) drain(t *testing.T, timeout time.Duration) []sseEvent {
	t.Helper()
	var seen []sseEvent
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-s.Events:
			if !ok {
				return seen
			}
			seen = append(seen, ev)
		case <-deadline:
			t.Fatalf("stream did not end within %v; saw %s", timeout, summarize(seen))
		}
	}
}

func summarize(evs []sseEvent) string {
	var parts []string
	for _, e := range evs {
		d := e.Data
		if len(d) > 160 {
			d = d[:160] + "…"
		}
		parts = append(parts, fmt.Sprintf("[%s %s %s]", e.ID, e.Event, d))
	}
	return strings.Join(parts, " ")
}

func isStatus(kind string) func(sseEvent) bool {
	return func(e sseEvent) bool {
		return e.Event == "status" && strings.Contains(e.Data, `"kind":"`+kind+`"`)
	}
}

func decode(t *testing.T, data string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		t.Fatalf("decode %q: %v", data, err)
	}
	return m
}

// --- io client ---

type ioFrame struct {
	Text    string // control frame
	Seq     uint32
	Tag     byte
	Payload []byte
}

type ioConn struct {
	*websocket.Conn
	Frames   chan ioFrame
	CloseErr chan error
}

func wsURL(base string) string { return "ws" + strings.TrimPrefix(base, "http") }

// openIO dials /io. Without an Origin in hdr it sends the one a page
// served from the runner's own loopback address would: the all-in-one's
// default allowlist (loopback origins) requires one (contract 7.2).
func openIO(t *testing.T, url string, hdr http.Header) *ioConn {
	t.Helper()
	if hdr.Get("Origin") == "" {
		hdr = hdr.Clone()
		if hdr == nil {
			hdr = http.Header{}
		}
		hdr.Set("Origin", "http"+strings.TrimPrefix(strings.SplitN(url, "/v1/", 2)[0], "ws"))
	}
	c, resp, err := websocket.DefaultDialer.Dial(url, hdr)
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", url, err, resp)
	}
	ic := &ioConn{Conn: c, Frames: make(chan ioFrame, 1<<14), CloseErr: make(chan error, 1)}
	go func() {
		defer close(ic.Frames)
		for {
			kind, data, err := c.ReadMessage()
			if err != nil {
				ic.CloseErr <- err
				return
			}
			if kind == websocket.TextMessage {
				ic.Frames <- ioFrame{Text: string(data)}
				continue
			}
			if len(data) < 5 {
				ic.CloseErr <- fmt.Errorf("short binary frame %d bytes", len(data))
				return
			}
			ic.Frames <- ioFrame{Seq: binary.BigEndian.Uint32(data[:4]), Tag: data[4], Payload: append([]byte(nil), data[5:]...)}
		}
	}()
	t.Cleanup(func() { _ = c.Close() })
	return ic
}

// next waits for one frame, failing after timeout with what it waited for.
func (c *ioConn) next(t *testing.T, timeout time.Duration, what string) ioFrame {
	t.Helper()
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case f, ok := <-c.Frames:
		if !ok {
			t.Fatalf("io closed while waiting for %s (%v)", what, <-c.CloseErr)
		}
		return f
	case <-tm.C:
		t.Fatalf("no io frame within %v while waiting for %s", timeout, what)
	}
	return ioFrame{}
}

// readUntil reads frames until the concatenated payload contains want.
func (c *ioConn) readUntil(t *testing.T, timeout time.Duration, want string) ([]ioFrame, string) {
	t.Helper()
	var frames []ioFrame
	var text strings.Builder
	deadline := time.After(timeout)
	for {
		select {
		case f, ok := <-c.Frames:
			if !ok {
				t.Fatalf("io closed before %q; got %q (%v)", want, text.String(), <-c.CloseErr)
			}
			frames = append(frames, f)
			text.Write(f.Payload)
			if strings.Contains(text.String(), want) {
				return frames, text.String()
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %q on io; got %q", want, text.String())
		}
	}
}

// closeCode waits for the socket to close and returns its close code.
func (c *ioConn) closeCode(t *testing.T, timeout time.Duration) (int, string, []ioFrame) {
	t.Helper()
	var frames []ioFrame
	deadline := time.After(timeout)
	for {
		select {
		case f, ok := <-c.Frames:
			if !ok {
				err := <-c.CloseErr
				if ce, ok := err.(*websocket.CloseError); ok {
					return ce.Code, ce.Text, frames
				}
				return -1, err.Error(), frames
			}
			frames = append(frames, f)
		case <-deadline:
			t.Fatalf("io socket not closed within %v", timeout)
		}
	}
}

// readStreams collects a streams app's stdout (tag 1) and stderr (tag 2)
// until each contains its want, failing after timeout.
func (c *ioConn) readStreams(t *testing.T, timeout time.Duration, wantOut, wantErr string) (stdout, stderr string) {
	t.Helper()
	var out, errOut strings.Builder
	deadline := time.After(timeout)
	for !strings.Contains(out.String(), wantOut) || !strings.Contains(errOut.String(), wantErr) {
		select {
		case f, ok := <-c.Frames:
			if !ok {
				t.Fatalf("io closed before its streams carried %q and %q; stdout %q stderr %q (%v)", wantOut, wantErr, out.String(), errOut.String(), <-c.CloseErr)
			}
			switch f.Tag {
			case 1:
				out.Write(f.Payload)
			case 2:
				errOut.Write(f.Payload)
			}
		case <-deadline:
			t.Fatalf("streams output: stdout %q stderr %q", out.String(), errOut.String())
		}
	}
	return out.String(), errOut.String()
}
