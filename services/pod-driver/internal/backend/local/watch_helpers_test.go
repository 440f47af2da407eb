package local

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/local/sandboxinit"
)

// newWatchBackend is newBackend with the workspace server built by
// TestMain.
func newWatchBackend(t *testing.T, mod func(*Options)) *Backend {
	t.Helper()
	if workspaceServerErr != nil {
		t.Fatal(workspaceServerErr)
	}
	return newBackend(t, func(o *Options) {
		o.WorkspaceServerCommand = []string{workspaceServerPath}
		if mod != nil {
			mod(o)
		}
	})
}

// watchSpec is a watch session of apps over a bundle of files.
func watchSpec(apps []backend.App, files ...contract.BundleFile) backend.Spec {
	return backend.Spec{
		SessionID: contract.NewSessionID(),
		Mode:      contract.ModeWatch,
		Bundle:    contract.Bundle{EntryRelativePath: apps[0].Entry, Files: files},
		Env:       map[string]string{},
		Inspect:   true,
		Apps:      apps,
	}
}

// webWorker is the two-app session most tests use: web (tty, with port
// when non-zero) and worker (streams).
func webWorker(port int) backend.Spec {
	var ports []contract.PortMapping
	if port != 0 {
		ports = []contract.PortMapping{{Port: port, Protocol: "tcp"}}
	}
	return watchSpec([]backend.App{
		{Name: "web", Entry: "web/telo.yaml", IO: contract.IOTTY, Ports: ports},
		{Name: "worker", Entry: "./worker/telo.yaml", IO: contract.IOStreams},
	},
		contract.BundleFile{RelativePath: "web/telo.yaml", Contents: manifest("web", ports)},
		contract.BundleFile{RelativePath: "worker/telo.yaml", Contents: manifest("worker", nil)},
	)
}

// startWatch starts spec and returns the watch workload.
func startWatch(t *testing.T, b *Backend, spec backend.Spec, rec *recorder) *WatchWorkload {
	t.Helper()
	w, ok := start(t, b, spec, rec).(*WatchWorkload)
	if !ok {
		t.Fatal("Start() of a watch session did not return a *WatchWorkload")
	}
	return w
}

// appEvents returns the names of the event frames app delivered so far.
func (r *recorder) appEvents(app string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return eventNames(r.debugBy[app])
}

// waitEvents waits until app delivered n frames of event.
func (r *recorder) waitEvents(t *testing.T, app, event string, n int) {
	t.Helper()
	r.waitFor(t, fmt.Sprintf("%d %s frames of %s", n, event, app), func() bool {
		return countOf(eventNames(r.debugBy[app]), event) >= n
	})
}

func countOf(names []string, name string) int {
	n := 0
	for _, v := range names {
		if v == name {
			n++
		}
	}
	return n
}

// wsURL is the workspace server's base URL the session reported.
func (r *recorder) wsURL(t *testing.T) string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.workspace) != 1 {
		t.Fatalf("WorkspaceReady() calls = %v, want one", r.workspace)
	}
	return r.workspace[0]
}

// wsHTTP is the tests' client of workspace servers; no keep-alive, so no
// connection goroutine outlives a request.
var wsHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// wsCall sends one JSON request to a workspace server and decodes a 200
// answer into out (when not nil).
func wsCall(t *testing.T, base, method, path string, in, out any) {
	t.Helper()
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := wsHTTP.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s = %d %s (%v), want 200", method, path, resp.StatusCode, data, err)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, data, err)
		}
	}
}

// writeFile writes one file through the workspace server.
func writeFile(t *testing.T, base, path, content string) {
	t.Helper()
	cs := map[string]any{"write": []map[string]string{{"path": path, "content": content}}}
	wsCall(t, base, http.MethodPost, "/workspace", cs, nil)
}

// treePaths lists the workspace tree's paths.
func treePaths(t *testing.T, base string) []string {
	t.Helper()
	var tree struct {
		Files []struct{ Path, Hash string }
	}
	wsCall(t, base, http.MethodGet, "/workspace", nil, &tree)
	var paths []string
	for _, f := range tree.Files {
		paths = append(paths, f.Path)
	}
	return paths
}

// environ reads a process's environment from /proc.
func environ(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", workloadPID(t, pid)))
	if err != nil {
		t.Fatalf("read environment of %d: %v", pid, err)
	}
	env := map[string]string{}
	for kv := range strings.SplitSeq(strings.TrimSuffix(string(data), "\x00"), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

// cmdline reads a process's argv from /proc.
func cmdline(t *testing.T, pid int) []string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", workloadPID(t, pid)))
	if err != nil {
		t.Fatalf("read command line of %d: %v", pid, err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
}

// pidFile reads a session's pid file.
func pidFile(t *testing.T, b *Backend, id string) []int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(b.root, id, pidFileName))
	if err != nil {
		t.Fatalf("read pid file: %v", err)
	}
	var ids []int
	for _, f := range strings.Fields(string(data)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pid file %q: %v", data, err)
		}
		ids = append(ids, n)
	}
	return ids
}

// groups returns the session's running process groups by role once the
// pid file lists them (it is rewritten just after a restart) and every
// one is a live group leader.
func groups(t *testing.T, b *Backend, w *WatchWorkload) map[string]int {
	t.Helper()
	var g map[string]int
	poll(t, "pid file to list the running process groups", func() bool {
		g = w.processGroups()
		var want []int
		for _, role := range w.roles() {
			if id, ok := g[role]; ok {
				want = append(want, id)
			}
		}
		return slices.Equal(pidFile(t, b, w.id), want)
	})
	for role, pgid := range g {
		if got, err := unix.Getpgid(pgid); err != nil || got != pgid {
			t.Fatalf("%s: Getpgid(%d) = %d, %v; want a group leader", role, pgid, got, err)
		}
	}
	return g
}

// workloadPID is the host pid of the program a held process runs: the
// process itself unsandboxed; in a sandbox, the only child of its init
// (stage 1), which exec'd the program.
func workloadPID(t *testing.T, pid int) int {
	t.Helper()
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatalf("read environment of %d: %v", pid, err)
	}
	if !strings.HasPrefix(string(env), sandboxinit.Env+"=") {
		return pid
	}
	var child int
	poll(t, fmt.Sprintf("the sandboxed program of %d", pid), func() bool {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if err != nil {
			t.Fatalf("children of sandbox init %d: %v", pid, err)
		}
		f := strings.Fields(string(data))
		if len(f) != 1 {
			return false
		}
		child, _ = strconv.Atoi(f[0])
		// Exec'd: its own environment and command line (both read empty
		// while the exec is under way).
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", child))
		cmd, cerr := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", child))
		return err == nil && cerr == nil && len(env) > 0 && len(cmd) > 0 &&
			!strings.HasPrefix(string(env), sandboxinit.Env+"=") && !strings.HasPrefix(string(cmd), "telorunner-sandbox")
	})
	return child
}

// hostPID finds, among this machine's processes, the one a sandbox knows
// as nsPID whose command line contains marker; 0 when none.
func hostPID(nsPID int, marker string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for l := range strings.SplitSeq(string(status), "\n") {
			if ids, ok := strings.CutPrefix(l, "NSpid:"); ok {
				f := strings.Fields(ids)
				if len(f) > 1 && f[len(f)-1] == strconv.Itoa(nsPID) {
					if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), marker) {
						return pid
					}
				}
			}
		}
	}
	return 0
}
