package server

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// appVars: terms, a runner registry default, and an operator catalog whose
// entry sets a secret, a port and a cache dir.
var appVars = map[string]string{
	"RUNNER_TERMS_BODY":    "Be nice.",
	"RUNNER_TERMS_VERSION": "v1",
	"TELO_REGISTRY_URL":    "https://default.example",
	"RUNNER_APPS": `{
		"helper": {"image": "op/helper:1", "pullPolicy": "always", "port": 8080,
		           "env": {"SECRET": "operator", "PORT": "8080", "TELO_CACHE_DIR": "/cache"}},
		"tool":   {"image": "op/tool:1"}
	}`,
}

// noCatalogEnv fails when the stored record of id holds a RUNNER_APPS env
// value (appVars: "operator", "/cache").
func noCatalogEnv(t *testing.T, e *testEnv, id string) {
	t.Helper()
	sessions, err := e.js.KeyValue(context.Background(), bus.BucketSessions)
	if err != nil {
		t.Fatal(err)
	}
	ent, err := sessions.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if raw := string(ent.Value()); strings.Contains(raw, `"operator"`) || strings.Contains(raw, "/cache") {
		t.Fatalf("session record holds catalog env: %s", raw)
	}
}

// TestCreateAppSessionChecks walks 4.5's order: schema, unknown app (before
// terms), terms.
func TestCreateAppSessionChecks(t *testing.T) {
	ns := testkit.StartJetStream(t)
	e := newEdge(t, ns, loadConfig(t, appVars), "cat")
	empty := newEdge(t, ns, loadConfig(t, withVars(appVars, "RUNNER_APPS", "")), "empty")
	ok := terms("v1")

	tests := []struct {
		name    string
		e       *testEnv
		app     string
		body    any
		hdr     http.Header
		status  int
		code    string
		message []string
	}{
		{name: "schema before unknown app", e: e, app: "ghost", body: body{"ports": "x"}, status: 400, code: "invalid_request"},
		{name: "body not an object", e: e, app: "helper", body: "[1]", hdr: ok, status: 400, code: "invalid_request"},
		{name: "env value an array", e: e, app: "helper", body: body{"env": body{"A": []any{}}}, hdr: ok, status: 400, code: "invalid_request"},
		{name: "bad port", e: e, app: "helper", body: body{"ports": []any{body{"port": 0, "protocol": "tcp"}}}, hdr: ok, status: 400, code: "invalid_request"},
		{name: "unknown app before terms", e: e, app: "ghost", body: body{}, status: 404, code: "unknown_app", message: []string{"ghost", "helper", "tool", "/v1/capabilities"}},
		{name: "unknown app, nothing offered", e: empty, app: "helper", body: body{}, status: 404, code: "unknown_app", message: []string{"helper", "no operator apps are offered"}},
		{name: "terms missing", e: e, app: "helper", body: body{}, status: 428, code: "terms_required"},
		{name: "terms: first value counts", e: e, app: "helper", body: body{}, hdr: terms("v2", "v1"), status: 428, code: "terms_required"},
		{name: "no body at all", e: e, app: "tool", body: nil, hdr: ok, status: 201},
		{name: "whitespace body", e: e, app: "tool", body: " \n", hdr: ok, status: 201},
		{name: "empty object", e: e, app: "tool", body: body{}, hdr: ok, status: 201},
		{name: "editor's agent launch", e: e, app: "helper", body: body{"env": body{}, "ports": []any{body{"port": 8080, "protocol": "tcp"}}}, hdr: ok, status: 201},
		{name: "unknown fields and coercion", e: e, app: "tool", body: body{"inspect": "true", "ports": body{"port": "80", "protocol": "tcp"}, "extra": 1}, hdr: ok, status: 201},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := tc.e.do(t, http.MethodPost, "/v1/apps/"+tc.app+"/sessions", tc.body, tc.hdr)
			if res.status != tc.status {
				t.Fatalf("POST /v1/apps/%s/sessions status = %d (body %s), want %d", tc.app, res.status, res.body, tc.status)
			}
			if tc.status == http.StatusCreated {
				res.created(t)
				return
			}
			code, msg := res.envelope(t)
			if code != tc.code {
				t.Errorf("error = %q (message %q), want %q", code, msg, tc.code)
			}
			for _, want := range tc.message {
				if !strings.Contains(msg, want) {
					t.Errorf("message = %q, want it to contain %q", msg, want)
				}
			}
		})
	}
}

// TestCreateAppSessionRecord checks what the driver starts for an app
// session (4.5 steps 4 and 6).
func TestCreateAppSessionRecord(t *testing.T) {
	e := newEnv(t, appVars)
	res := e.do(t, http.MethodPost, "/v1/apps/helper/sessions", body{
		"env":     body{"SECRET": "client", "MINE": "1", "TELO_CACHE_DIR": "/mine"},
		"ports":   []any{body{"port": 8080, "protocol": "tcp"}},
		"inspect": true,
	}, terms("v1"))
	id := res.created(t)
	if got, want := res.object(t)["streamUrl"], "/v1/sessions/"+id+"/events"; got != want {
		t.Errorf("streamUrl = %v, want %v", got, want)
	}
	rec := e.record(t, id)
	// The caller's variables the entry does not set; the entry's own env
	// (SECRET=operator, PORT) is the driver's to add: never on the bus.
	wantEnv := map[string]string{"MINE": "1", "TELO_REGISTRY_URL": "https://default.example"}
	if !reflect.DeepEqual(rec.Launch.Env, wantEnv) || rec.Launch.OperatorApp != "helper" {
		t.Errorf("env, operatorApp = %v, %q, want %v, helper", rec.Launch.Env, rec.Launch.OperatorApp, wantEnv)
	}
	noCatalogEnv(t, e, id)
	if want := (contract.SessionConfig{Image: "op/helper:1", PullPolicy: "always"}); rec.Launch.Config != want {
		t.Errorf("config = %+v, want %+v", rec.Launch.Config, want)
	}
	if !rec.Launch.SelfContained || rec.Launch.Inspect || rec.Launch.AgentSpec != nil {
		t.Errorf("selfContained, inspect, agentSpec = %v, %v, %+v, want true, false, nil", rec.Launch.SelfContained, rec.Launch.Inspect, rec.Launch.AgentSpec)
	}
	wantApps := []session.App{{Name: "app", IO: "tty", Ports: []contract.PortMapping{{Port: 8080, Protocol: "tcp"}}, Trigger: "initial"}}
	if rec.Mode != "run" || !reflect.DeepEqual(rec.Apps, wantApps) {
		t.Errorf("mode, apps = %q, %+v, want run, %+v", rec.Mode, rec.Apps, wantApps)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := e.store.GetBundle(ctx, id)
	if err != nil {
		t.Fatalf("GetBundle(%s) error = %v", id, err)
	}
	if b.EntryRelativePath != "telo.yaml" || len(b.Files) != 0 {
		t.Errorf("bundle = %+v, want the empty bundle at telo.yaml", b)
	}

	// No body: no client env, no ports.
	id = e.do(t, http.MethodPost, "/v1/apps/tool/sessions", nil, terms("v1")).created(t)
	rec = e.record(t, id)
	if want := map[string]string{"TELO_REGISTRY_URL": "https://default.example"}; !reflect.DeepEqual(rec.Launch.Env, want) {
		t.Errorf("env without body = %v, want %v", rec.Launch.Env, want)
	}
	if want := (contract.SessionConfig{Image: "op/tool:1", PullPolicy: "missing"}); rec.Launch.Config != want {
		t.Errorf("config without pullPolicy = %+v, want %+v", rec.Launch.Config, want)
	}
	if len(rec.Apps) != 1 || rec.Apps[0].Ports == nil || len(rec.Apps[0].Ports) != 0 {
		t.Errorf("apps without body = %+v, want one app with no ports", rec.Apps)
	}
}

func TestCreateAppSessionCapacity(t *testing.T) {
	e := newEnv(t, withVars(appVars, "RUNNER_MAX_SESSIONS", "1"))
	e.do(t, http.MethodPost, "/v1/apps/tool/sessions", nil, terms("v1")).created(t)
	res := e.do(t, http.MethodPost, "/v1/apps/tool/sessions", nil, terms("v1"))
	if res.status != http.StatusConflict {
		t.Fatalf("status = %d (body %s), want 409", res.status, res.body)
	}
	if code, _ := res.envelope(t); code != "too_many_sessions" {
		t.Errorf("error = %q, want too_many_sessions", code)
	}
}

// A watch session's agent is recorded by name: its catalog env stays in
// RUNNER_APPS (the driver's), off the bus (issue 11 item 3).
func TestAgentEnvNotStored(t *testing.T) {
	e := newEnv(t, withVars(appVars, "RUNNER_WATCH_SESSIONS", "true"))
	id := e.do(t, http.MethodPost, "/v1/sessions", validCreate(set("mode", "watch"), set("agent", "helper")), terms("v1")).created(t)
	rec := e.record(t, id)
	if a := rec.Launch.AgentSpec; a == nil || a.Name != "helper" || a.Image != "op/helper:1" || a.Port != 8080 {
		t.Fatalf("agentSpec = %+v, want helper op/helper:1 on 8080", a)
	}
	noCatalogEnv(t, e, id)
}
