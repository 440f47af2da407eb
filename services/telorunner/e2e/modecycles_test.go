package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// cycleState is what the client wrote: every file's content, and which
// files carry the executable bit (set inside the workspace, as an agent's
// `chmod +x` does: the /v1 change set carries no mode).
type cycleState struct {
	files map[string]string
	exec  map[string]bool
}

// wantTree is the contract's WorkspaceTree (4.8) of the files written.
func (s cycleState) wantTree() string {
	type entry struct {
		Path string `json:"path"`
		Hash string `json:"hash"`
	}
	out := struct {
		Files []entry `json:"files"`
	}{Files: []entry{}}
	for _, p := range slices.Sorted(maps.Keys(s.files)) {
		sum := sha256.Sum256([]byte(s.files[p]))
		out.Files = append(out.Files, entry{p, hex.EncodeToString(sum[:])})
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// checkCycle asserts the live workspace is exactly what the client wrote:
// the tree over /v1 (paths and content hashes) and, on disk, each file's
// executable bit.
func checkCycle(t *testing.T, r *runner, id, step string, want cycleState) {
	t.Helper()
	if got := tree(t, r, id); got != want.wantTree() {
		t.Fatalf("%s: tree = %s\nwant %s", step, got, want.wantTree())
	}
	root := filepath.Join(r.DataDir, "sessions", id, "workspace")
	for p := range want.files {
		fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if got := fi.Mode().Perm()&0o100 != 0; got != want.exec[p] {
			t.Fatalf("%s: %s has mode %v, want executable=%v", step, p, fi.Mode().Perm(), want.exec[p])
		}
	}
}

// edit writes one round of a cycle through /v1 (a file of its own, a
// rewrite of a shared file, the next app's entry, the previous scratch
// file deleted) and flips the executable bit of the tool script in the
// workspace, as the co-resident agent would.
func (s cycleState) edit(t *testing.T, r *runner, id string, round int) {
	t.Helper()
	writes := []map[string]any{
		{"path": fmt.Sprintf("round%02d/own.txt", round), "content": fmt.Sprintf("round %d\n", round)},
		{"path": "shared.txt", "content": fmt.Sprintf("v%d\n", round)},
		{"path": fmt.Sprintf("scratch%02d.txt", round), "content": "temporary\n"},
		{"path": fmt.Sprintf("w%02d/telo.yaml", round), "content": manifest(fmt.Sprintf("w%02d", round), nil, nil)},
	}
	body := map[string]any{"write": writes}
	if round > 1 {
		gone := fmt.Sprintf("scratch%02d.txt", round-1)
		body["delete"] = []string{gone}
		delete(s.files, gone)
	}
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/workspace", body, nil); resp.Status != 200 {
		t.Fatalf("round %d: write = %d %s", round, resp.Status, resp.Body)
	}
	for _, w := range writes {
		s.files[w["path"].(string)] = w["content"].(string)
	}
	script := filepath.Join(r.DataDir, "sessions", id, "workspace", "tools", "run.sh")
	mode := fs.FileMode(0o644)
	if !s.exec["tools/run.sh"] {
		mode = 0o755
	}
	if err := os.Chmod(script, mode); err != nil {
		t.Fatalf("round %d: chmod: %v", round, err)
	}
	s.exec["tools/run.sh"] = mode&0o100 != 0
}

// Five times over: edit, suspend by idleness, resume, edit, suspend by a
// clean restart of the runner, resume, change the app set. After every
// step the workspace is exactly what the client wrote, file modes
// included (issue 15; comparable products lose files after a second
// resume, or keep less on auto-pause than on manual pause).
func TestEditSuspendResumeRestartAppsCycles(t *testing.T) {
	vars := merge(fastSupervisor, map[string]string{"RUNNER_WATCH_SESSIONS": "true", "RUNNER_DATA_DIR": t.TempDir(),
		"RUNNER_WATCH_RELOAD_LIMIT": "100000"})
	r := startRunner(t, vars)
	state := cycleState{
		files: map[string]string{"telo.yaml": manifest("cycles", nil, nil), "shared.txt": "v0\n", "tools/run.sh": "#!/bin/sh\necho run\n"},
		exec:  map[string]bool{},
	}
	c := r.create(t, watchBody(state.files, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	id := c.SessionID
	awake := openSSE(t, r.URL+c.StreamURL, nil)
	awake.until(t, 60*time.Second, isRun("app", "started", 0))
	// The workspace marker the runner seeds (9.7) is part of the tree.
	var marker struct{ Content string }
	if resp := do(t, "GET", r.URL+"/v1/sessions/"+id+"/workspace/file?path=telo-workspace.yaml", nil, nil); resp.Status != 200 {
		t.Fatalf("read the workspace marker = %d %s", resp.Status, resp.Body)
	} else {
		resp.json(t, &marker)
	}
	state.files["telo-workspace.yaml"] = marker.Content
	resume := func(step string) {
		t.Helper()
		if resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/resume", nil, nil); resp.Status != http.StatusAccepted {
			t.Fatalf("%s: resume = %d %s", step, resp.Status, resp.Body)
		}
		awake = openSSE(t, r.URL+"/v1/sessions/"+id+"/events", nil) // awake while checked and edited
		waitStatus(t, r, id, "running", 60*time.Second)
		checkCycle(t, r, id, step+": after resume", state)
	}
	round := 0
	for cycle := 1; cycle <= 5; cycle++ {
		// Suspend by idleness.
		round++
		state.edit(t, r, id, round)
		checkCycle(t, r, id, fmt.Sprintf("cycle %d: after edit", cycle), state)
		awake.Close()
		waitStatus(t, r, id, "suspended", 60*time.Second)
		resume(fmt.Sprintf("cycle %d (idle suspend)", cycle))

		// Suspend by a clean restart.
		round++
		state.edit(t, r, id, round)
		awake.Close()
		r.stop()
		r = startRunner(t, vars)
		waitStatus(t, r, id, "suspended", 30*time.Second)
		resume(fmt.Sprintf("cycle %d (restart)", cycle))

		// A new app set: the app of this round replaces the last one.
		app := fmt.Sprintf("w%02d", round)
		put := map[string]any{"apps": []map[string]any{{"name": "app", "entryRelativePath": "telo.yaml"}, {"name": app, "entryRelativePath": app + "/telo.yaml"}}}
		if resp := do(t, "PUT", r.URL+"/v1/sessions/"+id+"/apps", put, nil); resp.Status != http.StatusAccepted {
			t.Fatalf("cycle %d: PUT apps = %d %s", cycle, resp.Status, resp.Body)
		}
		awake.until(t, 60*time.Second, isRun(app, "started", 1))
		checkCycle(t, r, id, fmt.Sprintf("cycle %d: after PUT apps", cycle), state)
	}
	awake.Close()
}
