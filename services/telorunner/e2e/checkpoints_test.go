package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// applyChanges applies a change set to the live workspace.
func applyChanges(t *testing.T, r *runner, id string, write map[string]string, del ...string) {
	t.Helper()
	ws := []map[string]any{}
	for p, c := range write {
		ws = append(ws, map[string]any{"path": p, "content": c})
	}
	body := map[string]any{"write": ws}
	if len(del) > 0 {
		body["delete"] = del
	}
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/workspace", body, nil); resp.Status != 200 {
		t.Fatalf("write = %d %s", resp.Status, resp.Body)
	}
}

// Write A, checkpoint, write B, restore the first checkpoint: the tree is
// A again (B's new file removed, A's deleted file back), every app ran a
// new generation (trigger watch), and a restore checkpoint is recorded.
func TestCheckpointRestore(t *testing.T) {
	r := watchRunner(t, nil)
	web, worker := manifest("web", nil, nil), manifest("worker", nil, nil)
	c := r.create(t, watchBody(map[string]string{"web/telo.yaml": web, "worker/telo.yaml": worker, "README.md": "start\n"},
		[]app{{Name: "web", Entry: "web/telo.yaml"}, {Name: "worker", Entry: "worker/telo.yaml", IO: "streams"}}, ""))
	id := c.SessionID
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	defer sse.Close()
	sse.until(t, 60*time.Second, isStatus("running"))
	waitGenerations(t, r, id, 60*time.Second, func(_ string, g int) bool { return g >= 1 })

	// A: both entries edited, a note added.
	applyChanges(t, r, id, map[string]string{"web/telo.yaml": web + "# A\n", "worker/telo.yaml": worker + "# A\n", "notes/a.txt": "A\n"})
	treeA := tree(t, r, id)
	cpA := takeCheckpoint(t, r, id)
	if cpA.Reason != "manual" || cpA.Files != treeFiles(t, treeA) || cpA.ID == "" {
		t.Fatalf("checkpoint A = %+v, want manual, %d files", cpA, treeFiles(t, treeA))
	}
	if h := checkpoints(t, r, id); !slices.Contains(h, cpA) {
		t.Fatalf("history after A = %+v, want %+v in it", h, cpA)
	}

	// B: the web entry only (the worker's entry keeps A's content), A's
	// note deleted, another added.
	gensA := generations(t, r, id)
	applyChanges(t, r, id, map[string]string{"web/telo.yaml": web + "# B\n", "notes/b.txt": "B\n"}, "notes/a.txt")
	if tree(t, r, id) == treeA {
		t.Fatal("tree B equals tree A")
	}
	// Wait for B's reload of the web app, then count from there.
	gensB := waitGenerations(t, r, id, 30*time.Second, func(app string, g int) bool { return app != "web" || g > gensA[app] })

	resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/checkpoints/"+cpA.ID+"/restore", nil, nil)
	if resp.Status != http.StatusAccepted {
		t.Fatalf("restore = %d %s, want 202", resp.Status, resp.Body)
	}
	var res struct {
		Restored   string
		Checkpoint checkpointDoc
	}
	resp.json(t, &res)
	if res.Restored != cpA.ID || res.Checkpoint.Reason != "restore" || res.Checkpoint.Files != cpA.Files || res.Checkpoint.Bytes != cpA.Bytes {
		t.Fatalf("restore answer = %s", resp.Body)
	}
	if got := tree(t, r, id); got != treeA {
		t.Fatalf("tree after restore = %s, want A %s", got, treeA)
	}
	// Every app reloads: web because its entry was rewritten, worker
	// because its (unchanged) entry was touched.
	waitGenerations(t, r, id, 30*time.Second, func(app string, g int) bool { return g > gensB[app] })
	reloaded := map[string]bool{}
	sse.until(t, 30*time.Second, func(e sseEvent) bool {
		if e.Event == "run" && strings.Contains(e.Data, `"phase":"started"`) {
			ev := decode(t, e.Data)
			app, _ := ev["app"].(string)
			if ev["trigger"] == "watch" && int(ev["generation"].(float64)) > gensB[app] {
				reloaded[app] = true
			}
		}
		return reloaded["web"] && reloaded["worker"]
	})
	// Newest first: the restore entry, after it only periodic ones.
	h := checkpoints(t, r, id)
	i := slices.IndexFunc(h, func(e checkpointDoc) bool { return e.ID == res.Checkpoint.ID })
	if i < 0 || h[i] != res.Checkpoint || slices.ContainsFunc(h[:i], func(e checkpointDoc) bool { return e.Reason != "periodic" }) {
		t.Fatalf("history after restore = %+v, want %+v newest but for periodic ones", h, res.Checkpoint)
	}
	for i := 1; i < len(h); i++ {
		if h[i-1].TakenAt < h[i].TakenAt {
			t.Fatalf("history not newest first: %+v", h)
		}
	}
}

func TestCheckpointRefusals(t *testing.T) {
	r := watchRunner(t, nil)
	run := r.create(t, runBody(manifest("once", nil, nil), nil, false))
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("one", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	waitStatus(t, r, c.SessionID, "running", 60*time.Second)
	if h := checkpoints(t, r, c.SessionID); h == nil {
		t.Fatal("history = null, want an array")
	}
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v1/sessions/aaaaaaaaaaaa/checkpoints", 404, "not_found"},
		{"POST", "/v1/sessions/aaaaaaaaaaaa/checkpoints", 404, "not_found"},
		{"POST", "/v1/sessions/aaaaaaaaaaaa/checkpoints/1/restore", 404, "not_found"},
		{"GET", "/v1/sessions/" + run.SessionID + "/checkpoints", 409, "not_a_watch_session"},
		{"POST", "/v1/sessions/" + run.SessionID + "/checkpoints", 409, "not_a_watch_session"},
		{"POST", "/v1/sessions/" + run.SessionID + "/checkpoints/1/restore", 409, "not_a_watch_session"},
		{"POST", "/v1/sessions/" + c.SessionID + "/checkpoints/999/restore", 404, "checkpoint_not_found"},
		{"POST", "/v1/sessions/" + c.SessionID + "/checkpoints/x.y/restore", 404, "checkpoint_not_found"},
	} {
		resp := do(t, tc.method, r.URL+tc.path, nil, nil)
		if resp.Status != tc.status || !strings.Contains(string(resp.Body), `"error":"`+tc.code+`"`) {
			t.Fatalf("%s %s = %d %s, want %d %s", tc.method, tc.path, resp.Status, resp.Body, tc.status, tc.code)
		}
	}
	cp := takeCheckpoint(t, r, c.SessionID)
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil); resp.Status != 204 {
		t.Fatalf("DELETE = %d", resp.Status)
	}
	waitStatus(t, r, c.SessionID, "stopped", 30*time.Second)
	for _, path := range []string{"/checkpoints", "/checkpoints/" + cp.ID + "/restore"} {
		resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+path, nil, nil)
		if resp.Status != 409 || !strings.Contains(string(resp.Body), `"error":"not_running"`) {
			t.Fatalf("POST %s of a stopped session = %d %s, want 409 not_running", path, resp.Status, resp.Body)
		}
	}
	// The history is still listed (until eviction).
	if h := checkpoints(t, r, c.SessionID); !slices.Contains(h, cp) {
		t.Fatalf("history of a stopped session = %+v, want %+v in it", h, cp)
	}
}
