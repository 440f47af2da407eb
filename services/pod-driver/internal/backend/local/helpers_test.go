package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// waitTimeout bounds every wait of these tests.
const waitTimeout = 60 * time.Second // a bound for a loaded 2-core machine: CI saw 20 s run out

// devkernelPath is the devkernel binary built by TestMain.
var devkernelPath string

// sandboxInitPath is the telorunner-sandbox program built by TestMain:
// every backend of these tests runs its sandboxes through it, as make
// build's install does (TestSandboxSelfInit covers the fallback).
var sandboxInitPath string

// hostilePath is the hostile test kernel (testdata/hostile) built by
// TestMain.
var hostilePath string

// workspaceServerPath is the workspace-server binary built by TestMain;
// empty when it could not be built (workspaceServerErr says why).
var (
	workspaceServerPath string
	workspaceServerErr  error
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(prebuiltEnv); dir != "" {
		// Re-run as an unprivileged user (TestSandboxUnprivileged): the
		// binaries were built by the parent run.
		devkernelPath = filepath.Join(dir, "devkernel")
		hostilePath = filepath.Join(dir, "hostile")
		workspaceServerPath = filepath.Join(dir, "workspace-server")
		sandboxInitPath = filepath.Join(dir, "telorunner-sandbox")
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "local-backend-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create temp dir:", err)
		os.Exit(1)
	}
	devkernelPath = filepath.Join(dir, "devkernel")
	build := exec.Command("go", "build", "-o", devkernelPath, "./cmd/devkernel")
	build.Dir = filepath.Join("..", "..", "..", "..", "..", "tools", "devkernel")
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build devkernel: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	sandboxInitPath = filepath.Join(dir, "telorunner-sandbox")
	build = exec.Command("go", "build", "-o", sandboxInitPath, "./cmd/telorunner-sandbox")
	build.Dir = filepath.Join("..", "..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build telorunner-sandbox: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	hostilePath = filepath.Join(dir, "hostile")
	build = exec.Command("go", "build", "-o", hostilePath, "./testdata/hostile")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build hostile kernel: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	workspaceServerPath, workspaceServerErr = buildWorkspaceServer(dir)
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildWorkspaceServer builds workspace-server from its own module (it
// lives in services/workspace-proxy) into dir.
func buildWorkspaceServer(dir string) (string, error) {
	path := filepath.Join(dir, "workspace-server")
	build := exec.Command("go", "build", "-o", path, "./cmd/workspace-server")
	build.Dir = filepath.Join("..", "..", "..", "..", "workspace-proxy")
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build workspace-server: %v\n%s", err, out)
	}
	return path, nil
}

// recorder is a backend.Sink that keeps everything it is given.
type recorder struct {
	wake chan struct{} // capacity 1: something was recorded

	mu        sync.Mutex
	out       map[outKey][]byte
	running   [][]contract.Endpoint
	debug     []json.RawMessage
	debugBy   map[string][]json.RawMessage // by app
	reach     []reachEvent
	ended     []endEvent
	endedAt   []time.Time
	progress  []progressEvent
	workspace []string // WorkspaceReady URLs
	onReady   func()   // called by WorkspaceReady first, when set
}

type progressEvent struct {
	phase, message string
	done           bool
	app            string
}

type outKey struct {
	app string
	tag byte
}

type reachEvent struct {
	app   string
	port  int
	state string
}

type endEvent struct {
	app    string
	code   *int
	reason string
}

func newRecorder() *recorder {
	return &recorder{wake: make(chan struct{}, 1), out: make(map[outKey][]byte), debugBy: make(map[string][]json.RawMessage)}
}

func (r *recorder) record(f func()) {
	r.mu.Lock()
	f()
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *recorder) Progress(phase, message string, done bool, app string) {
	r.record(func() { r.progress = append(r.progress, progressEvent{phase, message, done, app}) })
}
func (r *recorder) WorkspaceReady(url string) {
	if r.onReady != nil {
		r.onReady()
	}
	r.record(func() { r.workspace = append(r.workspace, url) })
}
func (r *recorder) Running(eps []contract.Endpoint, _ *contract.Endpoint) {
	r.record(func() { r.running = append(r.running, slices.Clone(eps)) })
}
func (r *recorder) Output(app string, tag byte, p []byte) {
	r.record(func() { r.out[outKey{app, tag}] = append(r.out[outKey{app, tag}], p...) })
}
func (r *recorder) Debug(app string, frame json.RawMessage) {
	r.record(func() {
		r.debug = append(r.debug, slices.Clone(frame))
		r.debugBy[app] = append(r.debugBy[app], slices.Clone(frame))
	})
}
func (r *recorder) RunEnded(app string, code *int, reason string) {
	r.record(func() {
		r.ended = append(r.ended, endEvent{app, code, reason})
		r.endedAt = append(r.endedAt, time.Now())
	})
}
func (r *recorder) Reachability(app string, port int, state string) {
	r.record(func() { r.reach = append(r.reach, reachEvent{app, port, state}) })
}

// output returns what app wrote on tag so far.
func (r *recorder) output(app string, tag byte) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return string(r.out[outKey{app, tag}])
}

// waitFor waits until cond, called with the recorder locked, holds.
func (r *recorder) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.wake:
		case <-deadline.C:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("timed out waiting for %s; output %q, debug %d frames, reach %v, ended %v",
				what, r.out, len(r.debug), r.reach, r.ended)
		}
	}
}

// waitOutput waits until app's output on tag contains want.
func (r *recorder) waitOutput(t *testing.T, app string, tag byte, want string) {
	t.Helper()
	r.waitFor(t, fmt.Sprintf("%q on tag %d of %s", want, tag, app), func() bool {
		return strings.Contains(string(r.out[outKey{app, tag}]), want)
	})
}

// events returns the names of the event frames delivered so far.
func (r *recorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return eventNames(r.debug)
}

func eventNames(frames []json.RawMessage) []string {
	var names []string
	for _, f := range frames {
		var v struct{ Kind, Event string }
		if json.Unmarshal(f, &v) == nil && v.Event != "" && (v.Kind == "" || v.Kind == "event") {
			names = append(names, v.Event)
		}
	}
	return names
}

// poll waits until cond holds, checking every few milliseconds: for
// conditions no sink call announces (a process group going away).
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// waitDone waits for the workload to end.
func waitDone(t *testing.T, w backend.Workload) backend.Exit {
	t.Helper()
	select {
	case <-w.Done():
		return w.Exit()
	case <-time.After(waitTimeout):
		t.Fatal("timed out waiting for the workload to end")
		return backend.Exit{}
	}
}

// stop stops w and returns its exit.
func stop(t *testing.T, w backend.Workload) backend.Exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatalf("Stop() = %v, want nil", err)
	}
	return waitDone(t, w)
}

// newBackend returns a backend running kernel (devkernel by default) under
// a fresh work root, closed when the test ends. mod adjusts the options.
func newBackend(t *testing.T, mod func(*Options)) *Backend {
	t.Helper()
	opts := Options{
		KernelCommand: []string{devkernelPath},
		WorkRoot:      filepath.Join(t.TempDir(), "work"),
		RelayRetry:    50 * time.Millisecond,
		ReachInterval: 50 * time.Millisecond,
		Sandbox:       SandboxOptions{Init: sandboxInitPath},
	}
	if mod != nil {
		mod(&opts)
	}
	b, err := New(opts)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Errorf("Close() = %v, want nil", err)
		}
	})
	return b
}

// runSpec is a run session of one app whose entry is telo.yaml.
func runSpec(manifest, io string, ports ...contract.PortMapping) backend.Spec {
	return backend.Spec{
		SessionID: contract.NewSessionID(),
		Mode:      contract.ModeRun,
		Bundle: contract.Bundle{
			EntryRelativePath: "telo.yaml",
			Files:             []contract.BundleFile{{RelativePath: "telo.yaml", Contents: manifest}},
		},
		Env:  map[string]string{},
		Apps: []backend.App{{Name: contract.DefaultApp, Entry: "telo.yaml", Ports: ports, IO: io}},
	}
}

// manifest is a devkernel manifest in Telo's form; dev is the x-devkernel
// block's body (YAML lines indented by four spaces), or empty. Each port is
// a name-keyed entry (p<i>) whose variable PORT_<NAME>_P<i> the specs leave
// unset, so the kernel resolves it to its default.
func manifest(name string, ports []contract.PortMapping, dev ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kind: Telo.Application\nmetadata:\n  name: %s\n", name)
	if len(ports) > 0 {
		b.WriteString("ports:\n")
		for i, p := range ports {
			fmt.Fprintf(&b, "  p%d: {env: PORT_%s_P%d, default: %d, protocol: %s}\n", i, strings.ToUpper(name), i, p.Port, p.Protocol)
		}
	}
	if len(dev) > 0 {
		b.WriteString("x-devkernel:\n")
		for _, d := range dev {
			b.WriteString("  " + d + "\n")
		}
	}
	return b.String()
}

func start(t *testing.T, b *Backend, spec backend.Spec, sink backend.Sink) backend.Workload {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	w, err := b.Start(ctx, spec, sink)
	if err != nil {
		t.Fatalf("Start() = %v, want nil", err)
	}
	return w
}

// freePort returns a loopback tcp port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeLoopbackPort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// script writes an executable shell script and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kernel.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// sessionPGID reads the process group id from a live session's pid file
// and checks it names a process group leader.
func sessionPGID(t *testing.T, b *Backend, id string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(b.root, id, pidFileName))
	if err != nil {
		t.Fatalf("read pid file: %v", err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("pid file %q: %v", data, err)
	}
	if got, err := unix.Getpgid(pgid); err != nil || got != pgid {
		t.Fatalf("Getpgid(%d) = %d, %v; want %d (a group leader)", pgid, got, err, pgid)
	}
	return pgid
}

// groupAlive reports whether any process of group pgid exists (kill -0).
func groupAlive(pgid int) bool {
	return !errors.Is(unix.Kill(-pgid, 0), unix.ESRCH)
}

func waitGroupGone(t *testing.T, pgid int) {
	t.Helper()
	poll(t, fmt.Sprintf("process group %d to be gone", pgid), func() bool { return !groupAlive(pgid) })
}

// dirEntries lists the names in dir. The work root's bookkeeping
// directories (.groups, .kept) are listed only by what they hold, as
// ".groups/<name>": empty, they are not a session's leftover.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		if e.Name() == groupsDirName || e.Name() == keptDirName {
			for _, sub := range dirEntries(t, filepath.Join(dir, e.Name())) {
				names = append(names, e.Name()+"/"+sub)
			}
			continue
		}
		names = append(names, e.Name())
	}
	return names
}

// lines splits terminal or pipe output into lines without "\r".
func lines(s string) []string {
	return strings.Split(strings.ReplaceAll(s, "\r", ""), "\n")
}

// trackedDialer dials like the backend does and keeps every connection,
// so a test can cut the debug relay's stream.
type trackedDialer struct {
	mu    sync.Mutex
	conns []*trackedConn
}

type trackedConn struct {
	net.Conn
	mu   sync.Mutex
	read int
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.read += n
	c.mu.Unlock()
	return n, err
}

func (c *trackedConn) bytesRead() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.read
}

func (d *trackedDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c}
	d.mu.Lock()
	d.conns = append(d.conns, tc)
	d.mu.Unlock()
	return tc, nil
}

func (d *trackedDialer) conn(i int) *trackedConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	if i < len(d.conns) {
		return d.conns[i]
	}
	return nil
}
