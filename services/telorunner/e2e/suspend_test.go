package e2e

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

var fastSupervisor = map[string]string{
	// 5 s: every sandboxed process start (local sandbox) re-executes the
	// race-built test binary; 3 s left too little margin on a loaded machine.
	"RUNNER_WATCH_IDLE_SECONDS":           "5",
	"RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "1",
	"RUNNER_SUPERVISOR_TICK_MS":           "200",
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// waitStatus polls GET /v1/sessions/:id (plain requests do not count as
// presence) until the status kind is want.
func waitStatus(t *testing.T, r *runner, id, want string, timeout time.Duration) map[string]any {
	t.Helper()
	var doc map[string]any
	var resp response
	reached := testkit.Poll(context.Background(), timeout, func() bool {
		resp = do(t, "GET", r.URL+"/v1/sessions/"+id, nil, nil)
		if resp.Status != 200 {
			return false
		}
		resp.json(t, &doc)
		return doc["status"].(map[string]any)["kind"] == want
	})
	if !reached {
		t.Fatalf("session %s did not reach %s within %v; last %d %s", id, want, timeout, resp.Status, resp.Body)
	}
	return doc
}

func tree(t *testing.T, r *runner, id string) string {
	t.Helper()
	resp := do(t, "GET", r.URL+"/v1/sessions/"+id+"/workspace", nil, nil)
	if resp.Status != 200 {
		t.Fatalf("GET workspace = %d %s", resp.Status, resp.Body)
	}
	return string(resp.Body)
}

var binaryContent = string([]byte{0, 1, 2, 255, 254, 10, 13, 0x80, 'x'})

// seedWatch creates a watch session, edits its workspace and returns it
// with its tree listing. An SSE client holds the session awake (presence)
// for the whole setup, so the idle window only starts when seedWatch
// returns: a slow setup on a loaded machine cannot be cut short by an idle
// suspend.
func seedWatch(t *testing.T, r *runner) (createdResp, string) {
	t.Helper()
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("sleepy", nil, nil), "notes/a.txt": "alpha\n"}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	// An open event stream keeps the session awake until the edits are in:
	// its idle clock runs from creation, so on a loaded machine (a start
	// slower than the idle window) it would suspend as soon as it runs,
	// racing the edits. Closed on return: the idle window starts then.
	awake := openSSE(t, r.URL+c.StreamURL, nil)
	defer awake.Close()
	waitStatus(t, r, c.SessionID, "running", 60*time.Second)
	// Edits after creation (including a binaryContent file) must survive suspend.
	resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/workspace", map[string]any{"write": []map[string]any{
		{"path": "notes/b.bin", "content": base64.StdEncoding.EncodeToString([]byte(binaryContent)), "encoding": "base64"},
		{"path": "notes/a.txt", "content": "alpha edited\n"},
	}}, nil)
	if resp.Status != 200 {
		t.Fatalf("write = %d %s", resp.Status, resp.Body)
	}
	return c, tree(t, r, c.SessionID)
}

func assertResumed(t *testing.T, r *runner, id, wantTree string) {
	t.Helper()
	// Kept awake while checked: a resume restarts the idle clock, and a
	// start slower than the idle window would suspend it again at once.
	awake := openSSE(t, r.URL+"/v1/sessions/"+id+"/events", nil)
	defer awake.Close()
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/resume", nil, nil); resp.Status != http.StatusAccepted || string(resp.Body) != `{"sessionId":"`+id+`"}` {
		t.Fatalf("resume = %d %s", resp.Status, resp.Body)
	}
	waitStatus(t, r, id, "running", 60*time.Second)
	if got := tree(t, r, id); got != wantTree {
		t.Fatalf("tree after resume = %s, want %s", got, wantTree)
	}
	var f struct{ Content string }
	do(t, "GET", r.URL+"/v1/sessions/"+id+"/workspace/file?path=notes/b.bin&encoding=base64", nil, nil).json(t, &f)
	if got, _ := base64.StdEncoding.DecodeString(f.Content); string(got) != binaryContent {
		t.Fatalf("binary after resume = %v, want %v", got, []byte(binaryContent))
	}
	// The run history: a generation attributed resume, ids continuing.
	evs := awake.until(t, 30*time.Second, func(e sseEvent) bool {
		return e.Event == "run" && strings.Contains(e.Data, `"trigger":"resume"`)
	})
	// Generations continue: the resumed one follows the last one opened.
	maxGen := 0
	for _, e := range evs[:len(evs)-1] {
		if e.Event == "run" && strings.Contains(e.Data, `"phase":"started"`) {
			maxGen = int(decode(t, e.Data)["generation"].(float64))
		}
	}
	if got := int(decode(t, evs[len(evs)-1].Data)["generation"].(float64)); got != maxGen+1 {
		t.Fatalf("resume generation = %d, want %d (after %s)", got, maxGen+1, summarize(evs))
	}
	sawSuspended := false
	for _, e := range evs {
		if isStatus("suspended")(e) {
			sawSuspended = true
		}
	}
	if !sawSuspended {
		t.Fatalf("history lacks the suspended status: %s", summarize(evs))
	}
}

func TestIdleSuspendAndResume(t *testing.T) {
	r := watchRunner(t, fastSupervisor)
	c, before := seedWatch(t, r)
	waitStatus(t, r, c.SessionID, "suspended", 30*time.Second)
	for _, path := range []string{"/workspace", "/reload"} {
		method := "GET"
		if path == "/reload" {
			method = "POST"
		}
		if resp := do(t, method, r.URL+"/v1/sessions/"+c.SessionID+path, nil, nil); resp.Status != 409 || !strings.Contains(string(resp.Body), "not_running") {
			t.Fatalf("%s on suspended = %d %s, want 409 not_running", path, resp.Status, resp.Body)
		}
	}
	assertResumed(t, r, c.SessionID, before)
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/resume", nil, nil); resp.Status != 404 || !strings.Contains(string(resp.Body), "not_suspended") {
		t.Fatalf("resume of a running session = %d %s, want 404 not_suspended", resp.Status, resp.Body)
	}
}

// The reference answers 404 here: its registry and checkpoints are in
// memory. Ours survive the whole process.
func TestResumeAfterFullRestart(t *testing.T) {
	dir := t.TempDir()
	vars := merge(fastSupervisor, map[string]string{"RUNNER_WATCH_SESSIONS": "true", "RUNNER_DATA_DIR": dir})
	r := startRunner(t, vars)
	c, before := seedWatch(t, r)
	waitStatus(t, r, c.SessionID, "suspended", 30*time.Second)
	r.stop()

	r2 := startRunner(t, merge(vars))
	waitStatus(t, r2, c.SessionID, "suspended", 10*time.Second)
	assertResumed(t, r2, c.SessionID, before)
}

// An open SSE or io client, on either of two edges, keeps a session from
// suspending; a session nobody watches suspends.
func TestPresenceKeepsSessionsAwake(t *testing.T) {
	r := watchRunner(t, fastSupervisor)
	other := startEdge(t, r, map[string]string{"RUNNER_WATCH_SESSIONS": "true"})
	body := func(name string) map[string]any {
		return watchBody(map[string]string{"telo.yaml": manifest(name, nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, "")
	}
	withSSE := r.create(t, body("sse"))
	withIO := r.create(t, body("io"))
	alone := r.create(t, body("alone"))
	sse := openSSE(t, other+withSSE.StreamURL, nil)
	// withIO is held awake by an SSE client until its io client is open:
	// its setup is not raced by the idle window.
	hold := openSSE(t, r.URL+withIO.StreamURL, nil)
	sse.until(t, 60*time.Second, isStatus("running"))
	hold.until(t, 60*time.Second, isStatus("running"))
	io := openIO(t, wsURL(r.URL)+"/v1/sessions/"+withIO.SessionID+"/io", nil)
	io.next(t, 10*time.Second, "the seq control frame")
	hold.Close()
	waitStatus(t, r, alone.SessionID, "suspended", 30*time.Second)
	// Well past the idle window, the watched ones are still running.
	// Well past the idle window (6 s against 5 s), check every 100 ms.
	deadline := time.Now().Add(6 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ; time.Now().Before(deadline); <-tick.C {
		for _, id := range []string{withSSE.SessionID, withIO.SessionID} {
			var doc map[string]any
			do(t, "GET", r.URL+"/v1/sessions/"+id, nil, nil).json(t, &doc)
			if k := doc["status"].(map[string]any)["kind"]; k != "running" {
				t.Fatalf("watched session %s is %v", id, k)
			}
		}
	}
	sse.Close()
	_ = io.Close()
	waitStatus(t, r, withSSE.SessionID, "suspended", 30*time.Second)
	waitStatus(t, r, withIO.SessionID, "suspended", 30*time.Second)
}

func TestPutAppsAddsAndRemoves(t *testing.T) {
	r := watchRunner(t, nil)
	files := map[string]string{"a/telo.yaml": manifest("a", nil, nil), "b/telo.yaml": manifest("b", nil, nil), "c/telo.yaml": manifest("c", nil, nil), "keep.txt": "keep me\n"}
	c := r.create(t, watchBody(files, []app{{Name: "a", Entry: "a/telo.yaml"}, {Name: "b", Entry: "b/telo.yaml"}}, ""))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	sse.untilAll(t, 60*time.Second, isStatus("running"), isRun("a", "started", 1))
	writeFiles(t, r, c.SessionID, map[string]string{"later.txt": "written later\n"})
	before := tree(t, r, c.SessionID)

	bad := do(t, "PUT", r.URL+"/v1/sessions/"+c.SessionID+"/apps", map[string]any{"apps": []map[string]any{{"name": "workspace", "entryRelativePath": "a/telo.yaml"}}}, nil)
	if bad.Status != 400 || !strings.Contains(string(bad.Body), "reserved_app_name") {
		t.Fatalf("PUT reserved = %d %s", bad.Status, bad.Body)
	}
	// The workspace server's port and the inspect ports are the runner's.
	for _, port := range []int{8099, 9231} {
		bad = do(t, "PUT", r.URL+"/v1/sessions/"+c.SessionID+"/apps", map[string]any{"apps": []map[string]any{
			{"name": "a", "entryRelativePath": "a/telo.yaml"}, {"name": "b", "entryRelativePath": "b/telo.yaml", "ports": []map[string]any{{"port": port, "protocol": "tcp"}}},
		}}, nil)
		if bad.Status != 400 || !strings.Contains(string(bad.Body), `"port_conflict"`) {
			t.Fatalf("PUT apps declaring %d = %d %s, want 400 port_conflict", port, bad.Status, bad.Body)
		}
	}
	if resp := do(t, "POST", r.URL+"/v1/sessions", watchBody(files, []app{{Name: "a", Entry: "a/telo.yaml", Ports: []int{8099}}}, ""), nil); resp.Status != 400 || !strings.Contains(string(resp.Body), `"port_conflict"`) {
		t.Fatalf("watch session declaring 8099 = %d %s, want 400 port_conflict", resp.Status, resp.Body)
	}
	resp := do(t, "PUT", r.URL+"/v1/sessions/"+c.SessionID+"/apps", map[string]any{"apps": []map[string]any{
		{"name": "a", "entryRelativePath": "a/telo.yaml"}, {"name": "c", "entryRelativePath": "c/telo.yaml", "io": "streams"},
	}}, nil)
	if resp.Status != 202 || string(resp.Body) != `{"apps":["a","c"]}` {
		t.Fatalf("PUT apps = %d %s", resp.Status, resp.Body)
	}
	var sawA, sawC bool
	sse.until(t, 60*time.Second, func(e sseEvent) bool {
		switch {
		case isRun("c", "started", 1)(e):
			sawC = true
		case isRun("a", "started", 2)(e):
			sawA = true
		default:
			return false
		}
		if !strings.Contains(e.Data, `"trigger":"resume"`) {
			t.Fatalf("run after PUT apps = %s, want trigger resume", e.Data)
		}
		return sawA && sawC
	})
	waitStatus(t, r, c.SessionID, "running", 30*time.Second)
	if got := tree(t, r, c.SessionID); got != before {
		t.Fatalf("tree after PUT apps = %s, want %s", got, before)
	}
	var doc struct {
		Apps []struct {
			Name       string
			IO         string
			Generation int
		}
	}
	do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID, nil, nil).json(t, &doc)
	if len(doc.Apps) != 2 || doc.Apps[0].Name != "a" || doc.Apps[1].Name != "c" || doc.Apps[1].IO != "streams" || doc.Apps[0].Generation != 2 {
		t.Fatalf("apps after PUT = %+v", doc.Apps)
	}
	io := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?app=b", nil)
	if code, _, _ := io.closeCode(t, 10*time.Second); code != 4404 {
		t.Fatalf("io of removed app = %d, want 4404", code)
	}
}

// Evicted sessions leave no record, subjects, bundle or checkpoint.
func TestSuspendedTTLEvictsEverything(t *testing.T) {
	r := watchRunner(t, merge(fastSupervisor, map[string]string{"RUNNER_WATCH_SUSPENDED_TTL_SECONDS": "1"}))
	c, _ := seedWatch(t, r)
	waitStatus(t, r, c.SessionID, "suspended", 30*time.Second)
	testkit.Eventually(t, 30*time.Second, func() bool {
		return do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID, nil, nil).Status == 404
	}, "suspended session not evicted")
	js, _ := jetstream.New(r.connect(t, bus.RoleSupervisor))
	ctx := context.Background()
	for stream, subject := range map[string]string{bus.StreamEvents: bus.EventsSubject(c.SessionID), bus.StreamIO: bus.IOSubjects(c.SessionID)} {
		s, _ := js.Stream(ctx, stream)
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		if len(info.State.Subjects) != 0 {
			t.Errorf("%s still holds %v", stream, info.State.Subjects)
		}
	}
	bundles, _ := js.ObjectStore(ctx, bus.ObjectBundles)
	if _, err := bundles.GetInfo(ctx, c.SessionID); err == nil {
		t.Error("bundle still stored")
	}
	bundlesKV, _ := js.KeyValue(ctx, bus.BucketBundles)
	if _, err := bundlesKV.Get(ctx, c.SessionID); err == nil {
		t.Error("bundle still stored in " + bus.BucketBundles)
	}
	cps, _ := js.KeyValue(ctx, bus.BucketCheckpoints)
	if _, err := cps.Get(ctx, c.SessionID); err == nil {
		t.Error("checkpoint manifest still stored")
	}
	sessions, _ := js.KeyValue(ctx, bus.BucketSessions)
	if _, err := sessions.Get(ctx, c.SessionID); err == nil {
		t.Error("record still stored")
	}
}

// A clean restart suspends watch sessions with a final checkpoint instead
// of stopping them (19.1–19.3): the edit made just before the restart is
// there after resume.
func TestCleanRestartSuspendsWatchSessions(t *testing.T) {
	dir := t.TempDir()
	vars := map[string]string{"RUNNER_WATCH_SESSIONS": "true", "RUNNER_DATA_DIR": dir}
	r := startRunner(t, vars)
	c, _ := seedWatch(t, r)
	writeFiles(t, r, c.SessionID, map[string]string{"last-second.txt": "saved just before the restart\n"})
	before := tree(t, r, c.SessionID)
	r.stop()
	r2 := startRunner(t, merge(vars))
	waitStatus(t, r2, c.SessionID, "suspended", 10*time.Second)
	assertResumed(t, r2, c.SessionID, before)
}

// DELETE of a suspended session stops it and drops its checkpoint (19.18);
// resume re-checks the watch ceiling (19.20).
func TestSuspendedDeleteAndResumeCeiling(t *testing.T) {
	r := watchRunner(t, merge(fastSupervisor, map[string]string{"RUNNER_WATCH_MAX_SESSIONS": "1"}))
	c, _ := seedWatch(t, r)
	waitStatus(t, r, c.SessionID, "suspended", 30*time.Second)
	// The suspended event is appended once the admission ledger no longer
	// counts the session live (the record turns suspended first).
	suspended := openSSE(t, r.URL+c.StreamURL, nil)
	suspended.until(t, 30*time.Second, isStatus("suspended"))
	suspended.Close()
	// Another live watch session takes the only slot: resume is refused.
	other := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("other", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	sse := openSSE(t, r.URL+"/v1/sessions/"+other.SessionID+"/events", nil)
	sse.until(t, 60*time.Second, isStatus("running"))
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/resume", nil, nil); resp.Status != 409 || !strings.Contains(string(resp.Body), "too_many_watch_sessions") {
		t.Fatalf("resume over the ceiling = %d %s", resp.Status, resp.Body)
	}
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil); resp.Status != 204 {
		t.Fatalf("DELETE suspended = %d", resp.Status)
	}
	doc := waitStatus(t, r, c.SessionID, "stopped", 10*time.Second)
	if doc["exitedAt"] == nil {
		t.Fatalf("stopped without exitedAt: %v", doc)
	}
	js, _ := jetstream.New(r.connect(t, bus.RoleSupervisor))
	cps, _ := js.KeyValue(context.Background(), bus.BucketCheckpoints)
	if _, err := cps.Get(context.Background(), c.SessionID); err == nil {
		t.Fatal("checkpoint kept after DELETE of a suspended session")
	}
	evs := openSSE(t, r.URL+"/v1/sessions/"+c.SessionID+"/events", nil).drain(t, 10*time.Second)
	if last := evs[len(evs)-1]; !isStatus("stopped")(last) {
		t.Fatalf("last event = %+v, want stopped", last)
	}
}
