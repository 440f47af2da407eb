package devkernel

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const waitLong = 15 * time.Second

// waitUntil polls cond every 10 ms until it holds or timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for "+format, append([]any{timeout}, args...)...)
		}
		<-tick.C
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// freeUDPPort is freePort for UDP.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen udp: %v", err)
	}
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

// writeManifest writes a manifest into a fresh temp dir and returns its path.
func writeManifest(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "telo.yaml")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatalf("write manifest: %v", err)
	}
	return path
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a running devkernel process.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{} // closed when the process has been waited for
	code   int           // valid after done
}

// testEnv is the environment of a devkernel under test: the test's own minus
// the variables devkernel reads, ports on loopback, plus extra.
func testEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case EnvNoColor, EnvColorForce, EnvBindHost, "FORCE_COLOR", "GORACE":
			continue
		}
		env = append(env, kv)
	}
	// The race runtime otherwise sleeps 1 s at exit to collect late reports.
	env = append(env, EnvBindHost+"=127.0.0.1", "GORACE=atexit_sleep_ms=50")
	return append(env, extra...)
}

// startKernel starts devkernel with args (env nil means testEnv()). Cleanup
// terminates it if needed and fails the test if the race detector reported
// anything.
func startKernel(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startKernelTo(t, env, nil, args...)
}

// startKernelTo is startKernel with stdout going to a file (a pty) instead of
// p.stdout when stdout is not nil.
func startKernelTo(t *testing.T, env []string, stdout *os.File, args ...string) *proc {
	t.Helper()
	if env == nil {
		env = testEnv()
	}
	p := &proc{stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(kernelBin, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if stdout != nil {
		p.cmd.Stdout = stdout
	}
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatalf("stdin pipe: %v", err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start devkernel: %v", err)
	}
	go func() { // owned: cleanup waits for done
		defer close(p.done)
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
		if s := p.stderr.String(); strings.Contains(s, "DATA RACE") {
			t.Errorf("devkernel stderr reports a data race:\n%s", s)
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal devkernel: %v", err)
	}
}

// wait returns the exit code, failing the test if the process does not exit
// in time.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(waitLong):
		t.Fatalf("devkernel did not exit; stdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		return 0
	}
}

func (p *proc) waitStdout(t *testing.T, want string) {
	t.Helper()
	waitUntil(t, waitLong, func() bool { return strings.Contains(p.stdout.String(), want) },
		"stdout to contain %q; stdout:\n%s\nstderr:\n%s", want, p.stdout, p.stderr)
}

// frame is one debug-wire frame as a client sees it.
type frame struct {
	Raw       string
	Kind      string         `json:"kind"`
	Timestamp string         `json:"timestamp"`
	Event     string         `json:"event"`
	Payload   map[string]any `json:"payload"`
	Stream    string         `json:"stream"`
	Line      string         `json:"line"`
}

func (f frame) isEvent() bool { return f.Kind != "log" && f.Kind != "record" }

// sseClient reads one /events connection in the background.
type sseClient struct {
	header http.Header
	cancel context.CancelFunc
	done   chan struct{} // closed when the stream has ended

	mu     sync.Mutex
	frames []frame
	pings  int
	err    error // why the stream ended
}

// dialEvents connects to http://addr/events, retrying until the inspect
// server is up. Cleanup closes the connection and waits for the reader.
func dialEvents(t *testing.T, addr string) *sseClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tr := &http.Transport{}
	client := &http.Client{Transport: tr}
	var resp *http.Response
	waitUntil(t, waitLong, func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/events", nil)
		req.Header.Set("Accept", "text/event-stream")
		r, err := client.Do(req)
		if err != nil {
			return false
		}
		resp = r
		return true
	}, "inspect server at %s", addr)
	c := &sseClient{header: resp.Header, cancel: cancel, done: make(chan struct{})}
	go c.read(resp.Body) // owned: cleanup waits for done
	t.Cleanup(func() {
		cancel()
		<-c.done
		tr.CloseIdleConnections()
	})
	return c
}

// read parses the SSE stream as the runner relay does (contract 10.4).
func (c *sseClient) read(body io.ReadCloser) {
	defer close(c.done)
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 {
				c.add(strings.Join(data, "\n"))
			}
			data = nil
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimLeft(strings.TrimPrefix(line, "data:"), " \t"))
		case strings.HasPrefix(line, ":"):
			c.mu.Lock()
			c.pings++
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	c.err = sc.Err()
	if c.err == nil {
		c.err = io.EOF
	}
	c.mu.Unlock()
}

func (c *sseClient) add(raw string) {
	f := frame{Raw: raw}
	if json.Unmarshal([]byte(raw), &f) != nil {
		return
	}
	c.mu.Lock()
	c.frames = append(c.frames, f)
	c.mu.Unlock()
}

func (c *sseClient) snapshot() []frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]frame(nil), c.frames...)
}

func (c *sseClient) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// events returns the names of the event frames.
func events(frames []frame) []string {
	var names []string
	for _, f := range frames {
		if f.isEvent() {
			names = append(names, f.Event)
		}
	}
	return names
}

func count(names []string, name string) int {
	n := 0
	for _, s := range names {
		if s == name {
			n++
		}
	}
	return n
}

// waitEvent waits until the n-th (1-based) event frame called name arrives
// and returns all frames so far.
func (c *sseClient) waitEvent(t *testing.T, name string, n int) []frame {
	t.Helper()
	var frames []frame
	waitUntil(t, waitLong, func() bool {
		frames = c.snapshot()
		return count(events(frames), name) >= n
	}, "event %s #%d; got %v", name, n, lazyEvents{c})
	return frames
}

// lazyEvents prints the client's events when formatted.
type lazyEvents struct{ c *sseClient }

func (l lazyEvents) String() string { return fmt.Sprint(events(l.c.snapshot())) }

// httpGet fetches url and returns the status and body.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
