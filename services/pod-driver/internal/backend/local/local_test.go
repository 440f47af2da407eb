package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

const app = contract.DefaultApp

func TestTTYRunSession(t *testing.T) {
	b := newBackend(t, nil)
	port := contract.PortMapping{Port: freePort(t), Protocol: "tcp"}
	// The port reaches the kernel through the session env the manifest names.
	spec := runSpec(manifest("web", nil)+"ports:\n  http: {env: PORT_WEB}\n", contract.IOTTY, port)
	spec.Env["PORT_WEB"] = strconv.Itoa(port.Port)
	rec := newRecorder()
	w := start(t, b, spec, rec)
	pgid := sessionPGID(t, b, spec.SessionID)

	rec.mu.Lock()
	gotRunning := slices.Clone(rec.running)
	rec.mu.Unlock()
	wantRunning := [][]contract.Endpoint{{{Host: "", Port: port.Port, Protocol: "tcp"}}}
	if fmt.Sprint(gotRunning) != fmt.Sprint(wantRunning) {
		t.Errorf("Running() calls = %v, want %v (before Start returned)", gotRunning, wantRunning)
	}

	rec.waitOutput(t, app, contract.TagTTY, "devkernel web generation 1 tty=true")
	rec.waitOutput(t, app, contract.TagTTY, "devkernel web ready")
	if out := rec.output(app, contract.TagTTY); !strings.Contains(out, "\x1b[") {
		t.Errorf("tty output %q has no colour codes (CLICOLOR_FORCE=1 under tty)", out)
	}
	if err := w.Stdin(app, []byte("hello there\n")); err != nil {
		t.Fatalf("Stdin() = %v, want nil", err)
	}
	rec.waitOutput(t, app, contract.TagTTY, "echo: hello there")
	if err := w.Resize(app, 120, 40); err != nil {
		t.Errorf("Resize() = %v, want nil", err)
	}
	if err := w.Stdin("nope", []byte("x")); err == nil {
		t.Error("Stdin(unknown app) = nil, want an error")
	}

	rec.waitFor(t, "port reachable", func() bool {
		return len(rec.reach) == 2
	})
	rec.mu.Lock()
	gotReach := slices.Clone(rec.reach)
	rec.mu.Unlock()
	wantReach := []reachEvent{{app, port.Port, contract.ReachChecking}, {app, port.Port, contract.ReachReachable}}
	if !slices.Equal(gotReach, wantReach) {
		t.Errorf("reachability = %v, want %v", gotReach, wantReach)
	}

	exit := stop(t, w)
	if !exit.Stopped || exit.Code != nil || exit.Err != nil {
		t.Errorf("Exit() = %+v, want Stopped and no code", exit)
	}
	if groupAlive(pgid) {
		t.Errorf("process group %d still alive after Done", pgid)
	}
	if _, err := os.Stat(filepath.Join(b.root, spec.SessionID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("session directory after Done: stat = %v, want not exist", err)
	}
	if err := w.Stdin(app, []byte("late\n")); err != nil {
		t.Errorf("Stdin() after exit = %v, want nil (dropped)", err)
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Errorf("second Stop() = %v, want nil", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ended) != 0 {
		t.Errorf("RunEnded calls after Stop = %v, want none", rec.ended)
	}
}

func TestStreamsRunSession(t *testing.T) {
	b := newBackend(t, nil)
	spec := runSpec(manifest("api", nil), contract.IOStreams)
	rec := newRecorder()
	w := start(t, b, spec, rec)
	pgid := sessionPGID(t, b, spec.SessionID)

	rec.waitOutput(t, app, contract.TagStdout, "devkernel api generation 1 tty=false")
	rec.waitOutput(t, app, contract.TagStderr, "devkernel api ready")
	if err := w.Stdin(app, []byte("ping\n")); err != nil {
		t.Fatalf("Stdin() = %v, want nil", err)
	}
	rec.waitOutput(t, app, contract.TagStdout, "echo: ping")
	if err := w.Resize(app, 100, 30); err != nil {
		t.Errorf("Resize() on streams = %v, want nil (no-op)", err)
	}
	if out := rec.output(app, contract.TagTTY); out != "" {
		t.Errorf("tag 0 output of a streams app = %q, want none", out)
	}
	if out := rec.output(app, contract.TagStdout); strings.Contains(out, "\x1b[") {
		t.Errorf("streams stdout %q has colour codes; CLICOLOR_FORCE must be tty-only", out)
	}
	exit := stop(t, w)
	if !exit.Stopped {
		t.Errorf("Exit() = %+v, want Stopped", exit)
	}
	waitGroupGone(t, pgid)
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		name     string
		kernel   string // script body; empty: devkernel
		io       string
		want     int
		wantText string // in the output
	}{
		{name: "devkernel tty", io: contract.IOTTY, want: 3, wantText: "tty=true"},
		{name: "devkernel streams", io: contract.IOStreams, want: 3, wantText: "tty=false"},
		{name: "clean exit", kernel: "echo bye\nexit 0\n", io: contract.IOStreams, want: 0, wantText: "bye"},
		{name: "signal death", kernel: "echo dying\nkill -KILL $$\n", io: contract.IOTTY, want: 128 + 9, wantText: "dying"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBackend(t, func(o *Options) {
				if tt.kernel != "" {
					o.KernelCommand = []string{script(t, tt.kernel)}
				}
			})
			spec := runSpec(manifest("job", nil, "exitAfterMs: 20", "exitCode: 3"), tt.io)
			rec := newRecorder()
			w := start(t, b, spec, rec)
			exit := waitDone(t, w)
			if exit.Stopped || exit.Err != nil || exit.Code == nil || *exit.Code != tt.want {
				t.Fatalf("Exit() = %+v (code %v), want code %d", exit, deref(exit.Code), tt.want)
			}
			tag := contract.TagTTY
			if tt.io == contract.IOStreams {
				tag = contract.TagStdout
			}
			if out := rec.output(app, tag); !strings.Contains(out, tt.wantText) {
				t.Errorf("output = %q, want it to contain %q (drained before Done)", out, tt.wantText)
			}
			rec.mu.Lock()
			ended := slices.Clone(rec.ended)
			rec.mu.Unlock()
			if len(ended) != 1 || ended[0].code == nil || *ended[0].code != tt.want || (tt.want == 0) != (ended[0].reason == "") {
				t.Errorf("RunEnded calls = %+v, want one with code %d", ended, tt.want)
			}
			if got := dirEntries(t, b.root); len(got) != 0 {
				t.Errorf("work root after Done = %v, want empty", got)
			}
		})
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestInspectRelaysDebugFrames(t *testing.T) {
	b := newBackend(t, nil)
	spec := runSpec(manifest("oneshot", nil, "exitAfterMs: 10"), contract.IOTTY)
	spec.Inspect = true
	rec := newRecorder()
	w := start(t, b, spec, rec)
	pgid := sessionPGID(t, b, spec.SessionID)

	rec.waitFor(t, "Kernel.Stopped frame", func() bool {
		return slices.Contains(eventNames(rec.debug), "Kernel.Stopped")
	})
	want := []string{"Kernel.Initialized", "Kernel.Starting", "Kernel.PortsResolved", "Kernel.Started", "Kernel.Stopping", "Kernel.Stopped"}
	if got := rec.events(); !slices.Equal(got, want) {
		t.Errorf("event frames = %v, want %v", got, want)
	}
	rec.mu.Lock()
	var logs int
	for _, f := range rec.debug {
		var v struct{ Kind string }
		if json.Unmarshal(f, &v) == nil && v.Kind == "log" {
			logs++
		}
	}
	rec.mu.Unlock()
	if logs != 2 {
		t.Errorf("log frames = %d, want 2 (banner and ready; every frame kind is relayed)", logs)
	}

	// The generation ended but --inspect holds the kernel open (19 item 29).
	select {
	case <-w.Done():
		t.Fatal("workload ended after its generation; --inspect should hold it open")
	default:
	}
	if !groupAlive(pgid) {
		t.Fatalf("process group %d gone before Stop", pgid)
	}
	exit := stop(t, w)
	if !exit.Stopped {
		t.Errorf("Exit() = %+v, want Stopped", exit)
	}
	if groupAlive(pgid) {
		t.Errorf("process group %d alive after Done", pgid)
	}
}

func TestRelayDeduplicatesReconnects(t *testing.T) {
	dialer := &trackedDialer{}
	b := newBackend(t, nil)
	b.dialRelay = dialer.dial
	spec := runSpec(manifest("dedup", nil), contract.IOStreams)
	spec.Inspect = true
	rec := newRecorder()
	w := start(t, b, spec, rec)

	rec.waitFor(t, "Kernel.Started frame", func() bool {
		return slices.Contains(eventNames(rec.debug), "Kernel.Started")
	})
	for cut := 0; cut < 2; cut++ {
		rec.mu.Lock()
		replay, distinct := 0, map[string]bool{}
		for _, f := range rec.debug {
			if !distinct[string(f)] {
				distinct[string(f)] = true
				replay += len(f)
			}
		}
		rec.mu.Unlock()
		old := dialer.conn(cut)
		if err := old.Close(); err != nil {
			t.Fatalf("cut relay connection: %v", err)
		}
		// The next connection replays everything delivered so far.
		poll(t, "relay reconnect with replay", func() bool {
			c := dialer.conn(cut + 1)
			return c != nil && c.bytesRead() > replay
		})
	}
	exit := stop(t, w)
	if !exit.Stopped {
		t.Errorf("Exit() = %+v, want Stopped", exit)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	seen := make(map[string]int)
	for _, f := range rec.debug {
		seen[string(f)]++
	}
	for f, n := range seen {
		if n > 1 {
			t.Errorf("frame delivered %d times: %s", n, f)
		}
	}
	want := []string{"Kernel.Initialized", "Kernel.Starting", "Kernel.PortsResolved", "Kernel.Started", "Kernel.Stopping", "Kernel.Stopped"}
	if got := eventNames(rec.debug); !slices.Equal(got, want) {
		t.Errorf("event frames = %v, want %v (live frames after the reconnects must arrive)", got, want)
	}
}

func TestKernelEnvAndCommandLine(t *testing.T) {
	const body = `printf 'ARGS:'
for a in "$@"; do printf ' [%s]' "$a"; done
printf '\nPWD:%s\n' "$(pwd -P)"
tr '\0' '\n' < /proc/$$/environ | sed 's/^/ENV:/'
`
	tests := []struct {
		name    string
		io      string
		inspect bool
		extra   map[string]string
	}{
		{name: "tty", io: contract.IOTTY, extra: map[string]string{"CLICOLOR_FORCE": "1", "TERM": "xterm-256color"}},
		{name: "streams with inspect", io: contract.IOStreams, inspect: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("LOCAL_BACKEND_LEAK_MARKER", "leaked")
			kernel := script(t, body)
			b := newBackend(t, func(o *Options) { o.KernelCommand = []string{kernel, "--prefix-arg"} })
			spec := runSpec("unused", tt.io)
			spec.Inspect = tt.inspect
			spec.Env = map[string]string{"SESSION_VAR": "from session", "TELO_REGISTRY_URL": "http://registry.test", "HOME": "/session/home/loses"}
			rec := newRecorder()
			w := start(t, b, spec, rec)
			sessionDir := filepath.Join(b.root, spec.SessionID)
			exit := waitDone(t, w)
			if exit.Code == nil || *exit.Code != 0 {
				t.Fatalf("Exit() = %+v, want code 0", exit)
			}
			tag := contract.TagTTY
			if tt.io == contract.IOStreams {
				tag = contract.TagStdout
			}
			env := map[string]string{}
			var args, pwd string
			for _, l := range lines(rec.output(app, tag)) {
				switch {
				case strings.HasPrefix(l, "ENV:"):
					k, v, _ := strings.Cut(strings.TrimPrefix(l, "ENV:"), "=")
					env[k] = v
				case strings.HasPrefix(l, "ARGS:"):
					args = l
				case strings.HasPrefix(l, "PWD:"):
					pwd = strings.TrimPrefix(l, "PWD:")
				}
			}
			wantEnv := map[string]string{
				"SESSION_VAR":       "from session",
				"TELO_REGISTRY_URL": "http://registry.test",
				"HOME":              filepath.Join(sessionDir, "home"),
				"PATH":              "/usr/local/bin:/usr/bin:/bin",
				"FORCE_COLOR":       "1",
			}
			maps.Copy(wantEnv, tt.extra)
			if !maps.Equal(env, wantEnv) {
				t.Errorf("kernel env = %v, want exactly %v", env, wantEnv)
			}
			if _, ok := env["LOCAL_BACKEND_LEAK_MARKER"]; ok {
				t.Error("the runner's own environment leaked into the kernel")
			}

			entry := filepath.Join(sessionDir, "app", "telo.yaml")
			wantArgs := "ARGS: [--prefix-arg] [run] [" + entry + "]"
			if tt.inspect {
				addr := strings.Fields(args)
				if len(addr) < 5 {
					t.Fatalf("args = %q, want inspect flags", args)
				}
				host, port, err := net.SplitHostPort(strings.Trim(addr[4], "[]"))
				if err != nil || host != "127.0.0.1" {
					t.Fatalf("inspect address %q: want 127.0.0.1:<port>", addr[4])
				}
				wantArgs = "ARGS: [--prefix-arg] [run] [--inspect] [127.0.0.1:" + port + "] [--no-open] [" + entry + "]"
			}
			if args != wantArgs {
				t.Errorf("kernel argv = %q, want %q", args, wantArgs)
			}
			root, err := filepath.EvalSymlinks(b.root)
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(root, spec.SessionID); pwd != want {
				t.Errorf("working dir = %q, want the session directory %q", pwd, want)
			}
		})
	}
}

func TestReachabilityUnreachableThenReachable(t *testing.T) {
	kernel := script(t, "exec sleep 600\n")
	b := newBackend(t, func(o *Options) {
		o.KernelCommand = []string{kernel}
		o.ReachInterval = 20 * time.Millisecond
		o.ReachDeadline = 200 * time.Millisecond
		o.ReachSlowInterval = 50 * time.Millisecond
	})
	tcp := contract.PortMapping{Port: freePort(t), Protocol: "tcp"}
	udp := contract.PortMapping{Port: freePort(t), Protocol: "udp"}
	rec := newRecorder()
	w := start(t, b, runSpec("x", contract.IOStreams, tcp, udp), rec)
	rec.waitFor(t, "unreachable", func() bool {
		return slices.Contains(rec.reach, reachEvent{app, tcp.Port, contract.ReachUnreachable})
	})
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port)))
	if err != nil {
		t.Fatalf("bind the declared port: %v", err)
	}
	defer func() { _ = ln.Close() }()
	rec.waitFor(t, "reachable", func() bool {
		return slices.Contains(rec.reach, reachEvent{app, tcp.Port, contract.ReachReachable})
	})
	stop(t, w)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := []reachEvent{
		{app, tcp.Port, contract.ReachChecking},
		{app, tcp.Port, contract.ReachUnreachable},
		{app, tcp.Port, contract.ReachReachable},
	}
	if !slices.Equal(rec.reach, want) {
		t.Errorf("reachability = %v, want %v (udp never watched)", rec.reach, want)
	}
	wantRunning := fmt.Sprint([][]contract.Endpoint{{{Port: tcp.Port, Protocol: "tcp"}, {Port: udp.Port, Protocol: "udp"}}})
	if got := fmt.Sprint(rec.running); got != wantRunning {
		t.Errorf("Running() = %v, want %v", got, wantRunning)
	}
}

func TestStopEscalatesToKill(t *testing.T) {
	kernel := script(t, "trap '' TERM\necho armed\nexec sleep 600\n")
	b := newBackend(t, func(o *Options) {
		o.KernelCommand = []string{kernel}
		o.StopGrace = 100 * time.Millisecond
	})
	spec := runSpec("x", contract.IOStreams)
	rec := newRecorder()
	w := start(t, b, spec, rec)
	pgid := sessionPGID(t, b, spec.SessionID)
	rec.waitOutput(t, app, contract.TagStdout, "armed")
	exit := stop(t, w)
	if !exit.Stopped {
		t.Errorf("Exit() = %+v, want Stopped", exit)
	}
	if groupAlive(pgid) {
		t.Errorf("process group %d alive after Done", pgid)
	}
}

func TestCloseKillsEverything(t *testing.T) {
	b := newBackend(t, nil)
	var pgids []int
	var ws []backend.Workload
	for _, io := range []string{contract.IOTTY, contract.IOStreams} {
		spec := runSpec(manifest("svc", nil), io)
		spec.Inspect = true
		rec := newRecorder()
		ws = append(ws, start(t, b, spec, rec))
		pgids = append(pgids, sessionPGID(t, b, spec.SessionID))
		rec.waitFor(t, "kernel started", func() bool {
			return slices.Contains(eventNames(rec.debug), "Kernel.Started")
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatalf("Close() = %v, want nil", err)
	}
	for i, w := range ws {
		select {
		case <-w.Done():
		default:
			t.Errorf("workload %d not done after Close", i)
		}
		if !w.Exit().Stopped {
			t.Errorf("workload %d Exit() = %+v, want Stopped", i, w.Exit())
		}
		if groupAlive(pgids[i]) {
			t.Errorf("process group %d alive after Close", pgids[i])
		}
	}
	_, err := b.Start(context.Background(), runSpec(manifest("late", nil), contract.IOTTY), newRecorder())
	var se *backend.StartError
	if !errors.As(err, &se) {
		t.Errorf("Start() after Close = %v, want a StartError", err)
	}
	if got := dirEntries(t, b.root); len(got) != 0 {
		t.Errorf("work root after Close = %v, want empty", got)
	}
}

func TestCloseHardKillsWhenContextEnds(t *testing.T) {
	kernel := script(t, "trap '' TERM\necho armed\nexec sleep 600\n")
	b := newBackend(t, func(o *Options) {
		o.KernelCommand = []string{kernel}
		o.StopGrace = time.Hour
	})
	spec := runSpec("x", contract.IOTTY)
	rec := newRecorder()
	w := start(t, b, spec, rec)
	pgid := sessionPGID(t, b, spec.SessionID)
	rec.waitOutput(t, app, contract.TagTTY, "armed")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := b.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close() = %v, want the context's deadline error", err)
	}
	if !w.Exit().Stopped || groupAlive(pgid) {
		t.Errorf("after Close: Exit() = %+v, group alive %v; want stopped and gone", w.Exit(), groupAlive(pgid))
	}
}

func TestStragglersOfTheGroupAreKilled(t *testing.T) {
	for _, io := range []string{contract.IOTTY, contract.IOStreams} {
		t.Run(io, func(t *testing.T) {
			// The background sleep keeps the terminal or stdout open after
			// the leader exits.
			// In a sandbox it names the sleep by its namespace pid; it waits
			// a moment so the test can find the host pid.
			kernel := script(t, "sleep 600 &\necho \"bg:$!\"\nsleep 0.5\nexit 3\n")
			b := newBackend(t, func(o *Options) { o.KernelCommand = []string{kernel} })
			rec := newRecorder()
			w := start(t, b, runSpec("x", io), rec)
			began := time.Now()
			tag := contract.TagTTY
			if io == contract.IOStreams {
				tag = contract.TagStdout
			}
			hostBG := 0
			if b.sb != nil {
				rec.waitOutput(t, app, tag, "bg:")
				var ns int
				for _, l := range lines(rec.output(app, tag)) {
					if v, ok := strings.CutPrefix(l, "bg:"); ok {
						ns, _ = strconv.Atoi(v)
					}
				}
				poll(t, "the host pid of the background sleep", func() bool { hostBG = hostPID(ns, "sleep\x00600"); return hostBG != 0 })
				began = time.Now() // the leader exits within 0.5 s from here
			}
			exit := waitDone(t, w)
			if exit.Code == nil || *exit.Code != 3 {
				t.Errorf("Exit() = %+v, want code 3", exit)
			}
			if took := time.Since(began); took >= drainTimeout {
				t.Errorf("Done took %v, want less than the drain timeout %v (output closed by the group kill)", took, drainTimeout)
			}
			var bg int
			for _, l := range lines(rec.output(app, tag)) {
				if v, ok := strings.CutPrefix(l, "bg:"); ok {
					bg, _ = strconv.Atoi(v)
				}
			}
			if bg == 0 {
				t.Fatalf("no background pid in output %q", rec.output(app, tag))
			}
			if hostBG != 0 {
				bg = hostBG
			}
			poll(t, fmt.Sprintf("background process %d to die", bg), func() bool { return dead(bg) })
		})
	}
}

// dead reports whether pid is gone or a zombie (killed, not yet reaped by
// whoever inherited it).
func dead(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// Field 3, after the parenthesised command name.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || strings.HasPrefix(string(stat[i+1:]), " Z")
}

func TestResizeReachesTheTerminal(t *testing.T) {
	kernel := script(t, "stty size\nwhile read line; do stty size; done\n")
	b := newBackend(t, func(o *Options) { o.KernelCommand = []string{kernel} })
	rec := newRecorder()
	w := start(t, b, runSpec("x", contract.IOTTY), rec)
	rec.waitOutput(t, app, contract.TagTTY, fmt.Sprintf("%d %d", initialRows, initialCols))
	if err := w.Resize(app, 132, 43); err != nil {
		t.Fatalf("Resize() = %v, want nil", err)
	}
	if err := w.Stdin(app, []byte("size?\n")); err != nil {
		t.Fatalf("Stdin() = %v, want nil", err)
	}
	rec.waitOutput(t, app, contract.TagTTY, "43 132")
	if err := w.Resize(app, 0, 10); err == nil {
		t.Error("Resize(0, 10) = nil, want an error")
	}
	stop(t, w)
	if err := w.Resize(app, 100, 30); err != nil {
		t.Errorf("Resize() after exit = %v, want nil", err)
	}
}
