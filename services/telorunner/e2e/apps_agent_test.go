package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
)

// groupRecord is the local backend's record of a live process group
// (<work dir>/.groups/<session>.<pid>.json; RUNNER_WORK_DIR defaults to
// <data dir>/sessions).
type groupRecord struct {
	Session string `json:"session"`
	Role    string `json:"role"`
	PID     int    `json:"pid"`
}

// groups reads session id's process group records by role.
func groups(t *testing.T, r *runner, id string) map[string]int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(r.DataDir, "sessions", ".groups", id+".*.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue // removed meanwhile
		}
		if err != nil {
			t.Fatal(err)
		}
		var g groupRecord
		if err := json.Unmarshal(data, &g); err != nil {
			t.Fatalf("decode %s: %v", f, err)
		}
		out[g.Role] = g.PID
	}
	return out
}

func roles(g map[string]int) string {
	var out []string
	for role, pid := range g {
		out = append(out, fmt.Sprintf("%s=%d", role, pid))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// portBody is what GET http://127.0.0.1:port/ answers, "" when nothing
// answers.
func portBody(port int) string {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return string(b)
}

// PUT apps (4.12) with an app set that declares the co-resident agent's
// port drops the agent (19.20, 12.3 manifest wins): a progress notice says
// so, the agent's process stops, its endpoint leaves the running status
// and the session document, and its port is then the app's. An app the
// new set leaves out has its process stopped: its process group record is
// gone and its pid no longer runs.
func TestPutAppsDropsAgentAndStopsRemovedApp(t *testing.T) {
	agentPort, aPort := freePort(t), freePort(t)
	// The agent is a devkernel serving the agent's port (the local
	// backend runs an absolute executable path as the agent's image; the
	// agent works in the workspace, where its manifest is).
	r := watchRunner(t, map[string]string{
		"RUNNER_APPS": fmt.Sprintf(`{"helper":{"image":%q,"port":%d}}`, devkernel+" run agent.yaml", agentPort),
	})
	files := map[string]string{
		"agent.yaml":  manifest("helper", []int{agentPort}, nil),
		"a/telo.yaml": manifest("a", []int{aPort}, nil),
		"b/telo.yaml": manifest("b", nil, nil),
		"c/telo.yaml": manifest("c", []int{agentPort}, nil),
	}
	c := r.create(t, watchBody(files, []app{{Name: "a", Entry: "a/telo.yaml", Ports: []int{aPort}}, {Name: "b", Entry: "b/telo.yaml"}}, "helper"))
	id := c.SessionID
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	evs := sse.until(t, 60*time.Second, isStatus("running"))
	st := decode(t, evs[len(evs)-1].Data)["status"].(map[string]any)
	if ag, _ := st["agent"].(map[string]any); ag == nil || ag["port"].(float64) != float64(agentPort) {
		t.Fatalf("running.agent = %v, want port %d", st["agent"], agentPort)
	}
	sse.until(t, 30*time.Second, isRun("b", "started", 1))
	testkit.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(portBody(agentPort), "devkernel helper ")
	}, "the agent answering on its port %d", agentPort)
	before := groups(t, r, id)
	for _, role := range []string{"agent", "app-a", "app-b", "workspace"} {
		if pid := before[role]; pid == 0 || !alive(pid) {
			t.Fatalf("process groups before = %s, want a live %s", roles(before), role)
		}
	}

	resp := do(t, "PUT", r.URL+"/v1/sessions/"+id+"/apps", map[string]any{"apps": []map[string]any{
		{"name": "a", "entryRelativePath": "a/telo.yaml", "ports": []map[string]any{{"port": aPort, "protocol": "tcp"}}},
		{"name": "c", "entryRelativePath": "c/telo.yaml", "ports": []map[string]any{{"port": agentPort, "protocol": "tcp"}}},
	}}, nil)
	if resp.Status != http.StatusAccepted || string(resp.Body) != `{"apps":["a","c"]}` {
		t.Fatalf("PUT apps = %d %s, want 202 {\"apps\":[\"a\",\"c\"]}", resp.Status, resp.Body)
	}
	notice := fmt.Sprintf(`co-resident agent \"helper\" was stopped: app \"c\" declares its port tcp/%d`, agentPort)
	var sawNotice bool
	evs = sse.until(t, 90*time.Second, func(e sseEvent) bool {
		if e.Event == "progress" && strings.Contains(e.Data, notice) {
			sawNotice = true
		}
		return sawNotice && isStatus("running")(e)
	})
	st = decode(t, evs[len(evs)-1].Data)["status"].(map[string]any)
	if ag, ok := st["agent"]; ok {
		t.Fatalf("running after the change carries agent %v, want none", ag)
	}
	var ports []float64
	for _, ep := range st["endpoints"].([]any) {
		ports = append(ports, ep.(map[string]any)["port"].(float64))
	}
	if len(ports) != 2 || !strings.Contains(fmt.Sprint(ports), fmt.Sprint(agentPort)) {
		t.Fatalf("running endpoints = %v, want a's %d and c's %d", ports, aPort, agentPort)
	}
	var doc map[string]any
	do(t, "GET", r.URL+"/v1/sessions/"+id, nil, nil).json(t, &doc)
	if ag, ok := doc["agent"]; ok {
		t.Fatalf("session document has agent %v after the change, want none", ag)
	}

	// The dropped agent's and the removed app's processes are gone.
	for _, role := range []string{"agent", "app-b"} {
		if alive(before[role]) {
			t.Errorf("%s (pid %d) still runs after PUT apps", role, before[role])
		}
	}
	var after map[string]int
	testkit.Eventually(t, 30*time.Second, func() bool {
		after = groups(t, r, id)
		return after["app-a"] != 0 && after["app-c"] != 0 && after["workspace"] != 0
	}, "process groups of the new app set; have %v", after)
	if _, ok := after["agent"]; ok {
		t.Errorf("process groups after = %s, want no agent", roles(after))
	}
	if _, ok := after["app-b"]; ok {
		t.Errorf("process groups after = %s, want no app-b", roles(after))
	}
	for role, pid := range after {
		if !alive(pid) {
			t.Errorf("recorded %s (pid %d) is not running", role, pid)
		}
	}
	// The agent's port is now c's.
	testkit.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(portBody(agentPort), "devkernel c generation 1")
	}, "app c answering on the agent's former port %d (answer %q)", agentPort, portBody(agentPort))
}
