package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// copyExecutable copies the program at src to dst (mode 0755) through a
// rename, so a process still running the old dst is not disturbed.
func copyExecutable(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// PUT apps answers 202 once the owner took the change; when the new
// workload cannot start (here its workspace server fails), the event
// stream says so: `failed` with "changing the app set failed: <detail>"
// (contract 4.12 step 7). The session keeps the app set it had (only a
// success records the new one), and a PUT apps on it now answers 409
// not_running.
func TestPutAppsRecreateFailure(t *testing.T) {
	wsCmd := filepath.Join(t.TempDir(), "workspace-server")
	copyExecutable(t, workspaceServer, wsCmd)
	r := startRunnerWith(t, map[string]string{
		"RUNNER_WATCH_SESSIONS":           "true",
		"RUNNER_DATA_DIR":                 t.TempDir(),
		"RUNNER_KERNEL_COMMAND":           devkernel,
		"RUNNER_WORKSPACE_SERVER_COMMAND": wsCmd,
		"RUNNER_WORKSPACE_READY_SECONDS":  "10",
	})
	files := map[string]string{"a/telo.yaml": manifest("a", nil, nil), "b/telo.yaml": manifest("b", nil, nil)}
	c := r.create(t, watchBody(files, []app{{Name: "a", Entry: "a/telo.yaml"}}, ""))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	defer sse.Close()
	sse.untilAll(t, 60*time.Second, isStatus("running"), isRun("a", "started", 1))

	// The next workload's workspace server exits at once.
	falseBin := "/bin/false"
	if _, err := os.Stat(falseBin); err != nil {
		falseBin = "/usr/bin/false"
	}
	copyExecutable(t, falseBin, wsCmd)
	put := map[string]any{"apps": []map[string]any{{"name": "a", "entryRelativePath": "a/telo.yaml"}, {"name": "b", "entryRelativePath": "b/telo.yaml"}}}
	start := time.Now()
	resp := do(t, "PUT", r.URL+"/v1/sessions/"+c.SessionID+"/apps", put, nil)
	if resp.Status != 202 || string(resp.Body) != `{"apps":["a","b"]}` {
		t.Fatalf("PUT apps = %d %s, want 202 {\"apps\":[\"a\",\"b\"]}", resp.Status, resp.Body)
	}
	took := time.Since(start)
	if took > 5*time.Second {
		t.Errorf("PUT apps took %v, want an answer once the change is taken", took)
	}
	t.Logf("PUT apps answered 202 in %v", took)
	evs := sse.until(t, 60*time.Second, isStatus("failed"))
	t.Logf("failed status %v after the PUT", time.Since(start))
	st, _ := decode(t, evs[len(evs)-1].Data)["status"].(map[string]any)
	msg, _ := st["message"].(string)
	if !strings.HasPrefix(msg, "changing the app set failed: ") || !strings.Contains(msg, "workspace") {
		t.Errorf("failed status = %v, want message \"changing the app set failed: <the workspace server's failure>\"", st)
	}
	doc := waitStatus(t, r, c.SessionID, "failed", 10*time.Second)
	apps, _ := doc["apps"].([]any)
	if len(apps) != 1 || apps[0].(map[string]any)["name"] != "a" {
		t.Errorf("apps after the failed change = %v, want only a", doc["apps"])
	}
	resp = do(t, "PUT", r.URL+"/v1/sessions/"+c.SessionID+"/apps", put, nil)
	if resp.Status != 409 || !strings.Contains(string(resp.Body), `"not_running"`) {
		t.Errorf("PUT apps on the failed session = %d %s, want 409 not_running", resp.Status, resp.Body)
	}
}
