package local

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

func TestWatchSessionComesUp(t *testing.T) {
	b := newWatchBackend(t, nil)
	webPort := freePort(t)
	spec := webWorker(webPort)
	spec.Bundle.Files = append(spec.Bundle.Files,
		contract.BundleFile{RelativePath: "/docs/../docs/readme.txt", Contents: "hello"},
		contract.BundleFile{RelativePath: "bin.dat", Contents: base64.StdEncoding.EncodeToString([]byte{0, 0xff}), Encoding: "base64"},
	)
	rec := newRecorder()
	w := startWatch(t, b, spec, rec)
	ws := filepath.Join(b.root, spec.SessionID, "workspace")

	rec.mu.Lock()
	gotRunning, gotProgress := fmt.Sprint(rec.running), slices.Clone(rec.progress)
	rec.mu.Unlock()
	if want := fmt.Sprint([][]contract.Endpoint{{{Host: "", Port: webPort, Protocol: "tcp"}}}); gotRunning != want {
		t.Errorf("Running() calls = %v, want %v (before Start returned)", gotRunning, want)
	}
	wantProgress := []progressEvent{
		{contract.PhaseBoot, "Starting workspace", false, ""},
		{contract.PhaseBoot, "Starting workspace", true, ""},
	}
	if !slices.Equal(gotProgress, wantProgress) {
		t.Errorf("Progress() calls = %v, want %v", gotProgress, wantProgress)
	}
	base := rec.wsURL(t)
	if !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Errorf("WorkspaceReady(%q), want a loopback URL", base)
	}

	wantTree := []string{"bin.dat", "docs/readme.txt", "telo-workspace.yaml", "web/telo.yaml", "worker/telo.yaml"}
	if got := treePaths(t, base); !slices.Equal(got, wantTree) {
		t.Errorf("workspace tree = %v, want %v", got, wantTree)
	}
	if data, err := os.ReadFile(filepath.Join(ws, "bin.dat")); err != nil || string(data) != "\x00\xff" {
		t.Errorf("bin.dat = %q, %v; want the decoded bytes", data, err)
	}
	marker, err := os.ReadFile(filepath.Join(ws, "telo-workspace.yaml"))
	if err != nil || !strings.HasPrefix(string(marker), "#") || !strings.HasSuffix(string(marker), "modules: [\"*\"]\n") {
		t.Errorf("marker = %q, %v; want a comment block, then modules: [\"*\"]", marker, err)
	}

	rec.waitOutput(t, "web", contract.TagTTY, "devkernel web generation 1 tty=true")
	rec.waitOutput(t, "worker", contract.TagStdout, "devkernel worker generation 1 tty=false")
	rec.waitEvents(t, "web", "Kernel.Started", 1)
	rec.waitEvents(t, "worker", "Kernel.Started", 1)
	want := []string{"Kernel.Initialized", "Kernel.Starting", "Kernel.PortsResolved", "Kernel.Started"}
	for _, app := range []string{"web", "worker"} {
		if got := rec.appEvents(app); !slices.Equal(got, want) {
			t.Errorf("%s event frames = %v, want %v", app, got, want)
		}
	}
	if out := rec.output("worker", contract.TagTTY); out != "" {
		t.Errorf("tag 0 output of the streams app = %q, want none", out)
	}
	rec.waitFor(t, "web port reachable", func() bool {
		return slices.Contains(rec.reach, reachEvent{"web", webPort, contract.ReachReachable})
	})

	if err := w.Stdin("worker", []byte("ping\n")); err != nil {
		t.Fatalf("Stdin() = %v, want nil", err)
	}
	rec.waitOutput(t, "worker", contract.TagStdout, "echo: ping")
	if err := w.Resize("web", 100, 30); err != nil {
		t.Errorf("Resize() = %v, want nil", err)
	}
	if err := w.Stdin("agent", []byte("x")); err == nil {
		t.Error("Stdin(unknown app) = nil, want an error")
	}

	g := groups(t, b, w)
	if len(g) != 3 {
		t.Fatalf("process groups = %v, want workspace, web and worker", g)
	}
	exit := stop(t, w)
	if !exit.Stopped || exit.Code != nil || exit.Err != nil {
		t.Errorf("Exit() = %+v, want Stopped", exit)
	}
	for role, pgid := range g {
		if groupAlive(pgid) {
			t.Errorf("%s process group %d alive after Done", role, pgid)
		}
	}
	if _, err := os.Stat(filepath.Join(b.root, spec.SessionID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("session directory after Done: stat = %v, want not exist", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ended) != 0 {
		t.Errorf("RunEnded calls after Stop = %v, want none", rec.ended)
	}
}

// TestWatchOffersOnlyASeededWorkspace: the workspace's address reaches
// the sink (and so the record, and the editor's writes) only once the seed
// is complete, marker last: a write taken while the seed ran could be
// deleted by it (an app-set change lost acknowledged writes this way).
func TestWatchOffersOnlyASeededWorkspace(t *testing.T) {
	b := newWatchBackend(t, nil)
	spec := webWorker(freePort(t))
	ws := filepath.Join(b.root, spec.SessionID, "workspace")
	rec := newRecorder()
	seeded := make(chan bool, 1)
	rec.onReady = func() {
		_, err := os.Stat(filepath.Join(ws, "telo-workspace.yaml"))
		seeded <- err == nil
	}
	startWatch(t, b, spec, rec)
	if !<-seeded {
		t.Fatal("WorkspaceReady came before the seed wrote the workspace marker")
	}
}

func TestWatchKeepsTheBundlesMarker(t *testing.T) {
	b := newWatchBackend(t, nil)
	spec := webWorker(0)
	const own = "# mine\nmodules: [\"apps/*\"]\n"
	spec.Bundle.Files = append(spec.Bundle.Files, contract.BundleFile{RelativePath: "telo-workspace.yaml", Contents: own})
	rec := newRecorder()
	w := startWatch(t, b, spec, rec)
	var file struct{ Content string }
	wsCall(t, rec.wsURL(t), http.MethodGet, "/workspace/file?path=telo-workspace.yaml", nil, &file)
	if file.Content != own {
		t.Errorf("marker = %q, want the bundle's own %q", file.Content, own)
	}
	stop(t, w)
}

func TestWatchReloads(t *testing.T) {
	b := newWatchBackend(t, nil)
	rec := newRecorder()
	w := startWatch(t, b, webWorker(0), rec)
	base := rec.wsURL(t)
	rec.waitEvents(t, "web", "Kernel.Started", 1)
	rec.waitEvents(t, "worker", "Kernel.Started", 1)
	webPGID := groups(t, b, w)["app-web"]

	// An edit through the workspace server reloads web.
	writeFile(t, base, "web/telo.yaml", manifest("web", nil)+"# edited\n")
	rec.waitEvents(t, "web", "Kernel.Starting", 2)
	rec.waitOutput(t, "web", contract.TagTTY, "devkernel web generation 2 tty=true")
	if n := countOf(rec.appEvents("web"), "Kernel.Stopped"); n != 1 {
		t.Errorf("web Kernel.Stopped frames = %d, want 1 (the reload's teardown)", n)
	}

	// A touch rewrites identical bytes: a reload too.
	wsCall(t, base, http.MethodPost, "/workspace/touch", map[string]any{"paths": []string{"web/telo.yaml"}}, nil)
	rec.waitEvents(t, "web", "Kernel.Starting", 3)
	rec.waitOutput(t, "web", contract.TagTTY, "devkernel web generation 3 tty=true")

	// A broken manifest fails the load; the kernel keeps watching.
	writeFile(t, base, "web/telo.yaml", "kind: [\n")
	rec.waitEvents(t, "web", "Kernel.RunFailed", 1)
	rec.mu.Lock()
	var failed struct {
		Payload struct{ Phase, Code string }
	}
	for _, f := range rec.debugBy["web"] {
		if slices.Equal(eventNames([]json.RawMessage{f}), []string{"Kernel.RunFailed"}) {
			_ = json.Unmarshal(f, &failed)
		}
	}
	rec.mu.Unlock()
	if failed.Payload.Phase != "load" {
		t.Errorf("Kernel.RunFailed payload = %+v, want phase load", failed.Payload)
	}
	if got := groups(t, b, w)["app-web"]; got != webPGID {
		t.Errorf("web process group = %d after a failed load, want the same %d", got, webPGID)
	}
	writeFile(t, base, "web/telo.yaml", manifest("web", nil))
	rec.waitEvents(t, "web", "Kernel.Starting", 4)
	rec.waitOutput(t, "web", contract.TagTTY, "devkernel web generation 5 tty=true")

	// Nothing of this reached worker.
	want := []string{"Kernel.Initialized", "Kernel.Starting", "Kernel.PortsResolved", "Kernel.Started"}
	if got := rec.appEvents("worker"); !slices.Equal(got, want) {
		t.Errorf("worker event frames = %v, want only its first generation %v", got, want)
	}
	if out := rec.output("worker", contract.TagStdout); strings.Contains(out, "generation 2") {
		t.Errorf("worker output %q shows a reload", out)
	}
	stop(t, w)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ended) != 0 {
		t.Errorf("RunEnded calls = %v, want none (reloads are not process ends)", rec.ended)
	}
}

func TestWatchCredentialBoundary(t *testing.T) {
	t.Setenv("LOCAL_BACKEND_LEAK_MARKER", "leaked")
	// The agent execs sleep directly: a shell would add PWD of its own.
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	if sleep, err = filepath.Abs(sleep); err != nil {
		t.Fatal(err)
	}
	b := newWatchBackend(t, nil)
	spec := webWorker(0)
	spec.Env = map[string]string{"SESSION_SECRET": "s", "TELO_CACHE_DIR": "/split/cache"}
	spec.Agent = &backend.Agent{Name: "helper", Image: sleep + "  1000", Env: map[string]string{"OPERATOR_KEY": "k"}, Port: freePort(t)}
	rec := newRecorder()
	w := startWatch(t, b, spec, rec)
	dir := filepath.Join(b.root, spec.SessionID)
	ws := filepath.Join(dir, "workspace")
	home := filepath.Join(dir, "home")
	const path = "/usr/local/bin:/usr/bin:/bin"
	rec.waitEvents(t, "web", "Kernel.Started", 1)
	rec.waitEvents(t, "worker", "Kernel.Started", 1)
	g := groups(t, b, w)

	wantEnv := map[string]map[string]string{
		"workspace": {"WORKSPACE_DIR": ws, "PORT": strings.TrimPrefix(rec.wsURL(t), "http://127.0.0.1:"),
			"WORKSPACE_BIND": "127.0.0.1", "PATH": path, "HOME": filepath.Join(home, "workspace")},
		"app-web": {"SESSION_SECRET": "s", "HOME": filepath.Join(home, "app-web"), "PATH": path,
			"CLICOLOR_FORCE": "1", "TERM": "xterm-256color"},
		"app-worker": {"SESSION_SECRET": "s", "HOME": filepath.Join(home, "app-worker"), "PATH": path},
		"agent": {"OPERATOR_KEY": "k", "WORKSPACE_DIR": ws, "CLICOLOR_FORCE": "1",
			"HOME": filepath.Join(home, "agent"), "PATH": path},
	}
	if len(g) != len(wantEnv) {
		t.Fatalf("process groups = %v, want %d", g, len(wantEnv))
	}
	for role, want := range wantEnv {
		if got := environ(t, g[role]); !maps.Equal(got, want) {
			t.Errorf("%s environment = %v, want exactly %v", role, got, want)
		}
	}

	if got, want := cmdline(t, g["agent"]), []string{sleep, "1000"}; !slices.Equal(got, want) {
		t.Errorf("agent argv = %q, want the image's words %q", got, want)
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", workloadPID(t, g["agent"]))); err != nil || cwd != ws {
		t.Errorf("agent working dir = %q, %v; want the workspace %q", cwd, err, ws)
	}

	inspect := map[string]bool{}
	for _, app := range []string{"web", "worker"} {
		argv := cmdline(t, g["app-"+app])
		entry := filepath.Join(ws, app, "telo.yaml")
		if len(argv) != 7 || argv[0] != devkernelPath || !slices.Equal(argv[1:4], []string{"run", "--watch", "--inspect"}) ||
			!strings.HasPrefix(argv[4], "127.0.0.1:") || argv[5] != "--no-open" || argv[6] != entry {
			t.Errorf("%s argv = %q, want run --watch --inspect 127.0.0.1:<port> --no-open %s", app, argv, entry)
			continue
		}
		inspect[argv[4]] = true
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", workloadPID(t, g["app-"+app]))); err != nil || cwd != dir {
			t.Errorf("%s working dir = %q, %v; want the session directory %q", app, cwd, err, dir)
		}
	}
	if len(inspect) != 2 {
		t.Errorf("inspect addresses = %v, want two distinct", inspect)
	}
	if out := rec.output("worker", contract.TagStdout); strings.Contains(out, "\x1b[") {
		t.Errorf("streams output %q is coloured; no colour variable may reach it", out)
	}
	stop(t, w)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for k := range rec.out {
		if k.app != "web" && k.app != "worker" {
			t.Errorf("output on channel %q, want only the apps' (agent and workspace go to the log)", k.app)
		}
	}
}

func TestWatchAppRestartsAfterKill(t *testing.T) {
	b := newWatchBackend(t, nil)
	rec := newRecorder()
	w := startWatch(t, b, webWorker(0), rec)
	rec.waitEvents(t, "web", "Kernel.Started", 1)
	rec.waitEvents(t, "worker", "Kernel.Started", 1)
	before := groups(t, b, w)

	if err := unix.Kill(before["app-web"], unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "web's RunEnded", func() bool { return len(rec.ended) > 0 })
	rec.waitFor(t, "the restart notice", func() bool {
		return slices.Contains(rec.progress, progressEvent{contract.PhaseBoot, "Restarting app web (exit code 137)", false, "web"})
	})
	rec.waitFor(t, "a second banner on web's channel", func() bool {
		return strings.Count(string(rec.out[outKey{"web", contract.TagTTY}]), "devkernel web generation 1 tty=true") == 2
	})
	rec.waitEvents(t, "web", "Kernel.Starting", 2)
	after := groups(t, b, w)
	if after["app-web"] == before["app-web"] || after["app-worker"] != before["app-worker"] || after["workspace"] != before["workspace"] {
		t.Errorf("process groups %v after the restart, before %v: want only web's replaced", after, before)
	}
	select {
	case <-w.Done():
		t.Fatal("workload ended after an app died; it must stay up")
	default:
	}

	// The restarted kernel watches its entry like the first one.
	writeFile(t, rec.wsURL(t), "web/telo.yaml", manifest("web", nil)+"# again\n")
	rec.waitOutput(t, "web", contract.TagTTY, "devkernel web generation 2 tty=true")
	if err := w.Stdin("web", []byte("still there\n")); err != nil {
		t.Fatalf("Stdin() = %v, want nil", err)
	}
	rec.waitOutput(t, "web", contract.TagTTY, "echo: still there")

	exit := stop(t, w)
	if !exit.Stopped {
		t.Errorf("Exit() = %+v, want Stopped", exit)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ended) != 1 || rec.ended[0].app != "web" || rec.ended[0].code == nil || *rec.ended[0].code != 137 || rec.ended[0].reason == "" {
		t.Errorf("RunEnded calls = %+v, want one for web with code 137 and a reason", rec.ended)
	}
}

func TestWatchRestartBacksOff(t *testing.T) {
	kernel := script(t, "echo crashing\nexit 1\n")
	b := newWatchBackend(t, func(o *Options) { o.KernelCommand = []string{kernel} })
	b.restart = restartPolicy{delay: 50 * time.Millisecond, max: 200 * time.Millisecond, window: time.Minute}
	spec := watchSpec([]backend.App{{Name: "web", Entry: "telo.yaml", IO: contract.IOStreams}},
		contract.BundleFile{RelativePath: "telo.yaml", Contents: "x"})
	rec := newRecorder()
	w := startWatch(t, b, spec, rec)
	rec.waitFor(t, "five ends", func() bool { return len(rec.ended) >= 5 })
	exit := stop(t, w)
	if !exit.Stopped {
		t.Errorf("Exit() = %+v, want Stopped", exit)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, want := range []time.Duration{50, 100, 200, 200} {
		want *= time.Millisecond
		if gap := rec.endedAt[i+1].Sub(rec.endedAt[i]); gap < want {
			t.Errorf("gap between end %d and %d = %v, want at least the backoff %v", i, i+1, gap, want)
		}
	}
	for _, e := range rec.ended {
		if e.app != "web" || e.code == nil || *e.code != 1 || e.reason != "application process exited (code 1)" {
			t.Errorf("RunEnded(%+v), want web with code 1", e)
		}
	}
	notices := 0
	for _, p := range rec.progress {
		if p == (progressEvent{contract.PhaseBoot, "Restarting app web (exit code 1)", false, "web"}) {
			notices++
		}
	}
	if notices < len(rec.ended)-1 {
		t.Errorf("restart notices = %d, want one per restart (%d ends)", notices, len(rec.ended))
	}
	if n := strings.Count(string(rec.out[outKey{"web", contract.TagStdout}]), "crashing"); n < len(rec.ended) {
		t.Errorf("output shows %d runs, want one per end (%d)", n, len(rec.ended))
	}
}

func TestWatchPorts(t *testing.T) {
	b := newWatchBackend(t, nil)
	rec := newRecorder()
	w := startWatch(t, b, webWorker(0), rec)
	rec.waitEvents(t, "worker", "Kernel.Started", 1)
	tcp := freePort(t)
	udp := contract.PortMapping{Port: freePort(t), Protocol: "udp"}

	writeFile(t, rec.wsURL(t), "worker/telo.yaml", manifest("worker", []contract.PortMapping{{Port: tcp, Protocol: "tcp"}}))
	rec.waitEvents(t, "worker", "Kernel.Starting", 2)
	if err := w.SetPorts(context.Background(), "worker", []contract.PortMapping{{Port: tcp, Protocol: "tcp"}, udp}); err != nil {
		t.Fatalf("SetPorts() = %v", err)
	}
	if err := w.SetPorts(context.Background(), "nope", nil); err == nil {
		t.Error("SetPorts(unknown app) = nil, want an error")
	}
	if got, want := w.Endpoints([]contract.PortMapping{{Port: tcp, Protocol: "tcp"}, udp}), []contract.Endpoint{{Port: tcp, Protocol: "tcp"}, {Port: udp.Port, Protocol: "udp"}}; !slices.Equal(got, want) {
		t.Errorf("Endpoints() = %+v, want host-less %+v", got, want)
	}
	w.WatchPorts("worker", []contract.PortMapping{{Port: tcp, Protocol: "tcp"}, udp})
	rec.waitFor(t, "the later-declared port reachable", func() bool {
		return slices.Contains(rec.reach, reachEvent{"worker", tcp, contract.ReachReachable})
	})
	w.WatchPorts("worker", []contract.PortMapping{{Port: tcp, Protocol: "tcp"}}) // already watched
	w.WatchPorts("nope", []contract.PortMapping{{Port: tcp, Protocol: "tcp"}})   // unknown app
	stop(t, w)
	w.WatchPorts("worker", []contract.PortMapping{{Port: freePort(t), Protocol: "tcp"}}) // after the end

	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := []reachEvent{{"worker", tcp, contract.ReachChecking}, {"worker", tcp, contract.ReachReachable}}
	if !slices.Equal(rec.reach, want) {
		t.Errorf("reachability = %v, want %v (udp never watched, a port watched once)", rec.reach, want)
	}
}

func TestWatchAppWaitsForItsEntry(t *testing.T) {
	b := newWatchBackend(t, nil)
	spec := watchSpec([]backend.App{{Name: "late", Entry: "late/telo.yaml", IO: contract.IOStreams}})
	rec := newRecorder()
	w := startWatch(t, b, spec, rec)
	if g := groups(t, b, w); len(g) != 1 {
		t.Errorf("process groups before the entry exists = %v, want the workspace server only", g)
	}
	if err := w.Stdin("late", []byte("dropped\n")); err != nil {
		t.Errorf("Stdin() to an app without a process = %v, want nil (dropped)", err)
	}
	writeFile(t, rec.wsURL(t), "late/telo.yaml", manifest("late", nil))
	rec.waitOutput(t, "late", contract.TagStdout, "devkernel late generation 1 tty=false")
	if g := groups(t, b, w); len(g) != 2 {
		t.Errorf("process groups once the entry exists = %v, want workspace and app-late", g)
	}
	stop(t, w)
}

func TestWatchWorkspaceServerDeathEndsTheSession(t *testing.T) {
	b := newWatchBackend(t, nil)
	spec := webWorker(0)
	rec := newRecorder()
	w := startWatch(t, b, spec, rec)
	rec.waitEvents(t, "web", "Kernel.Started", 1)
	rec.waitEvents(t, "worker", "Kernel.Started", 1)
	g := groups(t, b, w)

	if err := unix.Kill(g["workspace"], unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	exit := waitDone(t, w)
	if exit.Stopped || exit.Err == nil || !strings.HasPrefix(exit.Err.Error(), "workspace server exited: ") {
		t.Errorf("Exit() = %+v, want Err \"workspace server exited: …\"", exit)
	}
	for role, pgid := range g {
		if groupAlive(pgid) {
			t.Errorf("%s process group %d alive after Done", role, pgid)
		}
	}
	if got := dirEntries(t, b.root); len(got) != 0 {
		t.Errorf("work root after Done = %v, want empty", got)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ended) != 0 {
		t.Errorf("RunEnded calls = %v, want none (the runner stopped the apps)", rec.ended)
	}
}

func TestWatchStartFailures(t *testing.T) {
	tests := []struct {
		name      string
		opts      func(t *testing.T, o *Options)
		after     func(t *testing.T, b *Backend) // after New
		spec      func(t *testing.T, s *backend.Spec)
		stage     string
		message   string // prefix of the StartError message
		noBackend bool   // plain newBackend: no workspace server
	}{
		{
			name:      "no workspace server command",
			noBackend: true,
			stage:     "create",
			message:   "watch sessions need a workspace server",
		},
		{
			name:    "agent image cannot run",
			spec:    func(t *testing.T, s *backend.Spec) { s.Agent = &backend.Agent{Name: "a", Image: "registry/agent:1"} },
			stage:   "pull",
			message: "image registry/agent:1 cannot run on the local backend",
		},
		{
			name: "bad bundle path",
			spec: func(t *testing.T, s *backend.Spec) {
				s.Bundle.Files = append(s.Bundle.Files, contract.BundleFile{RelativePath: "../up", Contents: "x"})
			},
			stage:   "create",
			message: "invalid bundle relativePath",
		},
		{
			name: "workspace never answers",
			opts: func(t *testing.T, o *Options) {
				o.WorkspaceServerCommand = []string{script(t, "exec sleep 600\n")}
				o.WorkspaceReady = 300 * time.Millisecond
			},
			stage:   "start",
			message: "workspace never became ready",
		},
		{
			name:    "workspace server exits",
			opts:    func(t *testing.T, o *Options) { o.WorkspaceServerCommand = []string{script(t, "exit 3\n")} },
			stage:   "start",
			message: "workspace never became ready: workspace server exited: exit code 3",
		},
		{
			name: "kernel cannot start",
			opts: func(t *testing.T, o *Options) { o.KernelCommand = []string{script(t, "exit 0\n")} },
			after: func(t *testing.T, b *Backend) {
				if err := os.Chmod(b.kernel[0], 0o644); err != nil {
					t.Fatal(err)
				}
			},
			stage:   "start",
			message: "start app web",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mod := func(o *Options) {
				if tt.opts != nil {
					tt.opts(t, o)
				}
			}
			var b *Backend
			if tt.noBackend {
				b = newBackend(t, mod)
			} else {
				b = newWatchBackend(t, mod)
			}
			if tt.after != nil {
				tt.after(t, b)
			}
			spec := webWorker(0)
			if tt.spec != nil {
				tt.spec(t, &spec)
			}
			w, err := b.Start(context.Background(), spec, newRecorder())
			var se *backend.StartError
			if !errors.As(err, &se) || se.Stage != tt.stage || !strings.HasPrefix(se.Message, tt.message) {
				t.Fatalf("Start() = %v, %v; want a %s StartError %q…", w, err, tt.stage, tt.message)
			}
			if got := dirEntries(t, b.root); len(got) != 0 {
				t.Errorf("work root after a failed start = %v, want empty", got)
			}
		})
	}
}

func TestCloseEndsWatchSessions(t *testing.T) {
	b := newWatchBackend(t, func(o *Options) { o.StopGrace = 500 * time.Millisecond })
	rec := newRecorder()
	w := startWatch(t, b, webWorker(0), rec)
	rec.waitEvents(t, "web", "Kernel.Started", 1)
	g := groups(t, b, w)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatalf("Close() = %v, want nil", err)
	}
	if exit := w.Exit(); !exit.Stopped {
		t.Errorf("Exit() after Close = %+v, want Stopped", exit)
	}
	for role, pgid := range g {
		if groupAlive(pgid) {
			t.Errorf("%s process group %d alive after Close", role, pgid)
		}
	}
}

// An agent that does not listen on its catalog port is reported once, as a
// progress notice naming it and the setting (19.5); an agent that listens
// is not.
func TestWatchAgentPortChecked(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	if sleep, err = filepath.Abs(sleep); err != nil {
		t.Fatal(err)
	}
	b := newWatchBackend(t, func(o *Options) { o.ReachDeadline = 500 * time.Millisecond })
	spec := webWorker(0)
	port := freePort(t)
	spec.Agent = &backend.Agent{Name: "helper", Image: sleep + " 1000", Port: port}
	rec := newRecorder()
	w := startWatch(t, b, spec, rec)
	want := fmt.Sprintf("agent helper is not listening on port %d", port)
	notices := func() (n int) { // rec.mu held
		for _, p := range rec.progress {
			if strings.HasPrefix(p.message, want) && p.app == "" && strings.Contains(p.message, "RUNNER_APPS.helper.port") {
				n++
			}
		}
		return n
	}
	rec.waitFor(t, "the agent port notice", func() bool { return notices() == 1 })
	// No second notice: watched for a second (several of the checker's
	// deadlines), failing as soon as one arrives.
	if testkit.Poll(context.Background(), time.Second, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return notices() > 1
	}) {
		t.Errorf("a second agent port notice arrived, want one")
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
