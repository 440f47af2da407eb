package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// forkVars: a create body carrying a 10 MiB workspace (base64) fits.
var forkVars = map[string]string{"RUNNER_BODY_LIMIT_BYTES": "33554432"}

// bigWatchBody is a two-app watch session (web, worker; no ports, so a
// fork runs beside its source on one machine) with n random files of
// size bytes each under data/.
func bigWatchBody(t *testing.T, n, size int) map[string]any {
	t.Helper()
	files := []map[string]any{
		{"relativePath": "web/telo.yaml", "contents": manifest("web", nil, nil)},
		{"relativePath": "worker/telo.yaml", "contents": manifest("worker", nil, nil)},
	}
	for i := range n {
		b := make([]byte, size)
		_, _ = rand.Read(b)
		files = append(files, map[string]any{"relativePath": fmt.Sprintf("data/blob-%02d.bin", i),
			"contents": base64.StdEncoding.EncodeToString(b), "encoding": "base64"})
	}
	body := watchBody(nil, []app{{Name: "web", Entry: "web/telo.yaml"}, {Name: "worker", Entry: "worker/telo.yaml", IO: "streams"}}, "")
	body["bundle"] = map[string]any{"entryRelativePath": "web/telo.yaml", "files": files}
	return body
}

// generations returns each app's generation from GET /v1/sessions/:id.
func generations(t *testing.T, r *runner, id string) map[string]int {
	t.Helper()
	var doc struct {
		Apps []struct {
			Name       string
			Generation int
		}
	}
	resp := do(t, "GET", r.URL+"/v1/sessions/"+id, nil, nil)
	if resp.Status != 200 {
		t.Fatalf("GET session %s = %d %s", id, resp.Status, resp.Body)
	}
	resp.json(t, &doc)
	out := map[string]int{}
	for _, a := range doc.Apps {
		out[a.Name] = a.Generation
	}
	return out
}

// waitGenerations polls until every app's generation passes ok.
func waitGenerations(t *testing.T, r *runner, id string, timeout time.Duration, ok func(app string, gen int) bool) map[string]int {
	t.Helper()
	var g map[string]int
	if !testkit.Poll(context.Background(), timeout, func() bool {
		g = generations(t, r, id)
		for name, gen := range g {
			if !ok(name, gen) {
				return false
			}
		}
		return len(g) > 0
	}) {
		t.Fatalf("generations of %s = %v after %v", id, g, timeout)
	}
	return g
}

// blobBytes is the size of runner_blobs (every blob and manifest object,
// metadata included).
func blobBytes(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	obs, err := js.ObjectStore(t.Context(), bus.ObjectBlobs)
	if err != nil {
		t.Fatal(err)
	}
	st, err := obs.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// treeFiles counts the files of a GET workspace answer.
func treeFiles(t *testing.T, tree string) int {
	t.Helper()
	var doc struct{ Files []any }
	if err := json.Unmarshal([]byte(tree), &doc); err != nil {
		t.Fatal(err)
	}
	return len(doc.Files)
}

type checkpointDoc struct {
	ID      string `json:"id"`
	TakenAt string `json:"takenAt"`
	Reason  string `json:"reason"`
	Files   int    `json:"files"`
	Bytes   int64  `json:"bytes"`
}

func checkpoints(t *testing.T, r *runner, id string) []checkpointDoc {
	t.Helper()
	resp := do(t, "GET", r.URL+"/v1/sessions/"+id+"/checkpoints", nil, nil)
	if resp.Status != 200 {
		t.Fatalf("GET checkpoints of %s = %d %s", id, resp.Status, resp.Body)
	}
	var out struct{ Checkpoints []checkpointDoc }
	resp.json(t, &out)
	return out.Checkpoints
}

func takeCheckpoint(t *testing.T, r *runner, id string) checkpointDoc {
	t.Helper()
	resp := do(t, "POST", r.URL+"/v1/sessions/"+id+"/checkpoints", nil, nil)
	if resp.Status != http.StatusCreated {
		t.Fatalf("POST checkpoints of %s = %d %s, want 201", id, resp.Status, resp.Body)
	}
	var c checkpointDoc
	resp.json(t, &c)
	return c
}

// Fork a live two-app session with a 10 MiB workspace: the fork's tree is
// the source's, the fork runs both apps, the source saw no new
// generation, and runner_blobs grew by less than 1 KB (a metadata copy).
func TestForkLiveSession(t *testing.T) {
	r := watchRunner(t, forkVars)
	const n, size = 40, 256 << 10
	src := r.create(t, bigWatchBody(t, n, size))
	waitStatus(t, r, src.SessionID, "running", 120*time.Second)
	srcGens := waitGenerations(t, r, src.SessionID, 60*time.Second, func(_ string, g int) bool { return g >= 1 })
	srcTree := tree(t, r, src.SessionID)

	// The source's tree is in the store (a manual checkpoint): the fork
	// must add nothing to it.
	c := takeCheckpoint(t, r, src.SessionID)
	if c.Reason != "manual" || c.Files != treeFiles(t, srcTree) || c.Bytes < n*size {
		t.Fatalf("manual checkpoint = %+v, want %d files of at least %d bytes", c, treeFiles(t, srcTree), n*size)
	}
	_, js := func() (any, jetstream.JetStream) {
		js, err := jetstream.New(r.connect(t, bus.RoleProxy))
		if err != nil {
			t.Fatal(err)
		}
		return nil, js
	}()
	before := blobBytes(t, js)

	t0 := time.Now()
	resp := do(t, "POST", r.URL+"/v1/sessions/"+src.SessionID+"/fork", map[string]any{}, nil)
	took := time.Since(t0)
	if resp.Status != http.StatusCreated {
		t.Fatalf("fork = %d %s, want 201", resp.Status, resp.Body)
	}
	var fork createdResp
	resp.json(t, &fork)
	if fork.SessionID == src.SessionID || fork.StreamURL != "/v1/sessions/"+fork.SessionID+"/events" || fork.CreatedAt == "" {
		t.Fatalf("fork answer = %s", resp.Body)
	}
	t.Logf("fork of a %d-file, %d-byte live workspace answered in %v", c.Files, c.Bytes, took)

	waitStatus(t, r, fork.SessionID, "running", 120*time.Second)
	forkGens := waitGenerations(t, r, fork.SessionID, 60*time.Second, func(_ string, g int) bool { return g >= 1 })
	if len(forkGens) != 2 {
		t.Fatalf("fork apps = %v, want web and worker", forkGens)
	}
	if got := tree(t, r, fork.SessionID); got != srcTree {
		t.Fatalf("fork tree differs from the source's:\n fork %.300s\n src  %.300s", got, srcTree)
	}
	if grew := int64(blobBytes(t, js)) - int64(before); grew >= 1024 {
		t.Fatalf("runner_blobs grew by %d bytes across the fork, want < 1024", grew)
	}
	// The source was read, not disturbed.
	if got := generations(t, r, src.SessionID); fmt.Sprint(got) != fmt.Sprint(srcGens) {
		t.Fatalf("source generations after the fork = %v, before %v", got, srcGens)
	}
	if got := tree(t, r, src.SessionID); got != srcTree {
		t.Fatal("source tree changed across the fork")
	}
	// The fork's history starts with the copy; the source's newest entry
	// is the fresh checkpoint taken for the fork.
	fh := checkpoints(t, r, fork.SessionID)
	if len(fh) == 0 || fh[len(fh)-1].Reason != "fork" || fh[len(fh)-1].Files != c.Files || fh[len(fh)-1].Bytes != c.Bytes {
		t.Fatalf("fork history = %+v, want a first fork entry of %d files, %d bytes", fh, c.Files, c.Bytes)
	}
	sh := checkpoints(t, r, src.SessionID)
	found := false
	for _, e := range sh {
		found = found || e.Reason == "fork"
	}
	if !found {
		t.Fatalf("source history = %+v, want a fork entry", sh)
	}
	// The fork is a session of its own: its own workspace.
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+fork.SessionID+"/workspace", map[string]any{"write": []map[string]any{{"path": "only-fork.txt", "content": "x"}}}, nil); resp.Status != 200 {
		t.Fatalf("write to fork = %d %s", resp.Status, resp.Body)
	}
	if strings.Contains(tree(t, r, src.SessionID), "only-fork.txt") {
		t.Fatal("a write to the fork reached the source")
	}
}

// A fork of a suspended session starts from its last checkpoint; the
// body's apps replace the source's.
func TestForkSuspendedWithApps(t *testing.T) {
	r := watchRunner(t, fastSupervisor)
	src, _ := seedWatch(t, r)
	want := tree(t, r, src.SessionID)
	waitStatus(t, r, src.SessionID, "suspended", 60*time.Second)
	resp := do(t, "POST", r.URL+"/v1/sessions/"+src.SessionID+"/fork", map[string]any{"apps": []map[string]any{
		{"name": "other", "entryRelativePath": "telo.yaml", "io": "streams"},
	}}, nil)
	if resp.Status != http.StatusCreated {
		t.Fatalf("fork of a suspended session = %d %s, want 201", resp.Status, resp.Body)
	}
	var fork createdResp
	resp.json(t, &fork)
	sse := openSSE(t, r.URL+fork.StreamURL, nil) // presence: the fork stays live
	defer sse.Close()
	doc := waitStatus(t, r, fork.SessionID, "running", 60*time.Second)
	apps, _ := json.Marshal(doc["apps"])
	if !strings.Contains(string(apps), `"name":"other"`) || strings.Contains(string(apps), `"name":"app"`) {
		t.Fatalf("fork apps = %s, want only other", apps)
	}
	if got := tree(t, r, fork.SessionID); got != want {
		t.Fatalf("fork tree = %s, want the source's last checkpoint %s", got, want)
	}
	// The source stays suspended.
	waitStatus(t, r, src.SessionID, "suspended", time.Second)
}

// Refusals follow create's and the workspace routes' conventions: terms
// (428), unknown (404), not a watch session (409), an invalid body (400),
// the watch ceiling (409).
func TestForkRefusals(t *testing.T) {
	r := watchRunner(t, map[string]string{"RUNNER_WATCH_MAX_SESSIONS": "1", "RUNNER_TERMS_VERSION": "v1", "RUNNER_TERMS_BODY": "Be nice."})
	terms := map[string]string{"X-Telo-Accepted-Terms": "v1"}
	create := func(body any) createdResp {
		resp := do(t, "POST", r.URL+"/v1/sessions", body, terms)
		if resp.Status != 201 {
			t.Fatalf("create = %d %s", resp.Status, resp.Body)
		}
		var c createdResp
		resp.json(t, &c)
		return c
	}
	run := create(runBody(manifest("once", nil, nil), nil, false))
	src := create(watchBody(map[string]string{"telo.yaml": manifest("one", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	waitStatus(t, r, src.SessionID, "running", 60*time.Second)
	for _, tc := range []struct {
		id, body string
		hdr      map[string]string
		status   int
		code     string
	}{
		{src.SessionID, `{}`, nil, 428, "terms_required"},
		{"aaaaaaaaaaaa", `{}`, terms, 404, "not_found"},
		{"not-an-id", `{}`, terms, 404, "not_found"},
		{run.SessionID, `{}`, terms, 409, "not_a_watch_session"},
		{src.SessionID, `{"apps":[]}`, terms, 400, "invalid_request"},
		// One live watch session is the ceiling: the source.
		{src.SessionID, `{}`, terms, 409, "too_many_watch_sessions"},
	} {
		resp := do(t, "POST", r.URL+"/v1/sessions/"+tc.id+"/fork", tc.body, tc.hdr)
		if resp.Status != tc.status || !strings.Contains(string(resp.Body), `"error":"`+tc.code+`"`) {
			t.Fatalf("fork %s %s = %d %s, want %d %s", tc.id, tc.body, resp.Status, resp.Body, tc.status, tc.code)
		}
	}
	var caps struct{ Features map[string]any }
	do(t, "GET", r.URL+"/v1/capabilities", nil, nil).json(t, &caps)
	if caps.Features["fork"] != true || caps.Features["checkpoints"] != true {
		t.Fatalf("capabilities features = %v, want fork and checkpoints true", caps.Features)
	}
}
