package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// Several suspend/resume cycles in a row keep every file written in any
// cycle, and each cycle's edits and deletions (users of comparable
// products report files lost after the second resume). Each cycle writes
// a file of its own, rewrites one shared file, deletes the previous
// cycle's scratch file, waits for the idle suspend, resumes, and then
// reads every file back.
func TestSuspendResumeCycles(t *testing.T) {
	r := watchRunner(t, fastSupervisor)
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("cycles", nil, nil), "shared.txt": "v0\n"}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	id := c.SessionID
	waitStatus(t, r, id, "running", 60*time.Second)
	want := map[string]string{"telo.yaml": "", "shared.txt": "v0\n"}
	for cycle := 1; cycle <= 3; cycle++ {
		own := fmt.Sprintf("cycle%d/own.bin", cycle)
		content := fmt.Sprintf("cycle %d\x00\xff", cycle)
		writes := []map[string]any{
			{"path": own, "content": base64.StdEncoding.EncodeToString([]byte(content)), "encoding": "base64"},
			{"path": "shared.txt", "content": fmt.Sprintf("v%d\n", cycle)},
			{"path": fmt.Sprintf("scratch%d.txt", cycle), "content": "temporary\n"},
		}
		body := map[string]any{"write": writes}
		if cycle > 1 {
			body["delete"] = []string{fmt.Sprintf("scratch%d.txt", cycle-1)}
			delete(want, fmt.Sprintf("scratch%d.txt", cycle-1))
		}
		if resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/workspace", body, nil); resp.Status != 200 {
			t.Fatalf("cycle %d: write = %d %s", cycle, resp.Status, resp.Body)
		}
		want[own] = content
		want["shared.txt"] = fmt.Sprintf("v%d\n", cycle)
		want[fmt.Sprintf("scratch%d.txt", cycle)] = "temporary\n"
		before := tree(t, r, id)

		waitStatus(t, r, id, "suspended", 60*time.Second)
		if resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/resume", nil, nil); resp.Status != http.StatusAccepted {
			t.Fatalf("cycle %d: resume = %d %s", cycle, resp.Status, resp.Body)
		}
		waitStatus(t, r, id, "running", 60*time.Second)
		if got := tree(t, r, id); got != before {
			t.Fatalf("cycle %d: tree after resume = %s, want %s", cycle, got, before)
		}
		for path, w := range want {
			if path == "telo.yaml" {
				continue
			}
			var f struct {
				Content string `json:"content"`
			}
			resp := do(t, "GET", r.URL+"/v1/sessions/"+id+"/workspace/file?path="+path+"&encoding=base64", nil, nil)
			if resp.Status != 200 {
				t.Fatalf("cycle %d: read %s = %d %s", cycle, path, resp.Status, resp.Body)
			}
			resp.json(t, &f)
			if got, _ := base64.StdEncoding.DecodeString(f.Content); string(got) != w {
				t.Fatalf("cycle %d: %s after resume = %q, want %q", cycle, path, got, w)
			}
		}
		if cycle > 1 {
			gone := fmt.Sprintf("scratch%d.txt", cycle-1)
			if resp := do(t, "GET", r.URL+"/v1/sessions/"+id+"/workspace/file?path="+gone, nil, nil); resp.Status != 404 {
				t.Fatalf("cycle %d: deleted %s after resume = %d %s, want 404", cycle, gone, resp.Status, resp.Body)
			}
		}
	}
}

// A write the runner acknowledged is never lost to a suspend: a writer
// keeps writing new files while the session goes idle and suspends (writes
// do not count as presence, 13.2); every write answered 200 is in the
// workspace after the resume. Writes racing the suspend are refused (409
// not_running) once the owner froze the workspace for its final
// checkpoint, never accepted and then dropped.
func TestSuspendLosesNoAcknowledgedWrite(t *testing.T) {
	// Every write counts against the reload budget (30 a minute by default).
	r := watchRunner(t, merge(fastSupervisor, map[string]string{"RUNNER_WATCH_RELOAD_LIMIT": "100000"}))
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("writer", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	id := c.SessionID
	waitStatus(t, r, id, "running", 60*time.Second)
	var acked []string
	refused := 0
	deadline := time.Now().Add(90 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		path := fmt.Sprintf("w/%05d.txt", n)
		resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/workspace", map[string]any{"write": []map[string]any{{"path": path, "content": path}}}, nil)
		if resp.Status == 200 {
			acked = append(acked, path)
			continue
		}
		// 409 not_running once frozen or suspended; 502 workspace_error
		// while the stopped workload's record still says running.
		if resp.Status != 409 && resp.Status != 502 {
			t.Fatalf("write %s = %d %s, want 200, or 409 not_running / 502 while suspending", path, resp.Status, resp.Body)
		}
		refused++
		var doc map[string]any
		do(t, "GET", r.URL+"/v1/sessions/"+id, nil, nil).json(t, &doc)
		if doc["status"].(map[string]any)["kind"] == "suspended" {
			break
		}
	}
	if len(acked) == 0 {
		t.Fatal("no write was acknowledged before the suspend")
	}
	waitStatus(t, r, id, "suspended", 60*time.Second)
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/resume", nil, nil); resp.Status != http.StatusAccepted {
		t.Fatalf("resume = %d %s", resp.Status, resp.Body)
	}
	waitStatus(t, r, id, "running", 60*time.Second)
	lost := missingFromTree(t, r, id, acked)
	if len(lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes lost to the suspend (first %s); %d writes refused", len(lost), len(acked), lost[0], refused)
	}
	t.Logf("%d writes acknowledged and kept, %d refused while suspending", len(acked), refused)
}

// A write the runner acknowledged is never lost to a change of the app
// set (4.12): the workspace is frozen for the checkpoint the new workload
// starts from, so a write lands before it or is refused (409
// not_running), never accepted and then dropped.
func TestAppsChangeLosesNoAcknowledgedWrite(t *testing.T) {
	r := watchRunner(t, map[string]string{"RUNNER_WATCH_RELOAD_LIMIT": "100000"})
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("writer", nil, nil), "b/telo.yaml": manifest("b", nil, nil)},
		[]app{{Name: "app", Entry: "telo.yaml"}}, ""))
	id := c.SessionID
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	sse.until(t, 60*time.Second, isRun("app", "started", 0))
	var acked []string
	refused := 0
	write := func(n int) {
		path := fmt.Sprintf("w/%05d.txt", n)
		resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/workspace", map[string]any{"write": []map[string]any{{"path": path, "content": path}}}, nil)
		switch resp.Status {
		case 200:
			acked = append(acked, path)
		case 409, 502: // frozen, or the old workload going
			refused++
		default:
			t.Fatalf("write %s = %d %s, want 200, or 409 / 502 while the app set changes", path, resp.Status, resp.Body)
		}
	}
	n := 0
	for ; n < 20; n++ {
		write(n)
	}
	put := map[string]any{"apps": []map[string]any{{"name": "app", "entryRelativePath": "telo.yaml"}, {"name": "b", "entryRelativePath": "b/telo.yaml"}}}
	done := make(chan response, 1)
	go func() {
		done <- do(t, "PUT", r.URL+"/v1/sessions/"+id+"/apps", put, nil)
	}()
	// Keep writing until the new app runs.
	deadline := time.After(120 * time.Second)
writing:
	for ; ; n++ {
		for drained := false; !drained; {
			select {
			case ev, ok := <-sse.Events:
				if !ok {
					t.Fatal("event stream ended while the app set changed")
				}
				if isRun("b", "started", 1)(ev) {
					break writing
				}
			case <-deadline:
				t.Fatal("app b did not start within 120 s of PUT apps")
			default:
				drained = true
			}
		}
		write(n)
	}
	if resp := <-done; resp.Status != 202 {
		t.Fatalf("PUT apps = %d %s", resp.Status, resp.Body)
	}
	lost := missingFromTree(t, r, id, acked)
	if len(lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes lost to the app-set change (first %s); %d refused", len(lost), len(acked), lost[0], refused)
	}
	t.Logf("%d writes acknowledged and kept, %d refused while the app set changed", len(acked), refused)
}

// missingFromTree is the paths of want the session's workspace tree lacks.
func missingFromTree(t *testing.T, r *runner, id string, want []string) []string {
	t.Helper()
	var doc struct {
		Files []struct {
			Path string `json:"path"`
		} `json:"files"`
	}
	do(t, "GET", r.URL+"/v1/sessions/"+id+"/workspace", nil, nil).json(t, &doc)
	have := map[string]bool{}
	for _, f := range doc.Files {
		have[f.Path] = true
	}
	var lost []string
	for _, p := range want {
		if !have[p] {
			lost = append(lost, p)
		}
	}
	return lost
}
