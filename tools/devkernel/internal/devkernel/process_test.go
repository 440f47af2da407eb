package devkernel

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run the real devkernel binary built by TestMain.

func manifest(name string, extra string) string {
	return "kind: Telo.Application\nmetadata:\n  name: " + name + "\n" + extra
}

func TestOneShotExitCode(t *testing.T) {
	path := writeManifest(t, manifest("oneshot", "x-devkernel:\n  exitAfterMs: 20\n  exitCode: 7\n"))
	p := startKernel(t, nil, "run", filepath.Dir(path)) // a directory means its telo.yaml
	if code := p.wait(t); code != 7 {
		t.Fatalf("exit code = %d, want 7; stderr:\n%s", code, p.stderr)
	}
	if got, want := p.stdout.String(), "devkernel oneshot generation 1 tty=false\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got := p.stderr.String(); got != "devkernel oneshot ready\n" {
		t.Errorf("stderr = %q, want the ready line only", got)
	}
}

func TestSignalEndsRunWithZero(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			path := writeManifest(t, manifest("forever", "x-devkernel: {exitCode: 9}\n"))
			p := startKernel(t, nil, path)
			p.waitStdout(t, "devkernel forever generation 1")
			p.signal(t, sig)
			if code := p.wait(t); code != 0 {
				t.Errorf("exit code after %v = %d, want 0", sig, code)
			}
		})
	}
}

func TestLoadFailureExitsOne(t *testing.T) {
	tests := []struct{ name, content string }{
		{"missing name", "kind: Telo.Application\n"},
		{"no application", "kind: Telo.Library\nmetadata: {name: x}\n"},
		{"not yaml", "kind: [\n"},
		{"ports as a list", manifest("x", "ports: [{name: http, port: 3000}]\n")},
		{"port env unset, no default", manifest("x", "ports: {http: {env: PORT_DEVKERNEL_TEST_UNSET}}\n")},
		{"unknown x-devkernel key", manifest("x", "x-devkernel: {sleep: 1}\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startKernel(t, nil, writeManifest(t, tt.content))
			if code := p.wait(t); code != 1 {
				t.Errorf("exit code = %d, want 1", code)
			}
			if s := p.stderr.String(); !strings.Contains(s, CodeManifestInvalid) {
				t.Errorf("stderr = %q, want it to name %s", s, CodeManifestInvalid)
			}
			if s := p.stdout.String(); s != "" {
				t.Errorf("stdout = %q, want nothing", s)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		p := startKernel(t, nil, filepath.Join(t.TempDir(), "nope.yaml"))
		if code := p.wait(t); code != 1 || !strings.Contains(p.stderr.String(), CodeManifestInvalid) {
			t.Errorf("exit code = %d, stderr = %q; want 1 and %s", code, p.stderr, CodeManifestInvalid)
		}
	})
}

func TestUsageError(t *testing.T) {
	p := startKernel(t, nil, "--frobnicate", "x.yaml")
	if code := p.wait(t); code != 2 || !strings.Contains(p.stderr.String(), "usage:") {
		t.Errorf("exit code = %d, stderr = %q; want 2 and the usage", code, p.stderr)
	}
}

func TestInspectLifecycleHoldsOpen(t *testing.T) {
	inspect, app := freePort(t), freePort(t)
	// The port comes from the environment over the manifest's default.
	path := writeManifest(t, manifest("lifecycle",
		"ports:\n  http:\n    env: PORT_LIFECYCLE\n    default: 1\nx-devkernel: {exitAfterMs: 30, exitCode: 3}\n"))
	env := testEnv("PORT_LIFECYCLE=" + strconv.Itoa(app))
	p := startKernel(t, env, "run", "--inspect", addr(inspect), "--no-open", path)
	c := dialEvents(t, addr(inspect))
	frames := c.waitEvent(t, EventStopped, 1)

	want := []string{EventInitialized, EventStarting, EventPortsResolved, EventStarted, EventStopping, EventStopped}
	if got := events(frames); !reflect.DeepEqual(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	byName := map[string]frame{}
	var logs []frame
	for _, f := range frames {
		if f.isEvent() {
			byName[f.Event] = f
		} else {
			logs = append(logs, f)
		}
	}
	if got, want := byName[EventPortsResolved].Raw, fmt.Sprintf(`"payload":{"ports":[{"name":"http","port":%d,"protocol":"tcp"}]}`, app); !strings.Contains(got, want) {
		t.Errorf("PortsResolved = %s, want it to contain %s", got, want)
	}
	if got := byName[EventStopped].Payload["exitCode"]; got != 3.0 {
		t.Errorf("Stopped exitCode = %v, want 3", got)
	}
	if !strings.Contains(byName[EventStarting].Raw, `"kind":"event"`) || !strings.Contains(byName[EventStarting].Raw, `"payload":{}`) {
		t.Errorf("Starting = %s, want kind event and payload {}", byName[EventStarting].Raw)
	}
	stampRE := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)
	for _, f := range frames {
		if !stampRE.MatchString(f.Timestamp) {
			t.Errorf("frame %s: timestamp is not RFC 3339 UTC with ms", f.Raw)
		}
	}
	wantLogs := []frame{
		{Kind: "log", Stream: "stdout", Line: "devkernel lifecycle generation 1 tty=false"},
		{Kind: "log", Stream: "stderr", Line: "devkernel lifecycle ready"},
	}
	for i := range logs {
		logs[i].Raw, logs[i].Timestamp = "", ""
	}
	if !reflect.DeepEqual(logs, wantLogs) {
		t.Errorf("log frames = %+v, want %+v", logs, wantLogs)
	}

	// The generation is over but --inspect holds the process open.
	code, body := httpGet(t, "http://"+addr(inspect)+"/json/version")
	wantVersion := fmt.Sprintf(`{"protocol":"telo-debug","protocolVersion":1,"url":"http://%s","events":"/events","eventsLog":"/events.jsonl","blobs":"/blobs/","appEndpoints":[{"host":"","port":%d,"protocol":"tcp"}]}`, addr(inspect), app)
	if code != 200 || strings.TrimSpace(body) != wantVersion {
		t.Errorf("GET /json/version = %d %s, want 200 %s", code, body, wantVersion)
	}
	if code, _ := httpGet(t, "http://"+addr(inspect)+"/other"); code != 404 {
		t.Errorf("GET /other = %d, want 404", code)
	}
	if p.exited() || c.ended() {
		t.Fatalf("devkernel exited after a one-shot generation with --inspect (exited=%v, stream ended=%v)", p.exited(), c.ended())
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 3 {
		t.Errorf("exit code = %d, want the generation's 3", code)
	}
	waitUntil(t, waitLong, c.ended, "/events to end when devkernel exits")
	if got := events(c.snapshot()); len(got) != len(want) {
		t.Errorf("events after SIGTERM = %v, want no more than %v", got, want)
	}
}

func TestWatchReloads(t *testing.T) {
	inspect, app := freePort(t), freePort(t)
	good := manifest("watched", fmt.Sprintf("ports:\n  http: {env: PORT_WATCHED, default: %d}\n", app))
	path := writeManifest(t, good)
	p := startKernel(t, nil, "run", "--watch", "--inspect", addr(inspect), "--no-open", path)
	c := dialEvents(t, addr(inspect))
	appURL := "http://" + addr(app) + "/"

	c.waitEvent(t, EventStarted, 1)
	if _, body := httpGet(t, appURL); body != fmt.Sprintf("devkernel watched generation 1 port %d\n", app) {
		t.Errorf("port body = %q, want generation 1", body)
	}

	// The runner's touch: identical bytes rewritten.
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	frames := c.waitEvent(t, EventStarted, 2)
	wantGen := []string{EventInitialized, EventStarting, EventPortsResolved, EventStarted, EventStopping, EventStopped,
		EventInitialized, EventStarting, EventPortsResolved, EventStarted}
	if got := events(frames); !reflect.DeepEqual(got, wantGen) {
		t.Errorf("events after a touch = %v, want %v", got, wantGen)
	}
	if f := frames[indexOf(frames, EventStopped, 1)]; f.Payload["exitCode"] != 0.0 {
		t.Errorf("Stopped on reload = %s, want exitCode 0", f.Raw)
	}
	p.waitStdout(t, "devkernel watched generation 2 tty=false\n")
	if _, body := httpGet(t, appURL); !strings.Contains(body, "generation 2") {
		t.Errorf("port body = %q, want generation 2", body)
	}

	// An editor's atomic save: temp file renamed over the entry.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	c.waitEvent(t, EventStarted, 3)
	p.waitStdout(t, "devkernel watched generation 3 tty=false\n")

	// A broken save fails the load and keeps watching.
	if err := os.WriteFile(path, []byte("kind: Telo.Application\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	frames = c.waitEvent(t, EventRunFailed, 1)
	rf := frames[indexOf(frames, EventRunFailed, 1)]
	if rf.Payload["phase"] != PhaseLoad || rf.Payload["code"] != CodeManifestInvalid || rf.Payload["message"] == "" {
		t.Errorf("RunFailed = %s, want phase load, code %s and a message", rf.Raw, CodeManifestInvalid)
	}
	if got := events(frames); got[len(got)-1] != EventRunFailed || got[len(got)-2] != EventStopped {
		t.Errorf("events = %v, want generation 3 stopped, then RunFailed (no Starting)", got)
	}
	if p.exited() {
		t.Fatalf("devkernel exited on a load failure under --watch")
	}

	// Fixing it starts the next generation.
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	c.waitEvent(t, EventStarted, 4)
	p.waitStdout(t, "devkernel watched generation 5 tty=false\n")
	if _, body := httpGet(t, appURL); !strings.Contains(body, "generation 5") {
		t.Errorf("port body = %q, want generation 5", body)
	}
	if c.ended() {
		t.Errorf("the /events connection ended during reloads")
	}

	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code = %d, want 0", code)
	}
	waitUntil(t, waitLong, c.ended, "/events to end")
	if got := events(c.snapshot()); count(got, EventStopped) != 4 || got[len(got)-1] != EventStopped {
		t.Errorf("events = %v, want the last generation stopped on SIGTERM", got)
	}
}

// indexOf returns the index in frames of the n-th event frame called name.
func indexOf(frames []frame, name string, n int) int {
	for i, f := range frames {
		if f.isEvent() && f.Event == name {
			if n--; n == 0 {
				return i
			}
		}
	}
	return -1
}

func TestWatchOneShotWaitsForChange(t *testing.T) {
	inspect := freePort(t)
	content := manifest("again", "x-devkernel: {exitAfterMs: 0, exitCode: 4}\n")
	path := writeManifest(t, content)
	p := startKernel(t, nil, "--watch", "--inspect="+addr(inspect), path)
	c := dialEvents(t, addr(inspect))
	frames := c.waitEvent(t, EventStopped, 1)
	if f := frames[indexOf(frames, EventStopped, 1)]; f.Payload["exitCode"] != 4.0 {
		t.Errorf("Stopped = %s, want exitCode 4", f.Raw)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	c.waitEvent(t, EventStopped, 2)
	p.waitStdout(t, "devkernel again generation 2")
	if p.exited() {
		t.Fatalf("devkernel exited under --watch")
	}
}

func TestDeclaredPortsServe(t *testing.T) {
	tcp, udp := freePort(t), freeUDPPort(t)
	path := writeManifest(t, manifest("ports", fmt.Sprintf(
		"ports:\n  web: {env: PORT_WEB, default: %d}\n  dns: {env: PORT_DNS, default: %d, protocol: udp}\n", tcp, udp)))
	p := startKernel(t, nil, path)
	p.waitStdout(t, "devkernel ports generation 1")

	code, body := httpGet(t, fmt.Sprintf("http://%s/any/path?x=1", addr(tcp)))
	if want := fmt.Sprintf("devkernel ports generation 1 port %d\n", tcp); code != 200 || body != want {
		t.Errorf("GET = %d %q, want 200 %q", code, body, want)
	}

	conn, err := net.Dial("udp", addr(udp))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(waitLong)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Errorf("udp echo = %q, %v, want ping", buf[:n], err)
	}
}

func TestPortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	inspect := freePort(t)
	path := writeManifest(t, manifest("busy", fmt.Sprintf("ports: {http: {env: PORT_BUSY, default: %d}}\n", port)))

	p := startKernel(t, nil, path, "--inspect", addr(inspect))
	c := dialEvents(t, addr(inspect))
	frames := c.waitEvent(t, EventStopped, 1)
	want := []string{EventInitialized, EventStarting, EventPortsResolved, EventRunFailed, EventStopping, EventStopped}
	if got := events(frames); !reflect.DeepEqual(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
	if rf := frames[indexOf(frames, EventRunFailed, 1)]; rf.Payload["phase"] != PhaseStart || rf.Payload["code"] != CodePortInUse {
		t.Errorf("RunFailed = %s, want phase start code %s", rf.Raw, CodePortInUse)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t); code != 1 {
		t.Errorf("exit code = %d, want 1", code)
	}
	if !strings.Contains(p.stderr.String(), CodePortInUse) {
		t.Errorf("stderr = %q, want %s", p.stderr, CodePortInUse)
	}
}

func TestInspectPortTakenExitsOne(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	p := startKernel(t, nil, "--inspect", taken.Addr().String(), writeManifest(t, manifest("x", "")))
	if code := p.wait(t); code != 1 || !strings.Contains(p.stderr.String(), "listen inspect") {
		t.Errorf("exit code = %d, stderr = %q; want 1 and a listen error", code, p.stderr)
	}
}

func TestStdinEcho(t *testing.T) {
	p := startKernel(t, nil, writeManifest(t, manifest("echo", "")))
	p.waitStdout(t, "devkernel echo generation 1")
	if _, err := p.stdin.Write([]byte("hello\r\nworld\n")); err != nil {
		t.Fatal(err)
	}
	p.waitStdout(t, "echo: hello\necho: world\n")
	if _, err := p.stdin.Write([]byte("tail")); err != nil {
		t.Fatal(err)
	}
	p.stdin.Close()
	p.waitStdout(t, "echo: tail\n")
}

func TestFailAtStart(t *testing.T) {
	t.Run("with inspect", func(t *testing.T) {
		inspect := freePort(t)
		path := writeManifest(t, manifest("failing", "x-devkernel: {failAt: start, failCode: CEL_UNKNOWN_FIELD}\n"))
		p := startKernel(t, nil, path, "--inspect", addr(inspect), "--no-open")
		c := dialEvents(t, addr(inspect))
		frames := c.waitEvent(t, EventStopped, 1)
		want := []string{EventInitialized, EventStarting, EventPortsResolved, EventRunFailed, EventStopping, EventStopped}
		if got := events(frames); !reflect.DeepEqual(got, want) {
			t.Errorf("events = %v, want %v", got, want)
		}
		rf := frames[indexOf(frames, EventRunFailed, 1)]
		wantPayload := map[string]any{"phase": "start", "code": "CEL_UNKNOWN_FIELD", "message": "devkernel: failAt start"}
		if !reflect.DeepEqual(rf.Payload, wantPayload) {
			t.Errorf("RunFailed payload = %v, want %v", rf.Payload, wantPayload)
		}
		if st := frames[indexOf(frames, EventStopped, 1)]; st.Payload["exitCode"] != 1.0 {
			t.Errorf("Stopped = %s, want exitCode 1", st.Raw)
		}
		if s := p.stdout.String(); s != "" {
			t.Errorf("stdout = %q, want no banner", s)
		}
		p.signal(t, syscall.SIGTERM)
		if code := p.wait(t); code != 1 {
			t.Errorf("exit code = %d, want 1", code)
		}
		if !strings.Contains(p.stderr.String(), "CEL_UNKNOWN_FIELD") {
			t.Errorf("stderr = %q, want the fail code", p.stderr)
		}
	})
	t.Run("without inspect", func(t *testing.T) {
		p := startKernel(t, nil, writeManifest(t, manifest("failing", "x-devkernel: {failAt: start, failCode: E_X}\n")))
		if code := p.wait(t); code != 1 || !strings.Contains(p.stderr.String(), "E_X") {
			t.Errorf("exit code = %d, stderr = %q; want 1 and E_X", code, p.stderr)
		}
	})
	t.Run("without code", func(t *testing.T) {
		inspect := freePort(t)
		p := startKernel(t, nil, writeManifest(t, manifest("failing", "x-devkernel: {failAt: start}\n")), "--inspect", addr(inspect))
		c := dialEvents(t, addr(inspect))
		frames := c.waitEvent(t, EventRunFailed, 1)
		if rf := frames[indexOf(frames, EventRunFailed, 1)]; strings.Contains(rf.Raw, `"code"`) {
			t.Errorf("RunFailed = %s, want no code", rf.Raw)
		}
		p.signal(t, syscall.SIGINT)
		p.wait(t)
	})
}

func TestEventsReplayOnReconnect(t *testing.T) {
	inspect := freePort(t)
	p := startKernel(t, nil, writeManifest(t, manifest("replay", "x-devkernel: {exitAfterMs: 0}\n")), "--inspect", addr(inspect))
	first := dialEvents(t, addr(inspect))
	want := first.waitEvent(t, EventStopped, 1)
	first.cancel()
	<-first.done

	second := dialEvents(t, addr(inspect))
	var got []frame
	waitUntil(t, waitLong, func() bool {
		got = second.snapshot()
		return len(got) >= len(want)
	}, "the replay")
	for i := range want {
		if got[i].Raw != want[i].Raw {
			t.Errorf("replayed frame %d = %s, want %s", i, got[i].Raw, want[i].Raw)
		}
	}
	if p.exited() {
		t.Errorf("devkernel exited while holding open for the inspector")
	}
}

func TestOutputBytes(t *testing.T) {
	const n = 100_000
	p := startKernel(t, nil, writeManifest(t, manifest("noisy", "x-devkernel: {exitAfterMs: 0, outputBytes: "+strconv.Itoa(n)+"}\n")))
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code = %d, want 0", code)
	}
	out, ok := strings.CutPrefix(p.stdout.String(), "devkernel noisy generation 1 tty=false\n")
	if !ok || len(out) != n {
		t.Fatalf("stdout = banner + %d bytes (banner ok: %v), want banner + %d", len(out), ok, n)
	}
	for i := range len(out) {
		if nl := i%64 == 63; (out[i] == '\n') != nl || (!nl && (out[i] < 0x21 || out[i] > 0x7e)) {
			t.Fatalf("output byte %d = %q, want a newline every 64 bytes and printable bytes between", i, out[i])
		}
	}
}

func TestStartDelay(t *testing.T) {
	inspect := freePort(t)
	begin := time.Now()
	startKernel(t, nil, writeManifest(t, manifest("slow", "x-devkernel: {startDelayMs: 300}\n")), "--inspect", addr(inspect))
	c := dialEvents(t, addr(inspect))
	frames := c.waitEvent(t, EventInitialized, 1)
	at, err := time.Parse(time.RFC3339Nano, frames[0].Timestamp)
	if err != nil {
		t.Fatal(err)
	}
	if d := at.Sub(begin); d < 299*time.Millisecond {
		t.Errorf("Kernel.Initialized came %v after start, want at least 300ms", d)
	}
}

func TestBannerColour(t *testing.T) {
	tests := []struct {
		name   string
		env    []string
		colour bool
	}{
		{"pipe", nil, false},
		{"CLICOLOR_FORCE=1", []string{"CLICOLOR_FORCE=1"}, true},
		{"CLICOLOR_FORCE=0", []string{"CLICOLOR_FORCE=0"}, false},
		{"CLICOLOR_FORCE empty", []string{"CLICOLOR_FORCE="}, false},
		{"NO_COLOR wins", []string{"CLICOLOR_FORCE=1", "NO_COLOR=1"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startKernel(t, testEnv(tt.env...), writeManifest(t, manifest("hue", "x-devkernel: {exitAfterMs: 0}\n")))
			p.wait(t)
			want := "devkernel hue generation 1 tty=false"
			if tt.colour {
				want = colourOn + want + colourOff
			}
			if got := p.stdout.String(); got != want+"\n" {
				t.Errorf("stdout = %q, want %q", got, want+"\n")
			}
		})
	}
}
