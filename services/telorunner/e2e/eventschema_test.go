package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// Every event type docs/asyncapi.yaml describes, and every status kind,
// run phase and reachability state these sessions go through, appear on
// the bus, and each message the runner stored matches the document (the
// busWatch of this runner fails the test otherwise): a run session that
// exits with inspect on (progress, debug, reachability, run, io), one that
// fails at its time limit, a watch session whose edit adds a port
// (endpoints, a watch reload) and breaks the manifest (run failed), then
// suspends when idle, resumes and is deleted.
func TestEventSchema(t *testing.T) {
	r := watchRunner(t, merge(fastSupervisor, map[string]string{"RUNNER_MAX_TTL_SECONDS": "4"}))
	w := r.bus
	if w == nil {
		t.Fatal("the runner has no schema watch")
	}

	exitPort := freePort(t)
	exits := r.create(t, runBody(manifest("schema-exit", []int{exitPort}, map[string]any{"exitAfterMs": 500, "exitCode": 3}), []int{exitPort}, true))
	lives := r.create(t, runBody(manifest("schema-ttl", nil, nil), nil, false))

	p1, p2 := freePort(t), freePort(t)
	c := r.create(t, watchBody(map[string]string{"web/telo.yaml": manifest("web", []int{p1}, nil)}, []app{{Name: "web", Entry: "web/telo.yaml", Ports: []int{p1}}}, ""))
	// An open event stream keeps the session awake while it is edited
	// (idle suspend is 5 s here); closing it lets it suspend.
	awake := openSSE(t, r.URL+c.StreamURL, nil)
	waitStatus(t, r, c.SessionID, "running", 60*time.Second)
	waitSaw := func(key string, n int) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, func() bool { return w.saw(key) >= n }, "no %d× %s on the bus", n, key)
	}
	waitSaw("run:started", 1)
	if resp := writeFiles(t, r, c.SessionID, map[string]string{"web/telo.yaml": manifest("web", []int{p1, p2}, nil)}); resp.Status != http.StatusOK {
		t.Fatalf("POST workspace = %d %s", resp.Status, resp.Body)
	}
	waitSaw("endpoints", 1)
	if resp := writeFiles(t, r, c.SessionID, map[string]string{"web/telo.yaml": "kind: Nope\n"}); resp.Status != http.StatusOK {
		t.Fatalf("POST workspace = %d %s", resp.Status, resp.Body)
	}
	waitSaw("run:failed", 1)
	if resp := writeFiles(t, r, c.SessionID, map[string]string{"web/telo.yaml": manifest("web", []int{p1}, nil)}); resp.Status != http.StatusOK {
		t.Fatalf("POST workspace = %d %s", resp.Status, resp.Body)
	}
	awake.Close()
	waitStatus(t, r, c.SessionID, "suspended", 60*time.Second)
	if resp := do(t, "POST", r.URL+"/v1/sessions/"+c.SessionID+"/resume", nil, nil); resp.Status != http.StatusAccepted {
		t.Fatalf("resume = %d %s", resp.Status, resp.Body)
	}
	waitStatus(t, r, c.SessionID, "running", 60*time.Second)
	if resp := do(t, "DELETE", r.URL+"/v1/sessions/"+c.SessionID, nil, nil); resp.Status != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", resp.Status, resp.Body)
	}
	waitStatus(t, r, c.SessionID, "stopped", 30*time.Second)
	waitStatus(t, r, exits.SessionID, "exited", 60*time.Second)
	waitStatus(t, r, lives.SessionID, "failed", 60*time.Second)
	w.settle(5 * time.Second)

	keys, chunks := w.seen()
	have := map[string]bool{}
	for _, k := range keys {
		have[k] = true
	}
	var want []string
	for typ := range w.s.events {
		want = append(want, typ) // every type the document describes
	}
	want = append(want, "status:starting", "status:running", "status:exited", "status:failed", "status:suspended", "status:stopped",
		"run:started", "run:completed", "run:failed", "reachability:reachable")
	sort.Strings(want)
	var missing []string
	for _, k := range want {
		if !have[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("not seen on the bus: %s (saw %s)", strings.Join(missing, ", "), strings.Join(keys, ", "))
	}
	if chunks == 0 {
		t.Error("no io chunk seen on the bus")
	}
	t.Logf("read from the bus: %s; %d io chunks", strings.Join(keys, ", "), chunks)
}

// The validator refuses what the document does not describe: an unknown
// event type, a documented field of the wrong type, a missing or
// malformed header, Runner-Terminal on a status that is not terminal (and
// missing on one that is), an undocumented field, an io chunk with an
// unknown tag or no output. The document's own examples pass.
func TestSchemaRefuses(t *testing.T) {
	s := loadSchemas(t)
	msg := func(subject, typ, seq, terminal, data string) *nats.Msg {
		h := nats.Header{}
		if typ != "" {
			h.Set(bus.HeaderType, typ)
		}
		if seq != "" {
			h.Set(bus.HeaderSeq, seq)
		}
		if terminal != "" {
			h.Set(bus.HeaderTerminal, terminal)
		}
		return &nats.Msg{Subject: subject, Header: h, Data: []byte(data)}
	}
	const evt = "runner.evt.aaaaaaaaaaaa"
	good := []*nats.Msg{
		msg(evt, "status", "1", "", `{"type":"status","status":{"kind":"starting"}}`),
		msg(evt, "status", "2", "", `{"type":"status","status":{"kind":"running","endpoints":[{"host":"","port":3000,"protocol":"tcp"}]}}`),
		msg(evt, "status", "3", "1", `{"type":"status","status":{"kind":"exited","code":0}}`),
		msg(evt, "status", "4", "1", `{"type":"status","status":{"kind":"failed","message":"start: x"}}`),
		msg(evt, "progress", "5", "", `{"type":"progress","phase":"boot","message":"Starting workspace"}`),
		msg(evt, "progress", "5", "", `{"type":"progress","phase":"build","message":"Image built","done":true,"app":"app"}`),
		msg(evt, "debug", "6", "", `{"type":"debug","app":"web","frame":{"kind":"event","timestamp":"t","event":"Kernel.Started","payload":{}}}`),
		msg(evt, "reachability", "7", "", `{"type":"reachability","app":"web","port":3000,"state":"reachable"}`),
		msg(evt, "run", "8", "", `{"type":"run","app":"web","generation":3,"phase":"started","trigger":"watch"}`),
		msg(evt, "run", "9", "", `{"type":"run","app":"web","generation":3,"phase":"completed","code":0,"durationMs":412}`),
		msg(evt, "run", "10", "", `{"type":"run","app":"worker","generation":4,"phase":"failed","reason":"ERR_MANIFEST_VALIDATION_FAILED"}`),
		msg(evt, "endpoints", "11", "", `{"type":"endpoints","app":"web","rejected":[{"port":3000,"reason":"taken"}]}`),
	}
	for _, m := range good {
		if _, _, err := s.checkEvent(m); err != nil {
			t.Errorf("refused a valid event: %v", err)
		}
	}
	bad := map[string]*nats.Msg{
		"unknown type":                  msg(evt, "stdout", "1", "", `{"type":"stdout","data":"x"}`),
		"no Runner-Type":                msg(evt, "", "1", "", `{"type":"status","status":{"kind":"starting"}}`),
		"port a string":                 msg(evt, "reachability", "1", "", `{"type":"reachability","app":"web","port":"3000","state":"reachable"}`),
		"generation a string":           msg(evt, "run", "1", "", `{"type":"run","app":"web","generation":"3","phase":"started","trigger":"watch"}`),
		"unknown trigger":               msg(evt, "run", "1", "", `{"type":"run","app":"web","generation":3,"phase":"started","trigger":"cron"}`),
		"exited without code":           msg(evt, "status", "1", "1", `{"type":"status","status":{"kind":"exited"}}`),
		"undocumented field":            msg(evt, "progress", "1", "", `{"type":"progress","phase":"boot","message":"m","extra":1}`),
		"no Runner-Seq":                 msg(evt, "progress", "", "", `{"type":"progress","phase":"boot","message":"m"}`),
		"Runner-Seq 0":                  msg(evt, "progress", "0", "", `{"type":"progress","phase":"boot","message":"m"}`),
		"Runner-Terminal on running":    msg(evt, "status", "1", "1", `{"type":"status","status":{"kind":"running","endpoints":[]}}`),
		"no Runner-Terminal on stopped": msg(evt, "status", "1", "", `{"type":"status","status":{"kind":"stopped"}}`),
		"Runner-Terminal on progress":   msg(evt, "progress", "1", "1", `{"type":"progress","phase":"boot","message":"m"}`),
		"type differs from header":      msg(evt, "progress", "1", "", `{"type":"run","phase":"boot","message":"m"}`),
		"not JSON":                      msg(evt, "progress", "1", "", `progress`),
	}
	for name, m := range bad {
		if _, _, err := s.checkEvent(m); err == nil {
			t.Errorf("%s: accepted %v %s", name, m.Header, m.Data)
		}
	}
	const io = "runner.io.aaaaaaaaaaaa.web"
	if err := s.checkChunk(msg(io, "", "1", "", "\x01hello")); err != nil {
		t.Errorf("refused a valid chunk: %v", err)
	}
	for name, m := range map[string]*nats.Msg{
		"tag 3":        msg(io, "", "1", "", "\x03hello"),
		"no output":    msg(io, "", "1", "", "\x00"),
		"too long":     msg(io, "", "1", "", "\x00"+strings.Repeat("x", 65537)),
		"no seq":       msg(io, "", "", "", "\x00x"),
		"Runner-Type":  msg(io, "status", "1", "", "\x00x"),
		"empty":        msg(io, "", "1", "", ""),
		"seq not a nr": msg(io, "", "x1", "", "\x00x"),
	} {
		if err := s.checkChunk(m); err == nil {
			t.Errorf("%s: accepted chunk %v %q", name, m.Header, fmt.Sprintf("%.10s", m.Data))
		}
	}
}

// The subscriber permissions the document publishes are the role's
// (pkg/bus Permissions, which the all-in-one and the chart enforce).
func TestSchemaSubscriberPermissions(t *testing.T) {
	s := loadSchemas(t)
	p, err := bus.Permissions(bus.RoleSubscriber)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(p)
	got, _ := json.Marshal(lookup(s.doc, "/components/securitySchemes/subscriber/x-nats-permissions"))
	var w, g any
	_ = json.Unmarshal(want, &w)
	_ = json.Unmarshal(got, &g)
	if !reflect.DeepEqual(w, g) {
		t.Fatalf("docs/asyncapi.yaml x-nats-permissions = %s, want the subscriber role's %s", got, want)
	}
}
