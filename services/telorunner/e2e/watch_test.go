package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type app struct {
	Name  string
	Entry string
	Ports []int
	IO    string
}

func watchBody(files map[string]string, apps []app, agent string) map[string]any {
	fl := []map[string]any{}
	for p, c := range files {
		fl = append(fl, map[string]any{"relativePath": p, "contents": c})
	}
	as := []map[string]any{}
	for _, a := range apps {
		ps := []map[string]any{}
		for _, p := range a.Ports {
			ps = append(ps, map[string]any{"port": p, "protocol": "tcp"})
		}
		io := a.IO
		if io == "" {
			io = "tty"
		}
		as = append(as, map[string]any{"name": a.Name, "entryRelativePath": a.Entry, "ports": ps, "io": io})
	}
	b := map[string]any{
		"mode":    "watch",
		"bundle":  map[string]any{"entryRelativePath": apps[0].Entry, "files": fl},
		"env":     map[string]any{"SESSION_SECRET": "s3cr3t"},
		"config":  map[string]any{"image": "telorun/node:latest-slim", "pullPolicy": "missing"},
		"inspect": true,
		"apps":    as,
	}
	if agent != "" {
		b["agent"] = agent
	}
	return b
}

func isRun(app, phase string, gen int) func(sseEvent) bool {
	return func(e sseEvent) bool {
		return e.Event == "run" && strings.Contains(e.Data, `"app":"`+app+`"`) && strings.Contains(e.Data, `"phase":"`+phase+`"`) &&
			(gen == 0 || strings.Contains(e.Data, fmt.Sprintf(`"generation":%d,`, gen)))
	}
}

func writeFiles(t *testing.T, r *runner, id string, files map[string]string) response {
	t.Helper()
	var ws []map[string]any
	for p, c := range files {
		ws = append(ws, map[string]any{"path": p, "content": c})
	}
	return do(t, "POST", r.URL+"/v1/sessions/"+id+"/workspace", map[string]any{"write": ws}, nil)
}

func watchRunner(t *testing.T, extra map[string]string) *runner {
	vars := map[string]string{"RUNNER_WATCH_SESSIONS": "true"}
	for k, v := range extra {
		vars[k] = v
	}
	return startRunner(t, vars)
}

// The heart of watch sessions: two apps, edits reload only their app,
// broken manifests fail a run but not the session, ports come and go.
func TestWatchSessionTwoApps(t *testing.T) {
	r := watchRunner(t, nil)
	webPort, newPort := freePort(t), freePort(t)
	workerPort := freePort(t)
	files := map[string]string{
		"web/telo.yaml":    manifest("web", []int{webPort}, nil),
		"worker/telo.yaml": manifest("worker", []int{workerPort}, nil),
		"README.md":        "hello\n",
	}
	c := r.create(t, watchBody(files, []app{{Name: "web", Entry: "web/telo.yaml", Ports: []int{webPort}}, {Name: "worker", Entry: "worker/telo.yaml", Ports: []int{workerPort}, IO: "streams"}}, ""))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	seen := sse.until(t, 60*time.Second, isStatus("running"))
	st := decode(t, seen[len(seen)-1].Data)["status"].(map[string]any)
	if eps := st["endpoints"].([]any); len(eps) != 2 {
		t.Fatalf("running endpoints = %v, want both apps' ports", eps)
	}
	sse.until(t, 30*time.Second, isRun("web", "started", 1))

	// GET workspace: the tree with hashes, marker seeded.
	var tree struct {
		Files []struct{ Path, Hash string } `json:"files"`
	}
	resp := do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID+"/workspace", nil, nil)
	if resp.Status != 200 {
		t.Fatalf("GET workspace = %d %s", resp.Status, resp.Body)
	}
	resp.json(t, &tree)
	paths := []string{}
	for _, f := range tree.Files {
		if len(f.Hash) != 64 {
			t.Fatalf("hash of %s = %q", f.Path, f.Hash)
		}
		paths = append(paths, f.Path)
	}
	if got := strings.Join(paths, ","); got != "README.md,telo-workspace.yaml,web/telo.yaml,worker/telo.yaml" {
		t.Fatalf("tree paths = %s", got)
	}

	// Edit web: web's generation 1 completes and 2 starts (watch); worker untouched.
	if resp := writeFiles(t, r, c.SessionID, map[string]string{"web/telo.yaml": manifest("web", []int{webPort}, map[string]any{"startDelayMs": 1})}); resp.Status != 200 || string(resp.Body) != `{"written":1,"deleted":0}` {
		t.Fatalf("POST workspace = %d %s", resp.Status, resp.Body)
	}
	evs := sse.until(t, 30*time.Second, isRun("web", "started", 2))
	last := decode(t, evs[len(evs)-1].Data)
	if last["trigger"] != "watch" {
		t.Fatalf("web generation 2 trigger = %v, want watch", last["trigger"])
	}
	sawCompleted := false
	for _, e := range evs {
		if isRun("web", "completed", 1)(e) {
			sawCompleted = true
			if !strings.Contains(e.Data, `"durationMs":`) {
				t.Errorf("completed without durationMs: %s", e.Data)
			}
		}
		if e.Event == "run" && strings.Contains(e.Data, `"app":"worker"`) && !isRun("worker", "started", 1)(e) {
			t.Fatalf("worker got a run event from web's edit: %s", e.Data)
		}
	}
	if !sawCompleted {
		t.Fatalf("no completed for web gen 1 before gen 2: %s", summarize(evs))
	}

	// Broken manifest: run failed, session still running; fixing starts the next.
	writeFiles(t, r, c.SessionID, map[string]string{"web/telo.yaml": "kind: Nope\n"})
	evs = sse.until(t, 30*time.Second, isRun("web", "failed", 0))
	failed := decode(t, evs[len(evs)-1].Data)
	if failed["reason"] != "ERR_MANIFEST_VALIDATION_FAILED" {
		t.Fatalf("failed run = %v", failed)
	}
	failedGen := int(failed["generation"].(float64))
	var doc map[string]any
	do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID, nil, nil).json(t, &doc)
	if doc["status"].(map[string]any)["kind"] != "running" {
		t.Fatalf("session after failed run = %v", doc["status"])
	}
	writeFiles(t, r, c.SessionID, map[string]string{"web/telo.yaml": manifest("web", []int{webPort, newPort}, nil)})
	isEndpoints := func(e sseEvent) bool { return e.Event == "endpoints" && strings.Contains(e.Data, `"app":"web"`) }
	sse.until(t, 30*time.Second, isRun("web", "started", failedGen+1))
	evs = sse.until(t, 30*time.Second, isEndpoints)
	ep := decode(t, evs[len(evs)-1].Data)
	if added, _ := ep["added"].([]any); len(added) != 1 || added[0].(map[string]any)["port"].(float64) != float64(newPort) || ep["rejected"] != nil || ep["removed"] != nil {
		t.Fatalf("endpoints = %v, want exactly port %d added", ep, newPort)
	}
	sse.until(t, 30*time.Second, func(e sseEvent) bool {
		return e.Event == "reachability" && strings.Contains(e.Data, fmt.Sprintf(`"port":%d,"state":"reachable"`, newPort))
	})
	if resp := do(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/", newPort), nil, nil); !strings.Contains(string(resp.Body), "devkernel web") {
		t.Fatalf("new port answered %q", resp.Body)
	}
	// The other app's port is rejected for web (and web's kernel, which
	// still tries to bind it, fails that generation: the port is taken).
	writeFiles(t, r, c.SessionID, map[string]string{"web/telo.yaml": manifest("web", []int{webPort, newPort, workerPort}, nil)})
	evs = sse.until(t, 30*time.Second, isEndpoints)
	ep = decode(t, evs[len(evs)-1].Data)
	rejected, _ := ep["rejected"].([]any)
	if len(rejected) != 1 || rejected[0].(map[string]any)["port"].(float64) != float64(workerPort) || !strings.Contains(rejected[0].(map[string]any)["reason"].(string), "another app") || ep["added"] != nil {
		t.Fatalf("endpoints = %v, want worker's port %d rejected", ep, workerPort)
	}
	do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID, nil, nil).json(t, &doc)
	for _, a := range doc["apps"].([]any) {
		am := a.(map[string]any)
		if am["name"] == "web" && len(am["ports"].([]any)) != 2 {
			t.Fatalf("web ports in session doc = %v, want 2", am["ports"])
		}
	}

	// Workspace file read, utf8 and base64; missing file 404.
	var f struct {
		Content string
		Size    int
	}
	do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID+"/workspace/file?path=README.md", nil, nil).json(t, &f)
	if f.Content != "hello\n" || f.Size != 6 {
		t.Fatalf("file = %+v", f)
	}
	do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID+"/workspace/file?path=README.md&encoding=base64", nil, nil).json(t, &f)
	if f.Content != base64.StdEncoding.EncodeToString([]byte("hello\n")) {
		t.Fatalf("base64 file = %+v", f)
	}
	if resp := do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID+"/workspace/file?path=nope.txt", nil, nil); resp.Status != 404 || !strings.Contains(string(resp.Body), "file_not_found") {
		t.Fatalf("missing file = %d %s", resp.Status, resp.Body)
	}

	// Reload one app: manual trigger; unknown app 404.
	resp = do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/reload?app=worker", nil, nil)
	if resp.Status != 202 || string(resp.Body) != `{"reloaded":["worker"]}` {
		t.Fatalf("reload = %d %s", resp.Status, resp.Body)
	}
	evs = sse.until(t, 30*time.Second, isRun("worker", "started", 2))
	if !strings.Contains(evs[len(evs)-1].Data, `"trigger":"manual"`) {
		t.Fatalf("reload run = %s, want manual", evs[len(evs)-1].Data)
	}
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/reload?app=ghost", nil, nil); resp.Status != 404 || !strings.Contains(string(resp.Body), "unknown_app") {
		t.Fatalf("reload ghost = %d %s", resp.Status, resp.Body)
	}
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil); resp.Status != 204 {
		t.Fatalf("DELETE = %d", resp.Status)
	}
	sse.until(t, 30*time.Second, isStatus("stopped"))
}

// io modes: streams apps separate stdout (1) and stderr (2), refuse resize
// and see no TTY; tty apps are tag 0 with a TTY; several apps need ?app=.
func TestWatchIOModes(t *testing.T) {
	r := watchRunner(t, nil)
	files := map[string]string{"a/telo.yaml": manifest("tty-app", nil, nil), "b/telo.yaml": manifest("streams-app", nil, nil)}
	c := r.create(t, watchBody(files, []app{{Name: "tty", Entry: "a/telo.yaml"}, {Name: "pipes", Entry: "b/telo.yaml", IO: "streams"}}, ""))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	sse.until(t, 60*time.Second, isStatus("running"))

	noApp := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io", nil)
	if code, reason, _ := noApp.closeCode(t, 10*time.Second); code != 4404 || reason != "session runs 2 apps — ?app= is required" {
		t.Fatalf("io without app = %d %q", code, reason)
	}
	ghost := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?app=ghost", nil)
	if code, reason, _ := ghost.closeCode(t, 10*time.Second); code != 4404 || reason != "session runs no app named 'ghost'" {
		t.Fatalf("io ghost app = %d %q", code, reason)
	}

	p := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?app=pipes", nil)
	if f := p.next(t, 10*time.Second, "the streams app's seq control frame"); !strings.Contains(f.Text, `"io":"streams"`) || !strings.Contains(f.Text, `"app":"pipes"`) {
		t.Fatalf("seq frame = %+v", f)
	}
	out, errOut := p.readStreams(t, 30*time.Second, "tty=false", "ready")
	if !strings.Contains(out, "devkernel streams-app generation 1 tty=false") || strings.Contains(out, "\x1b[") {
		t.Fatalf("streams stdout = %q, want an uncoloured tty=false banner on tag 1", out)
	}
	if !strings.Contains(errOut, "devkernel streams-app ready") {
		t.Fatalf("streams stderr = %q, want ready on tag 2", errOut)
	}
	if err := p.WriteMessage(1, []byte(`{"type":"resize","cols":80,"rows":24}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-p.Frames:
		if f.Text != `{"type":"error","error":"resize_unsupported","io":"streams"}` {
			t.Fatalf("resize reply = %+v", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no resize_unsupported reply")
	}

	tty := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?app=tty", nil)
	if f := tty.next(t, 10*time.Second, "the tty app's seq control frame"); !strings.Contains(f.Text, `"io":"tty"`) {
		t.Fatalf("tty seq frame = %+v", f)
	}
	frames, text := tty.readUntil(t, 30*time.Second, "tty=true")
	for _, f := range frames {
		if f.Text == "" && f.Tag != 0 {
			t.Fatalf("tty frame tag %d", f.Tag)
		}
	}
	if !strings.Contains(text, "\x1b[") {
		t.Errorf("tty banner not coloured (CLICOLOR_FORCE): %q", text)
	}
}

// The reload budget: 30 per minute, the 31st is 429 with Retry-After.
func TestWatchReloadBudget(t *testing.T) {
	r := watchRunner(t, nil)
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("r", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	sse.untilAll(t, 60*time.Second, isStatus("running"), isRun("app", "started", 1))
	for i := 1; i <= 30; i++ {
		if resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/reload", nil, nil); resp.Status != 202 {
			t.Fatalf("reload %d = %d %s", i, resp.Status, resp.Body)
		}
	}
	resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/reload", nil, nil)
	if resp.Status != http.StatusTooManyRequests || !strings.Contains(string(resp.Body), "reload_rate_limited") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("31st reload = %d %s (Retry-After %q), want 429", resp.Status, resp.Body, resp.Header.Get("Retry-After"))
	}
	evs := sse.until(t, 30*time.Second, isRun("app", "started", 2))
	if !strings.Contains(evs[len(evs)-1].Data, `"trigger":"manual"`) {
		t.Fatalf("reload generation = %s, want manual", evs[len(evs)-1].Data)
	}
}

// Every workspace route refuses a traversal corpus (write, delete and read,
// each checked), and nothing lands outside the workspace: a sentinel file
// beside the workspace and beside each of its ancestors up to the data
// directory, where the corpus's ../ paths point, stays as it was, is never
// read back, and never shows in the tree listing.
func TestWatchWorkspaceTraversal(t *testing.T) {
	r := watchRunner(t, map[string]string{"RUNNER_WATCH_RELOAD_LIMIT": "1000"})
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("t", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	openSSE(t, r.URL+c.StreamURL, nil).until(t, 60*time.Second, isStatus("running"))
	ws := workspaceDir(t, r.DataDir)
	var sentinels []string
	for dir := filepath.Dir(ws); ; dir = filepath.Dir(dir) {
		p := filepath.Join(dir, "sentinel", "pwn")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("sentinel\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		sentinels = append(sentinels, p)
		if dir == filepath.Clean(r.DataDir) || len(dir) <= len(filepath.Clean(r.DataDir)) {
			break
		}
	}
	before := listTree(t, r.DataDir)
	corpus := []string{
		"..", ".", "", "../x", "../../x", "a/../../x", "a/..", "./..", "/..", "../", "a/../..",
		"x/../../../../etc/passwd", "../sentinel/pwn", "../../sentinel/pwn", "../../../sentinel/pwn",
		"..\x00/x", "a\x00b", "x/", "a/b/", "./", "//", "/../../", "..//x", ".//../x",
		"a/./../../x", "a/b/../../../x", "../workspace/x", "../../../../../../../../tmp/x",
		"....//..//x/..", "x/../..", "%2e%2e/x/../..", "..\\../x/../..",
	}
	refused := func(what, p string, resp response) bool {
		want := `"error":"invalid_path"`
		if p == "" && what != "read" {
			want = `"error":"invalid_request"` // the body schema's minLength 1 (4.9)
		}
		if resp.Status != 400 || !strings.Contains(string(resp.Body), want) {
			t.Errorf("%s %q = %d %s, want 400 %s", what, p, resp.Status, resp.Body, want)
			return false
		}
		return true
	}
	n := 0
	for _, p := range corpus {
		w := refused("write", p, do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/workspace", map[string]any{"write": []map[string]any{{"path": p, "content": "pwned"}}}, nil))
		d := refused("delete", p, do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/workspace", map[string]any{"delete": []string{p}}, nil))
		g := refused("read", p, do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID+"/workspace/file?path="+urlQuery(p), nil, nil))
		if w && d && g {
			n++
		}
	}
	if n != len(corpus) {
		t.Errorf("%d of %d corpus paths refused on every route, want all", n, len(corpus))
	}
	// Absolute paths normalize INTO the workspace.
	writeFiles(t, r, c.SessionID, map[string]string{"/etc/abs.txt": "inside"})
	var f struct{ Content string }
	do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID+"/workspace/file?path=etc/abs.txt", nil, nil).json(t, &f)
	if f.Content != "inside" {
		t.Fatalf("absolute path landed at %+v, want inside the workspace at etc/abs.txt", f)
	}
	if listing := tree(t, r, c.SessionID); strings.Contains(listing, "sentinel") || strings.Contains(listing, "pwn") {
		t.Errorf("the workspace tree reports a file outside the workspace: %s", listing)
	}
	after := listTree(t, r.DataDir)
	for p := range after {
		if _, ok := before[p]; !ok && !strings.HasPrefix(p, ws+"/") && !strings.Contains(p, "nats") {
			t.Errorf("new file outside the workspace: %s", p)
		}
	}
	for _, p := range sentinels {
		got, err := os.ReadFile(p)
		if err != nil || string(got) != "sentinel\n" || after[p] != before[p] {
			t.Errorf("sentinel %s changed: %q %v (stat %s, was %s)", p, got, err, after[p], before[p])
		}
	}
}

// workspaceDir finds the one watch workspace under dataDir: the directory
// named workspace that holds the seeded telo.yaml.
func workspaceDir(t *testing.T, dataDir string) string {
	t.Helper()
	var found []string
	_ = filepath.Walk(dataDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.IsDir() && info.Name() == "workspace" {
			if _, err := os.Stat(filepath.Join(p, "telo.yaml")); err == nil {
				found = append(found, p)
			}
		}
		return nil
	})
	if len(found) != 1 {
		t.Fatalf("workspace directories with telo.yaml under %s = %v, want one", dataDir, found)
	}
	return found[0]
}

func urlQuery(s string) string {
	r := strings.NewReplacer("%", "%25", "&", "%26", "#", "%23", "+", "%2B", "\x00", "%00", " ", "%20", "?", "%3F")
	return r.Replace(s)
}

func listTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	_ = filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return nil
		}
		out[p] = fmt.Sprint(info.Size(), info.ModTime().UnixNano())
		return nil
	})
	return out
}
