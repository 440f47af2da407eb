package e2e

import (
	"context"
	"fmt"
	"github.com/telorunner/telorunner/pkg/testkit"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The all-in-one binary, built once per test run by telorunnerBin (only
// the tests that run it as a separate OS process pay for the build).
var (
	telorunnerOnce sync.Once
	telorunnerPath string
	telorunnerErr  error
)

func telorunnerBin(t *testing.T) string {
	t.Helper()
	telorunnerOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		telorunnerPath = filepath.Join(filepath.Dir(devkernel), "telorunner")
		build := exec.Command("go", "build", "-o", telorunnerPath, "./cmd/telorunner")
		build.Dir = filepath.Join(filepath.Dir(file), "..")
		build.Env = append(os.Environ(), "GOWORK=off")
		if out, err := build.CombinedOutput(); err != nil {
			telorunnerErr = fmt.Errorf("build telorunner: %v\n%s", err, out)
		}
	})
	if telorunnerErr != nil {
		t.Fatal(telorunnerErr)
	}
	return telorunnerPath
}

// procRunner is the all-in-one (or any telorunner configuration) as a
// separate OS process, so it can be killed with SIGKILL.
type procRunner struct {
	URL  string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// startProcRunner starts bin/telorunner with exactly vars (plus PATH) on
// a free port and waits until /v1/health answers.
func startProcRunner(t *testing.T, name string, vars map[string]string) *procRunner {
	t.Helper()
	port := freePort(t)
	env := []string{"PATH=" + os.Getenv("PATH"), "PORT=" + strconv.Itoa(port), "LOG_LEVEL=debug"}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	logPath := filepath.Join(t.TempDir(), name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(telorunnerBin(t))
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &procRunner{URL: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("%s log (tail):\n%s", name, tail(string(b), 60))
			}
		}
	})
	exited := false
	serving := testkit.Poll(context.Background(), 60*time.Second, func() bool {
		if resp, err := http.Get(p.URL + "/v1/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		select {
		case <-p.done:
			exited = true
			return true
		default:
			return false
		}
	})
	if exited {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("%s exited before serving:\n%s", name, tail(string(b), 40))
	}
	if !serving {
		t.Fatalf("%s not serving within 60s", name)
	}
	return p
}

// kill9 kills the process with SIGKILL and waits until it is reaped.
func (p *procRunner) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill -9: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("telorunner not reaped within 30s of SIGKILL")
	}
}

// stop ends the process with SIGTERM (SIGKILL after a minute).
func (p *procRunner) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Errorf("telorunner did not stop within 60s of SIGTERM")
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// processesUnder lists the live (not zombie) processes whose working
// directory is under dir — every process of a local workload runs in its
// session directory or its workspace.
func processesUnder(dir string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err == nil && strings.HasPrefix(cwd, dir+"/") {
			out = append(out, pid)
		}
	}
	return out
}

// alive reports whether pid names a process that has not exited (a zombie
// waiting for init to reap it has).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// sseIDs checks that evs carry the ids from+1, from+2, … in order (no gap,
// no duplicate) and returns the last.
func sseIDs(t *testing.T, from int, evs []sseEvent) int {
	t.Helper()
	want := from
	for _, e := range evs {
		want++
		if id, err := strconv.Atoi(e.ID); err != nil || id != want {
			t.Fatalf("SSE id %q where %d was due (ids must continue without gap or duplicate): %s", e.ID, want, summarize(evs))
		}
	}
	return want
}

// kill -9 of the all-in-one during a two-app watch session, then a restart
// on the same data dir: the session is running again within 5 s under the
// same id, served from its workspace directory (edits newer than any
// checkpoint survive), its event and io sequences continue without gap or
// duplicate, every app's next generation is a resume, and no process of
// the old workload is left.
func TestCrashRestartRecoversWatchSession(t *testing.T) {
	dataDir := t.TempDir()
	vars := map[string]string{
		"RUNNER_DATA_DIR":                 dataDir,
		"RUNNER_WATCH_SESSIONS":           "true",
		"RUNNER_KERNEL_COMMAND":           devkernel,
		"RUNNER_WORKSPACE_SERVER_COMMAND": workspaceServer,
		// No checkpoint before the crash: only the workspace directory
		// holds the edits, so their survival proves it was served.
		"RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "3600",
	}
	a := startProcRunner(t, "first", vars)
	files := map[string]string{
		"web/telo.yaml":    manifest("web", nil, nil),
		"worker/telo.yaml": manifest("worker", nil, nil),
		"README.md":        "hello\n",
	}
	c := createOn(t, a.URL, watchBody(files, []app{{Name: "web", Entry: "web/telo.yaml"}, {Name: "worker", Entry: "worker/telo.yaml", IO: "streams"}}, ""))
	sse := openSSE(t, a.URL+c.StreamURL, nil)
	sse.untilAll(t, 60*time.Second, isStatus("running"), isRun("web", "started", 1))
	if resp := do(t, "POST", a.URL+"/v1/sessions/"+c.SessionID+"/workspace", map[string]any{"write": []map[string]any{
		{"path": "notes/edit.txt", "content": "written before the crash\n"},
		{"path": "README.md", "content": "edited\n"},
	}}, nil); resp.Status != 200 {
		t.Fatalf("write = %d %s", resp.Status, resp.Body)
	}
	before := tree(t, &runner{URL: a.URL}, c.SessionID)

	// io of the tty app: its banner, and the last seq seen.
	io := openIO(t, wsURL(a.URL)+"/v1/sessions/"+c.SessionID+"/io?app=web", nil)
	frames, _ := io.readUntil(t, 30*time.Second, "web")
	lastSeq := uint32(0)
	for _, f := range frames {
		if f.Text == "" {
			lastSeq = f.Seq
		}
	}
	io.Close()
	sse.Close()
	// Every event so far, ids from 1.
	all := openSSE(t, a.URL+c.StreamURL, nil)
	first := map[string]bool{}
	seen := all.until(t, 10*time.Second, func(e sseEvent) bool {
		for _, app := range []string{"web", "worker"} {
			first[app] = first[app] || isRun(app, "started", 1)(e)
		}
		return first["web"] && first["worker"]
	})
	lastID := sseIDs(t, 0, seen)
	all.Close()
	maxGen := map[string]int{"web": 1, "worker": 1}

	old := processesUnder(dataDir)
	if len(old) < 3 {
		t.Fatalf("workload processes under the data dir = %v, want the workspace server and two kernels", old)
	}

	a.kill9(t)
	restart := time.Now()
	b := startProcRunner(t, "second", vars)
	r2 := &runner{URL: b.URL}

	// SSE resumed with Last-Event-ID: starting, then running again, ids
	// continuing.
	s2 := openSSE(t, b.URL+c.StreamURL, map[string]string{"Last-Event-ID": strconv.Itoa(lastID)})
	var running time.Duration
	started := map[string]map[string]any{}
	sawStarting := false
	evs := s2.until(t, 30*time.Second, func(e sseEvent) bool {
		switch {
		case isStatus("starting")(e):
			sawStarting = true
		case isStatus("running")(e) && sawStarting && running == 0:
			running = time.Since(restart)
		case e.Event == "run" && strings.Contains(e.Data, `"phase":"started"`):
			ev := decode(t, e.Data)
			started[ev["app"].(string)] = ev
		}
		return running > 0 && len(started) == 2
	})
	t.Logf("restart → running again: %v", running)
	if running > 5*time.Second {
		t.Errorf("session running again %v after the restart, want within 5s", running)
	}
	for _, app := range []string{"web", "worker"} {
		ev := started[app]
		if int(ev["generation"].(float64)) != maxGen[app]+1 || ev["trigger"] != "resume" {
			t.Errorf("%s first run after recovery = %v, want generation %d with trigger resume", app, ev, maxGen[app]+1)
		}
	}
	sseIDs(t, lastID, evs)
	if got := waitStatus(t, r2, c.SessionID, "running", 5*time.Second); got["sessionId"] != c.SessionID {
		t.Fatalf("GET after recovery = %v", got)
	}

	// Files intact, including edits newer than any checkpoint.
	if got := tree(t, r2, c.SessionID); got != before {
		t.Fatalf("tree after recovery = %s\nwant %s", got, before)
	}
	var f struct{ Content string }
	do(t, "GET", b.URL+"/v1/sessions/"+c.SessionID+"/workspace/file?path=notes/edit.txt", nil, nil).json(t, &f)
	if f.Content != "written before the crash\n" {
		t.Fatalf("notes/edit.txt after recovery = %q", f.Content)
	}

	// io resumed with lastSeq: the next frame is lastSeq+1, and the new
	// kernel's banner follows.
	io2 := openIO(t, wsURL(b.URL)+"/v1/sessions/"+c.SessionID+"/io?app=web&lastSeq="+strconv.Itoa(int(lastSeq)), nil)
	frames, _ = io2.readUntil(t, 30*time.Second, "web")
	want := lastSeq
	for _, f := range frames {
		if f.Text != "" {
			continue
		}
		want++
		if f.Seq != want {
			t.Fatalf("io seq %d after lastSeq %d, want %d (no gap, no duplicate)", f.Seq, lastSeq, want)
		}
	}
	if want == lastSeq {
		t.Fatalf("io after lastSeq %d carried no output frame", lastSeq)
	}

	// No process of the old workload is left.
	for _, pid := range old {
		if alive(pid) {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Errorf("process %d of the old workload still runs: %q", pid, strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	now := processesUnder(dataDir)
	for _, pid := range now {
		if slices.Contains(old, pid) {
			t.Errorf("old pid %d is among the new workload's processes", pid)
		}
	}
	if len(now) < 3 {
		t.Errorf("new workload processes = %v, want the workspace server and two kernels", now)
	}
}
