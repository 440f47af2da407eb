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
