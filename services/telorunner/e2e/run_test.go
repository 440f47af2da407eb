package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The editor's whole run-session path: create → progress → running with
// endpoints → reachable → banner and stdin echo on io → exit code →
// terminal SSE close and io close 1000.
func TestRunSessionLifecycle(t *testing.T) {
	r := startRunner(t, nil)
	port := freePort(t)
	man := manifest("hello", []int{port}, map[string]any{"exitAfterMs": 6000, "exitCode": 3})
	c := r.create(t, runBody(man, []int{port}, false))
	if c.StreamURL != "/v1/sessions/"+c.SessionID+"/events" || len(c.SessionID) != 12 {
		t.Fatalf("created = %+v", c)
	}
	sse := openSSE(t, r.URL+c.StreamURL, map[string]string{"Origin": "http://localhost:5173"})
	if got := sse.Header.Get("Content-Type"); got != "text/event-stream" {
		t.Errorf("content-type = %q", got)
	}
	// The all-in-one allows loopback origins by default (6.2: echoed, with Vary).
	if got := sse.Header.Get("Access-Control-Allow-Origin"); got != "http://localhost:5173" {
		t.Errorf("access-control-allow-origin = %q, want http://localhost:5173", got)
	}
	if got := sse.Header.Get("Vary"); got != "Origin" {
		t.Errorf("vary = %q, want Origin", got)
	}
	seen := sse.until(t, 30*time.Second, isStatus("running"))
	running := decode(t, seen[len(seen)-1].Data)
	eps := running["status"].(map[string]any)["endpoints"].([]any)
	if len(eps) != 1 || eps[0].(map[string]any)["port"].(float64) != float64(port) || eps[0].(map[string]any)["host"] != "" {
		t.Fatalf("running endpoints = %v, want one for port %d with host \"\"", eps, port)
	}
	if seen[0].Event != "progress" {
		t.Errorf("first event = %s, want progress", seen[0].Event)
	}
	for i, e := range seen {
		if e.ID != strconv.Itoa(i+1) {
			t.Fatalf("event %d id = %s, want %d (ids contiguous from 1)", i, e.ID, i+1)
		}
	}
	sse.until(t, 20*time.Second, func(e sseEvent) bool {
		return e.Event == "reachability" && strings.Contains(e.Data, `"state":"reachable"`) && strings.Contains(e.Data, fmt.Sprintf(`"port":%d`, port))
	})
	// The port answers.
	resp := do(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil, nil)
	if !strings.Contains(string(resp.Body), "devkernel hello generation 1") {
		t.Errorf("port answered %q", resp.Body)
	}

	io := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?lastSeq=0", nil)
	first := io.next(t, 10*time.Second, "the seq control frame")
	if first.Text != `{"app":"app","io":"tty","seq":0,"type":"seq"}` && !strings.Contains(first.Text, `"type":"seq"`) {
		t.Fatalf("first io frame = %+v, want seq control frame", first)
	}
	ctl := decode(t, first.Text)
	if ctl["seq"].(float64) != 0 || ctl["app"] != "app" || ctl["io"] != "tty" {
		t.Fatalf("seq frame = %v", ctl)
	}
	frames, text := io.readUntil(t, 20*time.Second, "tty=true")
	if !strings.Contains(text, "devkernel hello generation 1") {
		t.Fatalf("banner = %q", text)
	}
	for _, f := range frames {
		if f.Text == "" && f.Tag != 0 {
			t.Fatalf("tty app frame tag = %d, want 0", f.Tag)
		}
	}
	if err := io.WriteMessage(2, []byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	io.readUntil(t, 20*time.Second, "echo: ping")

	rest := sse.drain(t, 30*time.Second)
	last := rest[len(rest)-1]
	if last.Event != "status" || !strings.Contains(last.Data, `"kind":"exited"`) || !strings.Contains(last.Data, `"code":3`) {
		t.Fatalf("last event = %+v, want status exited code 3", last)
	}
	code, reason, _ := io.closeCode(t, 10*time.Second)
	if code != 1000 || reason != "session terminal" {
		t.Fatalf("io close = %d %q, want 1000 session terminal", code, reason)
	}
	var doc map[string]any
	do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID, nil, nil).json(t, &doc)
	if doc["status"].(map[string]any)["kind"] != "exited" || doc["exitedAt"] == nil || doc["mode"] != "run" {
		t.Fatalf("session doc = %v", doc)
	}
	// A terminal session with nothing newer than lastSeq closes 4410.
	io2 := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?lastSeq=999999", nil)
	if code, reason, _ := io2.closeCode(t, 10*time.Second); code != 4410 || reason != "session terminal, nothing to replay" {
		t.Fatalf("io close = %d %q, want 4410", code, reason)
	}
}

// DELETE stops a session held open by --inspect; run events come from the
// debug stream.
func TestDeleteStopsInspectedSession(t *testing.T) {
	r := startRunner(t, nil)
	c := r.create(t, runBody(manifest("held", nil, nil), nil, true))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	// Every event of the session is kept: devkernel sends its log frames
	// (the banner's stdout and stderr lines) before Kernel.Started, so a
	// check of only the later events could not see a relayed one.
	all := sse.until(t, 30*time.Second, func(e sseEvent) bool {
		return e.Event == "run" && strings.Contains(e.Data, `"phase":"started"`) && strings.Contains(e.Data, `"trigger":"initial"`)
	})
	all = append(all, sse.until(t, 20*time.Second, func(e sseEvent) bool {
		return e.Event == "debug" && strings.Contains(e.Data, `"Kernel.Started"`)
	})...)
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil); resp.Status != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", resp.Status, resp.Body)
	}
	rest := sse.drain(t, 30*time.Second)
	if last := rest[len(rest)-1]; !isStatus("stopped")(last) {
		t.Fatalf("last event = %+v, want stopped", last)
	}
	all = append(all, rest...)
	if all[0].ID != "1" {
		t.Fatalf("first event id = %s, want 1 (the check must see the whole session)", all[0].ID)
	}
	// The kernel wrote its banner (the lines its log frames carry) and the
	// frames around it were relayed: Kernel.Starting precedes the banner's
	// log frames on the kernel's stream, Kernel.Started follows them.
	debug := map[string]bool{}
	for _, e := range all {
		if e.Event != "debug" {
			continue
		}
		if strings.Contains(e.Data, `"kind":"log"`) {
			t.Fatalf("log frame relayed as debug: %s", e.Data)
		}
		for _, name := range []string{"Kernel.Starting", "Kernel.PortsResolved", "Kernel.Started"} {
			if strings.Contains(e.Data, `"`+name+`"`) {
				debug[name] = true
			}
		}
	}
	if len(debug) != 3 {
		t.Fatalf("debug events seen = %v, want Kernel.Starting, Kernel.PortsResolved and Kernel.Started around the banner's log frames: %s", debug, summarize(all))
	}
	// Idempotent: again 204, and unknown ids too.
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil); resp.Status != 204 {
		t.Fatalf("second DELETE = %d", resp.Status)
	}
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/aaaaaaaaaaaa", nil, nil); resp.Status != 204 {
		t.Fatalf("DELETE unknown = %d", resp.Status)
	}
}

// SSE resume: Last-Event-ID (winning over ?lastEventId) delivers exactly
// the missing events.
func TestSSEResume(t *testing.T) {
	r := startRunner(t, nil)
	c := r.create(t, runBody(manifest("resume", nil, map[string]any{"exitAfterMs": 300}), nil, false))
	all := openSSE(t, r.URL+c.StreamURL, nil).drain(t, 30*time.Second)
	if len(all) < 3 {
		t.Fatalf("too few events: %s", summarize(all))
	}
	for _, k := range []int{0, 1, len(all) - 2} {
		s := openSSE(t, r.URL+c.StreamURL+"?lastEventId=1", map[string]string{"Last-Event-ID": strconv.Itoa(k)})
		got := s.drain(t, 10*time.Second)
		want := all[k:]
		if summarize(got) != summarize(want) {
			t.Fatalf("resume after %d = %s, want %s", k, summarize(got), summarize(want))
		}
	}
	// ?lastEventId alone works too; garbage header falls back to it.
	got := openSSE(t, r.URL+c.StreamURL+"?lastEventId=2", map[string]string{"Last-Event-ID": "x"}).drain(t, 10*time.Second)
	if summarize(got) != summarize(all[2:]) {
		t.Fatalf("query resume = %s, want %s", summarize(got), summarize(all[2:]))
	}
	// Unknown session: 404 JSON.
	resp := do(t, "GET", r.URL+"/v1/sessions/aaaaaaaaaaaa/events", nil, nil)
	if resp.Status != 404 || !strings.Contains(string(resp.Body), `"error":"not_found"`) {
		t.Fatalf("unknown events = %d %s", resp.Status, resp.Body)
	}
}

// io resume with lastSeq delivers exactly the missing bytes.
func TestIOResume(t *testing.T) {
	r := startRunner(t, nil)
	const n = 300000
	c := r.create(t, runBody(manifest("bytes", nil, map[string]any{"outputBytes": n, "exitAfterMs": 200}), nil, false))
	openSSE(t, r.URL+c.StreamURL, nil).drain(t, 30*time.Second)
	io := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io", nil)
	code, _, frames := io.closeCode(t, 20*time.Second)
	if code != 1000 {
		t.Fatalf("close = %d, want 1000", code)
	}
	var data []ioFrame
	total := 0
	for _, f := range frames {
		if f.Text != "" {
			continue
		}
		if len(f.Payload) > 65536 {
			t.Fatalf("frame of %d bytes exceeds 64 KiB", len(f.Payload))
		}
		if len(data) > 0 && f.Seq != data[len(data)-1].Seq+1 {
			t.Fatalf("seq %d after %d", f.Seq, data[len(data)-1].Seq)
		}
		data = append(data, f)
		total += len(f.Payload)
	}
	if total < n || data[0].Seq != 1 {
		t.Fatalf("got %d bytes from seq %d, want >= %d from 1", total, data[0].Seq, n)
	}
	for _, k := range []int{1, len(data) / 2, len(data) - 1} {
		io2 := openIO(t, fmt.Sprintf("%s/v1/sessions/%s/io?lastSeq=%d", wsURL(r.URL), c.SessionID, k), nil)
		_, _, got := io2.closeCode(t, 20*time.Second)
		if got[0].Text == "" || !strings.Contains(got[0].Text, fmt.Sprintf(`"seq":%d`, k)) {
			t.Fatalf("first frame = %+v, want seq %d", got[0], k)
		}
		var bin []ioFrame
		for _, f := range got {
			if f.Text == "" {
				bin = append(bin, f)
			}
		}
		want := data[k:]
		if len(bin) != len(want) {
			t.Fatalf("resume after %d: %d frames, want %d", k, len(bin), len(want))
		}
		for i := range want {
			if bin[i].Seq != want[i].Seq || bin[i].Tag != want[i].Tag || !bytes.Equal(bin[i].Payload, want[i].Payload) {
				t.Fatalf("resume after %d: frame %d = seq %d tag %d %d bytes, want seq %d tag %d %d bytes (same payload)", k, i, bin[i].Seq, bin[i].Tag, len(bin[i].Payload), want[i].Seq, want[i].Tag, len(want[i].Payload))
			}
		}
	}
}

func TestCreateRefusals(t *testing.T) {
	r := startRunner(t, map[string]string{"RUNNER_TERMS_BODY": "Be nice.", "RUNNER_MAX_SESSIONS": "1"})
	body := runBody(manifest("x", nil, nil), nil, true)
	resp := do(t, "POST", r.URL+"/v1/sessions", body, nil)
	if resp.Status != 428 || !strings.Contains(string(resp.Body), `"error":"terms_required"`) || !strings.Contains(string(resp.Body), `"body":"Be nice."`) {
		t.Fatalf("no terms header = %d %s, want 428 with terms", resp.Status, resp.Body)
	}
	var caps struct {
		Terms struct{ Version string } `json:"terms"`
	}
	do(t, "GET", r.URL+"/v1/capabilities", nil, nil).json(t, &caps)
	hdr := map[string]string{"x-telo-accepted-terms": caps.Terms.Version}
	if resp := do(t, "POST", r.URL+"/v1/sessions", body, map[string]string{"x-telo-accepted-terms": "nope"}); resp.Status != 428 {
		t.Fatalf("wrong version = %d", resp.Status)
	}
	bad := runBody(manifest("x", nil, nil), nil, true)
	bad["bundle"].(map[string]any)["files"] = []map[string]any{{"relativePath": "../../etc/passwd", "contents": "x"}}
	resp = do(t, "POST", r.URL+"/v1/sessions", bad, hdr)
	if resp.Status != 400 || !strings.Contains(string(resp.Body), `"error":"invalid_bundle"`) || !strings.Contains(string(resp.Body), "../../etc/passwd") {
		t.Fatalf("traversal = %d %s, want 400 invalid_bundle naming the path", resp.Status, resp.Body)
	}
	resp = do(t, "POST", r.URL+"/v1/sessions", `{"env":{}}`, hdr)
	if resp.Status != 400 || !strings.Contains(string(resp.Body), "bundle") {
		t.Fatalf("schema = %d %s", resp.Status, resp.Body)
	}
	first := do(t, "POST", r.URL+"/v1/sessions", body, hdr)
	if first.Status != 201 {
		t.Fatalf("first = %d %s", first.Status, first.Body)
	}
	resp = do(t, "POST", r.URL+"/v1/sessions", body, hdr)
	if resp.Status != 409 || !strings.Contains(string(resp.Body), `"error":"too_many_sessions"`) {
		t.Fatalf("second = %d %s, want 409 too_many_sessions", resp.Status, resp.Body)
	}
	// Once the live one ends it is reclaimable: the next create evicts it.
	var c createdResp
	first.json(t, &c)
	do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil)
	openSSE(t, r.URL+c.StreamURL, nil).drain(t, 30*time.Second)
	if resp := do(t, "POST", r.URL+"/v1/sessions", body, hdr); resp.Status != 201 {
		t.Fatalf("after stop = %d %s, want 201", resp.Status, resp.Body)
	}
	if resp := do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID, nil, nil); resp.Status != 404 {
		t.Fatalf("evicted session GET = %d, want 404", resp.Status)
	}
}

// Issue 14's manifest, as Telo writes it: the port comes from the variable
// its ports: entry names (the session env supplies a free one over the
// default), the session is reachable on it and then ends exited with the
// kernel's code, with and without inspect (the editor always sends it).
func TestTeloManifestRunSessionExits(t *testing.T) {
	r := startRunner(t, nil)
	const man = "kind: Telo.Application\n" +
		"metadata: { name: hello, version: 1.0.0 }\n" +
		"ports:\n" +
		"  http: { env: PORT_HELLO, default: 39123 }\n" +
		"x-devkernel: { exitAfterMs: 300, exitCode: 3 }\n"
	for _, inspect := range []bool{false, true} {
		t.Run(fmt.Sprintf("inspect=%t", inspect), func(t *testing.T) {
			port := freePort(t)
			body := runBody(man, []int{port}, inspect)
			body["env"] = map[string]any{"PORT_HELLO": strconv.Itoa(port)}
			c := r.create(t, body)
			sse := openSSE(t, r.URL+c.StreamURL, nil)
			events := sse.drain(t, 60*time.Second)
			reachable, exited := -1, -1
			for i, e := range events {
				switch {
				case e.Event == "reachability" && strings.Contains(e.Data, `"state":"reachable"`) && strings.Contains(e.Data, fmt.Sprintf(`"port":%d`, port)):
					reachable = i
				case isStatus("exited")(e):
					exited = i
					if !strings.Contains(e.Data, `"code":3`) {
						t.Errorf("exited = %s, want code 3", e.Data)
					}
				}
			}
			if reachable < 0 || exited < 0 || reachable > exited {
				t.Fatalf("events = %v, want reachability reachable on port %d, then status exited code 3", events, port)
			}
			if last := events[len(events)-1]; !isStatus("exited")(last) {
				t.Errorf("last event = %+v, want the exited status", last)
			}
			if inspect {
				var outcome string
				for _, e := range events {
					if e.Event == "run" && !strings.Contains(e.Data, `"phase":"started"`) {
						outcome = e.Data
					}
				}
				if !strings.Contains(outcome, `"phase":"completed"`) || !strings.Contains(outcome, `"code":3`) {
					t.Errorf("run outcome = %s, want completed code 3", outcome)
				}
			}
		})
	}
}
