package server

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/api-edge/internal/config"
)

// mainVars configure the runner most creation tests run against: terms,
// watch sessions, and a catalog with one agent-capable entry ("helper",
// port 8080) and one without a port ("tool").
var mainVars = map[string]string{
	"RUNNER_TERMS_BODY":         "Be nice.",
	"RUNNER_TERMS_VERSION":      "v1",
	"RUNNER_WATCH_SESSIONS":     "true",
	"RUNNER_WATCH_MAX_SESSIONS": "100",
	"RUNNER_MAX_SESSIONS":       "100",
	"RUNNER_APPS":               `{"helper":{"image":"op/helper:1","env":{"K":"v"},"port":8080,"title":"Helper"},"tool":{"image":"op/tool:1"}}`,
}

func withVars(base map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(base)+len(kv)/2)
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

type createCase struct {
	name    string
	e       *testEnv
	body    any
	hdr     http.Header
	status  int
	code    string   // error code ("" on 201)
	message []string // substrings the error message must contain
}

func runCreateCases(t *testing.T, cases []createCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.e.admitted(t)
			res := tc.e.do(t, http.MethodPost, "/v1/sessions", tc.body, tc.hdr)
			if res.status != tc.status {
				t.Fatalf("POST /v1/sessions status = %d (body %s), want %d", res.status, res.body, tc.status)
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
			if after := tc.e.admitted(t); after != before {
				t.Errorf("admitted sessions went from %d to %d on a rejected request", before, after)
			}
		})
	}
}

// TestCreateValidation walks 4.4.2: each case passes every step before the
// one it fails at.
func TestCreateValidation(t *testing.T) {
	ns := testkit.StartJetStream(t)
	m := newEdge(t, ns, loadConfig(t, mainVars), "main")
	noWatch := newEdge(t, ns, loadConfig(t, withVars(mainVars, "RUNNER_WATCH_SESSIONS", "false")), "nowatch")
	ok := terms("v1")

	long := strings.Repeat("a", 64)
	cases := []createCase{
		// 1. Schema.
		{name: "body not JSON", e: m, body: "{", hdr: ok, status: 400, code: "invalid_request"},
		{name: "body not an object", e: m, body: "[]", hdr: ok, status: 400, code: "invalid_request"},
		{name: "body with trailing data", e: m, body: mustJSON(t, validCreate()) + "{}", hdr: ok, status: 400, code: "invalid_request"},
		{name: "missing bundle", e: m, body: validCreate(del("bundle")), hdr: ok, status: 400, code: "invalid_request", message: []string{"bundle"}},
		{name: "missing env", e: m, body: validCreate(del("env")), hdr: ok, status: 400, code: "invalid_request", message: []string{"env"}},
		{name: "missing config", e: m, body: validCreate(del("config")), hdr: ok, status: 400, code: "invalid_request", message: []string{"config"}},
		{name: "missing config.image", e: m, body: validCreate(del("config/image")), hdr: ok, status: 400, code: "invalid_request", message: []string{"image"}},
		{name: "missing config.pullPolicy", e: m, body: validCreate(del("config/pullPolicy")), hdr: ok, status: 400, code: "invalid_request", message: []string{"pullPolicy"}},
		{name: "bad pullPolicy", e: m, body: validCreate(set("config/pullPolicy", "sometimes")), hdr: ok, status: 400, code: "invalid_request", message: []string{"pullPolicy"}},
		{name: "missing entryRelativePath", e: m, body: validCreate(del("bundle/entryRelativePath")), hdr: ok, status: 400, code: "invalid_request", message: []string{"entryRelativePath"}},
		{name: "empty entryRelativePath is a schema error", e: m, body: validCreate(set("bundle/entryRelativePath", "")), hdr: ok, status: 400, code: "invalid_request"},
		{name: "empty file relativePath is a schema error", e: m, body: validCreate(set("bundle/files/1/relativePath", "")), hdr: ok, status: 400, code: "invalid_request"},
		{name: "missing files", e: m, body: validCreate(del("bundle/files")), hdr: ok, status: 400, code: "invalid_request", message: []string{"files"}},
		{name: "file contents missing", e: m, body: validCreate(del("bundle/files/0/contents")), hdr: ok, status: 400, code: "invalid_request", message: []string{"contents"}},
		{name: "bundle is a string", e: m, body: validCreate(set("bundle", "x")), hdr: ok, status: 400, code: "invalid_request"},
		{name: "env is an array", e: m, body: validCreate(set("env", []any{"A=1"})), hdr: ok, status: 400, code: "invalid_request"},
		{name: "env value is an object", e: m, body: validCreate(set("env", body{"A": body{}})), hdr: ok, status: 400, code: "invalid_request"},
		{name: "config is a number", e: m, body: validCreate(set("config", 1)), hdr: ok, status: 400, code: "invalid_request"},
		{name: "inspect not boolean", e: m, body: validCreate(set("inspect", "maybe")), hdr: ok, status: 400, code: "invalid_request", message: []string{"inspect"}},
		{name: "mode not an enum value", e: m, body: validCreate(set("mode", "fast")), hdr: ok, status: 400, code: "invalid_request", message: []string{"mode"}},
		{name: "empty agent", e: m, body: validCreate(set("mode", "watch"), set("agent", "")), hdr: ok, status: 400, code: "invalid_request", message: []string{"agent"}},
		{name: "port 0", e: m, body: validCreate(set("ports", []any{body{"port": 0, "protocol": "tcp"}})), hdr: ok, status: 400, code: "invalid_request"},
		{name: "port 65536", e: m, body: validCreate(set("ports", []any{body{"port": 65536, "protocol": "tcp"}})), hdr: ok, status: 400, code: "invalid_request"},
		{name: "port fraction", e: m, body: validCreate(set("ports", []any{body{"port": 80.5, "protocol": "tcp"}})), hdr: ok, status: 400, code: "invalid_request"},
		{name: "port not numeric", e: m, body: validCreate(set("ports", []any{body{"port": "http", "protocol": "tcp"}})), hdr: ok, status: 400, code: "invalid_request"},
		{name: "protocol sctp", e: m, body: validCreate(set("ports", []any{body{"port": 80, "protocol": "sctp"}})), hdr: ok, status: 400, code: "invalid_request"},
		{name: "apps empty", e: m, body: validCreate(set("mode", "watch"), set("apps", []any{})), hdr: ok, status: 400, code: "invalid_request", message: []string{"apps"}},
		{name: "app without name", e: m, body: validCreate(watchApps(body{"entryRelativePath": "telo.yaml"})), hdr: ok, status: 400, code: "invalid_request", message: []string{"name"}},
		{name: "app name empty is a schema error", e: m, body: validCreate(watchApps(app(""))), hdr: ok, status: 400, code: "invalid_request"},
		{name: "app name over 63 is a schema error", e: m, body: validCreate(watchApps(app(long))), hdr: ok, status: 400, code: "invalid_request"},
		{name: "app without entry", e: m, body: validCreate(watchApps(body{"name": "web"})), hdr: ok, status: 400, code: "invalid_request", message: []string{"entryRelativePath"}},
		{name: "app io not an enum value", e: m, body: validCreate(watchApps(body{"name": "web", "entryRelativePath": "telo.yaml", "io": "pty"})), hdr: ok, status: 400, code: "invalid_request"},

		// 1. Lenient coercion and unknown fields pass.
		{name: "inspect as string", e: m, body: validCreate(set("inspect", "true")), hdr: ok, status: 201},
		{name: "inspect as 0", e: m, body: validCreate(set("inspect", 0)), hdr: ok, status: 201},
		{name: "port as string", e: m, body: validCreate(set("ports", []any{body{"port": "8080", "protocol": "tcp"}})), hdr: ok, status: 201},
		{name: "single port object", e: m, body: validCreate(set("ports", body{"port": 3000, "protocol": "udp"})), hdr: ok, status: 201},
		{name: "single file object", e: m, body: validCreate(set("bundle/files", body{"relativePath": "telo.yaml", "contents": ""})), hdr: ok, status: 201},
		{name: "env numbers and booleans", e: m, body: validCreate(set("env", body{"N": 5, "B": true})), hdr: ok, status: 201},
		{name: "null optionals", e: m, body: validCreate(set("ports", nil), set("mode", nil), set("agent", nil), set("apps", nil), set("inspect", nil)), hdr: ok, status: 201},
		{name: "unknown fields everywhere", e: m, body: validCreate(
			set("extra", body{"x": []any{1}}), set("bundle/extra", true), set("bundle/files/0/extra", 1),
			set("config/registryUrl", "https://r.example"), set("config/baseUrl", "http://x"),
		), hdr: ok, status: 201},
		{name: "base64 file", e: m, body: validCreate(set("bundle/files/1/encoding", "base64")), hdr: ok, status: 201},
		{name: "file encoding outside the enum passes through (3.5)", e: m, body: validCreate(set("bundle/files/1/encoding", "hex")), hdr: ok, status: 201},
		{name: "file encoding of another type passes through (3.5)", e: m, body: validCreate(set("bundle/files/1/encoding", 5)), hdr: ok, status: 201},

		// 2. Terms.
		{name: "terms header missing", e: m, body: validCreate(), status: 428, code: "terms_required"},
		{name: "terms header wrong", e: m, body: validCreate(), hdr: terms("v2"), status: 428, code: "terms_required"},
		{name: "terms header differs in case", e: m, body: validCreate(), hdr: terms("V1"), status: 428, code: "terms_required"},
		{name: "terms: first repeated value counts (wrong first)", e: m, body: validCreate(), hdr: terms("v0", "v1"), status: 428, code: "terms_required"},
		{name: "terms: first repeated value counts (right first)", e: m, body: validCreate(), hdr: terms("v1", "v0"), status: 201},

		// 3. Bundle paths.
		{name: "entry escapes", e: m, body: validCreate(set("bundle/entryRelativePath", "../x")), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'../x'"}},
		{name: "entry resolves to nothing", e: m, body: validCreate(set("bundle/entryRelativePath", "a/..")), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'a/..'"}},
		{name: "entry is dot", e: m, body: validCreate(set("bundle/entryRelativePath", ".")), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'.'"}},
		{name: "entry escapes after resolving", e: m, body: validCreate(set("bundle/entryRelativePath", "a/../../x")), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'a/../../x'"}},
		{name: "entry trailing slash", e: m, body: validCreate(set("bundle/entryRelativePath", "app/")), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'app/'"}},
		{name: "file escapes", e: m, body: validCreate(set("bundle/files/1/relativePath", "../x")), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'../x'"}},
		{name: "file resolves to nothing", e: m, body: validCreate(set("bundle/files/1/relativePath", "a/..")), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'a/..'"}},
		{name: "file is root", e: m, body: validCreate(set("bundle/files/0/relativePath", "/")), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'/'"}},
		{name: "absolute paths are made relative", e: m, body: validCreate(set("bundle/entryRelativePath", "/../telo.yaml"), set("bundle/files/0/relativePath", "/telo.yaml")), hdr: ok, status: 201},

		// 4. Config gate.
		{name: "image not offered", e: m, body: validCreate(set("config/image", "evil/image:1")), hdr: ok, status: 400, code: "invalid_config", message: []string{config.DefaultImage}},

		// 5. Watch switch.
		{name: "watch disabled", e: noWatch, body: validCreate(set("mode", "watch")), hdr: ok, status: 400, code: "watch_disabled"},
		{name: "run still works with watch disabled", e: noWatch, body: validCreate(set("mode", "run")), hdr: ok, status: 201},

		// 6. Agent.
		{name: "agent without watch", e: m, body: validCreate(set("agent", "helper")), hdr: ok, status: 400, code: "agent_requires_watch"},
		{name: "agent in run mode", e: m, body: validCreate(set("mode", "run"), set("agent", "helper")), hdr: ok, status: 400, code: "agent_requires_watch"},
		{name: "unknown agent", e: m, body: validCreate(set("mode", "watch"), set("agent", "ghost")), hdr: ok, status: 400, code: "unknown_agent", message: []string{"ghost", "helper"}},
		{name: "agent without port", e: m, body: validCreate(set("mode", "watch"), set("agent", "tool")), hdr: ok, status: 400, code: "agent_port_undeclared", message: []string{"RUNNER_APPS.tool.port"}},
		{name: "agent with port", e: m, body: validCreate(set("mode", "watch"), set("agent", "helper")), hdr: ok, status: 201},

		// 8. App set.
		{name: "app name uppercase", e: m, body: validCreate(watchApps(app("Web"))), hdr: ok, status: 400, code: "invalid_app_name", message: []string{"Web"}},
		{name: "app name leading dash", e: m, body: validCreate(watchApps(app("-web"))), hdr: ok, status: 400, code: "invalid_app_name"},
		{name: "app name trailing dash", e: m, body: validCreate(watchApps(app("web-"))), hdr: ok, status: 400, code: "invalid_app_name"},
		{name: "app name underscore", e: m, body: validCreate(watchApps(app("we_b"))), hdr: ok, status: 400, code: "invalid_app_name"},
		{name: "app name dot", e: m, body: validCreate(watchApps(app("web.app"))), hdr: ok, status: 400, code: "invalid_app_name"},
		{name: "app name 63 chars", e: m, body: validCreate(watchApps(app(long[:63]))), hdr: ok, status: 201},
		{name: "reserved workspace", e: m, body: validCreate(watchApps(app("web"), app("workspace"))), hdr: ok, status: 400, code: "reserved_app_name", message: []string{"workspace"}},
		{name: "reserved agent", e: m, body: validCreate(watchApps(app("agent"))), hdr: ok, status: 400, code: "reserved_app_name", message: []string{"agent"}},
		{name: "duplicate name", e: m, body: validCreate(watchApps(app("web"), app("api"), app("web"))), hdr: ok, status: 400, code: "duplicate_app_name", message: []string{"web"}},
		{name: "app entry escapes", e: m, body: validCreate(watchApps(body{"name": "web", "entryRelativePath": "../x"})), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'../x'"}},
		{name: "port claimed by two apps", e: m, body: validCreate(watchApps(app("web", 3000), app("api", 4000, 3000))), hdr: ok, status: 400, code: "port_conflict", message: []string{`"web"`, `"api"`, "tcp/3000"}},
		{name: "port repeated within one app", e: m, body: validCreate(watchApps(app("web", 3000, 3000))), hdr: ok, status: 400, code: "port_conflict", message: []string{`"web" and "web"`, "tcp/3000"}},
		{name: "workspace port", e: m, body: validCreate(watchApps(app("web", 8099))), hdr: ok, status: 400, code: "port_conflict", message: []string{`"web"`, "tcp/8099", "workspace server"}},
		{name: "inspect port of the second app", e: m, body: validCreate(watchApps(app("web", 3000), app("api", 9231))), hdr: ok, status: 400, code: "port_conflict", message: []string{`"api"`, "tcp/9231", "inspect"}},
		{name: "inspect port past the app count", e: m, body: validCreate(watchApps(app("web", 3000), app("api", 9232))), hdr: ok, status: 201},
		{name: "run session with inspect on 9230", e: m, body: validCreate(set("inspect", true), set("ports", []any{body{"port": 9230, "protocol": "tcp"}})), hdr: ok, status: 400, code: "port_conflict", message: []string{"tcp/9230"}},
		{name: "run session without inspect may use 8099 and 9230", e: m, body: validCreate(set("ports", []any{body{"port": 8099, "protocol": "tcp"}, body{"port": 9230, "protocol": "tcp"}})), hdr: ok, status: 201},
		{name: "tcp and udp on one port do not conflict", e: m, body: validCreate(watchApps(app("web", 3000), body{"name": "dns", "entryRelativePath": "dns.yaml", "ports": []any{body{"port": 3000, "protocol": "udp"}}})), hdr: ok, status: 201},
		{name: "run mode with two apps", e: m, body: validCreate(set("apps", []any{app("web"), app("api")})), hdr: ok, status: 400, code: "invalid_request", message: []string{"run"}},
		{name: "run mode with one app", e: m, body: validCreate(set("apps", []any{app("web", 3000)})), hdr: ok, status: 201},
	}
	runCreateCases(t, cases)
}

// TestCreateValidationOrder gives each request two faults: the one of the
// earlier step of 4.4.2 must answer.
func TestCreateValidationOrder(t *testing.T) {
	ns := testkit.StartJetStream(t)
	m := newEdge(t, ns, loadConfig(t, mainVars), "main")
	noWatch := newEdge(t, ns, loadConfig(t, withVars(mainVars, "RUNNER_WATCH_SESSIONS", "false")), "nowatch")
	ok := terms("v1")

	cases := []createCase{
		{name: "schema before terms", e: m, body: validCreate(del("env")), status: 400, code: "invalid_request"},
		{name: "terms before bundle paths", e: m, body: validCreate(set("bundle/entryRelativePath", "../x")), status: 428, code: "terms_required"},
		{name: "entry path before file paths", e: m, body: validCreate(set("bundle/entryRelativePath", "../entry"), set("bundle/files/0/relativePath", "../file")), hdr: ok, status: 400, code: "invalid_bundle", message: []string{"'../entry'"}},
		{name: "bundle paths before config", e: m, body: validCreate(set("bundle/files/1/relativePath", "a/.."), set("config/image", "evil:1")), hdr: ok, status: 400, code: "invalid_bundle"},
		{name: "config before watch switch", e: noWatch, body: validCreate(set("config/image", "evil:1"), set("mode", "watch")), hdr: ok, status: 400, code: "invalid_config"},
		{name: "config before agent", e: m, body: validCreate(set("config/image", "evil:1"), set("agent", "helper")), hdr: ok, status: 400, code: "invalid_config"},
		{name: "watch switch before agent", e: noWatch, body: validCreate(set("mode", "watch"), set("agent", "ghost")), hdr: ok, status: 400, code: "watch_disabled"},
		{name: "agent mode before app names", e: m, body: validCreate(set("agent", "helper"), set("apps", []any{app("Bad")})), hdr: ok, status: 400, code: "agent_requires_watch"},
		{name: "unknown agent before app names", e: m, body: validCreate(watchApps(app("workspace")), set("agent", "ghost")), hdr: ok, status: 400, code: "unknown_agent"},
		{name: "agent port before app set", e: m, body: validCreate(watchApps(app("web", 80), app("web", 80)), set("agent", "tool")), hdr: ok, status: 400, code: "agent_port_undeclared"},
		{name: "name before reserved, app by app", e: m, body: validCreate(watchApps(app("Bad"), app("agent"))), hdr: ok, status: 400, code: "invalid_app_name"},
		{name: "earlier app's fault first", e: m, body: validCreate(watchApps(app("workspace"), app("Bad"))), hdr: ok, status: 400, code: "reserved_app_name"},
		{name: "reserved before ports", e: m, body: validCreate(watchApps(app("web", 80), app("agent", 80))), hdr: ok, status: 400, code: "reserved_app_name"},
		{name: "duplicate before entry", e: m, body: validCreate(watchApps(app("web"), body{"name": "web", "entryRelativePath": "../x"})), hdr: ok, status: 400, code: "duplicate_app_name"},
		{name: "entry before ports", e: m, body: validCreate(watchApps(app("web", 80), body{"name": "api", "entryRelativePath": "../x", "ports": []any{body{"port": 80, "protocol": "tcp"}}})), hdr: ok, status: 400, code: "invalid_bundle"},
	}
	runCreateCases(t, cases)
}

// TestCreateCapacity covers the two ceilings (4.4.2 steps 7 and 10) and
// that every validation runs before admission.
func TestCreateCapacity(t *testing.T) {
	ns := testkit.StartJetStream(t)
	watch1 := newEdge(t, ns, loadConfig(t, withVars(mainVars, "RUNNER_WATCH_MAX_SESSIONS", "1")), "watch1")
	ok := terms("v1")
	watch1.do(t, http.MethodPost, "/v1/sessions", validCreate(set("mode", "watch")), ok).created(t)

	ns2 := testkit.StartJetStream(t)
	full := newEdge(t, ns2, loadConfig(t, withVars(mainVars, "RUNNER_MAX_SESSIONS", "1")), "full")
	full.do(t, http.MethodPost, "/v1/sessions", validCreate(), ok).created(t)

	cases := []createCase{
		{name: "watch ceiling", e: watch1, body: validCreate(set("mode", "watch")), hdr: ok, status: 409, code: "too_many_watch_sessions", message: []string{"1"}},
		{name: "watch ceiling before app set", e: watch1, body: validCreate(watchApps(app("Bad"))), hdr: ok, status: 409, code: "too_many_watch_sessions"},
		{name: "agent before watch ceiling", e: watch1, body: validCreate(set("mode", "watch"), set("agent", "ghost")), hdr: ok, status: 400, code: "unknown_agent"},
		{name: "run sessions ignore the watch ceiling", e: watch1, body: validCreate(), hdr: ok, status: 201},
		{name: "registry ceiling", e: full, body: validCreate(), hdr: ok, status: 409, code: "too_many_sessions", message: []string{"1"}},
		{name: "registry ceiling for watch", e: full, body: validCreate(set("mode", "watch")), hdr: ok, status: 409, code: "too_many_sessions"},
		{name: "validation before registry ceiling", e: full, body: validCreate(watchApps(app("Bad"))), hdr: ok, status: 400, code: "invalid_app_name"},
		{name: "terms before registry ceiling", e: full, body: validCreate(), status: 428, code: "terms_required"},
	}
	runCreateCases(t, cases)
}

func TestCreateTermsBody(t *testing.T) {
	e := newEnv(t, withVars(mainVars, "RUNNER_TERMS_TITLE", "House rules"))
	res := e.do(t, http.MethodPost, "/v1/sessions", validCreate(), nil)
	if res.status != http.StatusPreconditionRequired {
		t.Fatalf("status = %d, want 428", res.status)
	}
	want := map[string]any{"error": "terms_required", "terms": map[string]any{"version": "v1", "title": "House rules", "body": "Be nice."}}
	got := res.object(t)
	delete(got, "message") // free text when present
	if !reflect.DeepEqual(got, want) {
		t.Errorf("428 body = %v, want %v", got, want)
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return string(b)
}

// TestCreateResponse checks the 201 body (4.4.2 step 11) and the durable
// effects a driver starts from: record, bundle and start command.
func TestCreateResponse(t *testing.T) {
	e := newEnv(t, nil)
	before := time.Now().UTC().Truncate(time.Millisecond)
	res := e.do(t, http.MethodPost, "/v1/sessions", validCreate(set("bundle/entryRelativePath", "./app//telo.yaml")), nil)
	after := time.Now().UTC()
	id := res.created(t)
	if ct := res.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	got := res.object(t)
	if len(got) != 3 {
		t.Errorf("201 body = %v, want exactly sessionId, streamUrl, createdAt", got)
	}
	if got, want := got["streamUrl"], "/v1/sessions/"+id+"/events"; got != want {
		t.Errorf("streamUrl = %v, want %v", got, want)
	}
	createdAt, _ := got["createdAt"].(string)
	ts, err := time.Parse("2006-01-02T15:04:05.000Z", createdAt)
	if err != nil || len(createdAt) != len("2006-01-02T15:04:05.000Z") {
		t.Fatalf("createdAt = %q, want the 2006-01-02T15:04:05.000Z form (%v)", createdAt, err)
	}
	if ts.Before(before) || ts.After(after) {
		t.Errorf("createdAt = %v, want between %v and %v", ts, before, after)
	}

	rec := e.record(t, id)
	if rec.Mode != contract.ModeRun || rec.Status.Kind != contract.StatusStarting || rec.Agent != "" {
		t.Errorf("record mode, status, agent = %q, %q, %q, want run, starting, none", rec.Mode, rec.Status.Kind, rec.Agent)
	}
	if !rec.CreatedAt.Equal(ts) {
		t.Errorf("record createdAt = %v, want %v", rec.CreatedAt, ts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := e.store.GetBundle(ctx, id)
	if err != nil {
		t.Fatalf("GetBundle(%s) error = %v", id, err)
	}
	if b.EntryRelativePath != "app/telo.yaml" || len(b.Files) != 2 || b.Files[1].RelativePath != "lib/mod.yaml" {
		t.Errorf("stored bundle = %+v, want normalized entry app/telo.yaml and both files", b)
	}

	// The start command is queued for the drivers.
	cons, err := e.driver.Consumer(ctx, bus.StreamCmd, bus.ConsumerDrivers)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("next start command: %v", err)
	}
	if msg.Subject() != bus.CmdStartSubject(id) || string(msg.Data()) != id || msg.Headers().Get(bus.HeaderSession) != id {
		t.Errorf("command = %s %q (session %q), want %s %q", msg.Subject(), msg.Data(), msg.Headers().Get(bus.HeaderSession), bus.CmdStartSubject(id), id)
	}
}

// TestCreateRecord checks what a driver will start: the app set, inspect
// and the shaped env (4.4.1, 4.4.2 env shaping, 4.4.3).
func TestCreateRecord(t *testing.T) {
	ns := testkit.StartJetStream(t)
	withDefault := newEdge(t, ns, loadConfig(t, withVars(mainVars, "TELO_REGISTRY_URL", "https://default.example")), "def")
	noDefault := newEdge(t, ns, loadConfig(t, mainVars), "nodef")
	ok := terms("v1")
	tcp := func(p int) contract.PortMapping { return contract.PortMapping{Port: p, Protocol: "tcp"} }

	tests := []struct {
		name    string
		e       *testEnv
		body    body
		env     map[string]string
		apps    []session.App
		mode    string
		inspect bool
	}{
		{
			name: "no registry anywhere",
			e:    noDefault, body: validCreate(set("env", body{"A": "1"})),
			env:  map[string]string{"A": "1"},
			apps: []session.App{{Name: "app", Entry: "telo.yaml", IO: "tty", Ports: []contract.PortMapping{}, Trigger: "initial"}},
			mode: "run",
		},
		{
			name: "runner default injected",
			e:    withDefault, body: validCreate(),
			env:  map[string]string{"TELO_REGISTRY_URL": "https://default.example"},
			apps: []session.App{{Name: "app", Entry: "telo.yaml", IO: "tty", Ports: []contract.PortMapping{}, Trigger: "initial"}},
			mode: "run",
		},
		{
			name: "config registryUrl beats the default, trimmed",
			e:    withDefault, body: validCreate(set("config/registryUrl", "  https://cfg.example  ")),
			env:  map[string]string{"TELO_REGISTRY_URL": "https://cfg.example"},
			apps: []session.App{{Name: "app", Entry: "telo.yaml", IO: "tty", Ports: []contract.PortMapping{}, Trigger: "initial"}},
			mode: "run",
		},
		{
			name: "blank config registryUrl falls back to the default",
			e:    withDefault, body: validCreate(set("config/registryUrl", "   ")),
			env:  map[string]string{"TELO_REGISTRY_URL": "https://default.example"},
			apps: []session.App{{Name: "app", Entry: "telo.yaml", IO: "tty", Ports: []contract.PortMapping{}, Trigger: "initial"}},
			mode: "run",
		},
		{
			name: "session env beats config and default; cache dir dropped",
			e:    withDefault, body: validCreate(set("config/registryUrl", "https://cfg.example"), set("env", body{"TELO_REGISTRY_URL": "https://env.example", "TELO_CACHE_DIR": "/tmp/x", "B": "2"})),
			env:  map[string]string{"TELO_REGISTRY_URL": "https://env.example", "B": "2"},
			apps: []session.App{{Name: "app", Entry: "telo.yaml", IO: "tty", Ports: []contract.PortMapping{}, Trigger: "initial"}},
			mode: "run",
		},
		{
			name: "empty session value still wins",
			e:    withDefault, body: validCreate(set("env", body{"TELO_REGISTRY_URL": ""})),
			env:  map[string]string{"TELO_REGISTRY_URL": ""},
			apps: []session.App{{Name: "app", Entry: "telo.yaml", IO: "tty", Ports: []contract.PortMapping{}, Trigger: "initial"}},
			mode: "run",
		},
		{
			name: "default app gets the normalized entry, top-level ports and coerced inspect",
			e:    noDefault, body: validCreate(
				set("bundle/entryRelativePath", "/srv/../app/./main.yaml"),
				set("ports", []any{body{"port": "8080", "protocol": "tcp"}, body{"port": 53, "protocol": "udp"}}),
				set("inspect", "true"),
				set("env", body{"N": 5, "T": false}),
			),
			env:     map[string]string{"N": "5", "T": "false"},
			apps:    []session.App{{Name: "app", Entry: "app/main.yaml", IO: "tty", Ports: []contract.PortMapping{tcp(8080), {Port: 53, Protocol: "udp"}}, Trigger: "initial"}},
			mode:    "run",
			inspect: true,
		},
		{
			name: "single port object",
			e:    noDefault, body: validCreate(set("ports", body{"port": 3000, "protocol": "tcp"})),
			env:  map[string]string{},
			apps: []session.App{{Name: "app", Entry: "telo.yaml", IO: "tty", Ports: []contract.PortMapping{tcp(3000)}, Trigger: "initial"}},
			mode: "run",
		},
		{
			name: "apps given: top-level ports ignored",
			e:    noDefault, body: validCreate(
				set("ports", []any{body{"port": 9999, "protocol": "tcp"}}),
				set("apps", []any{body{"name": "web", "entryRelativePath": "./web/telo.yaml", "ports": body{"port": 3000, "protocol": "tcp"}, "io": "streams"}}),
			),
			env:  map[string]string{},
			apps: []session.App{{Name: "web", Entry: "web/telo.yaml", IO: "streams", Ports: []contract.PortMapping{tcp(3000)}, Trigger: "initial"}},
			mode: "run",
		},
		{
			name: "watch forces inspect",
			e:    noDefault, body: validCreate(watchApps(app("web", 3000), body{"name": "api", "entryRelativePath": "api.yaml"}), set("inspect", false)),
			env: map[string]string{},
			apps: []session.App{
				{Name: "web", Entry: "telo.yaml", IO: "tty", Ports: []contract.PortMapping{tcp(3000)}, Trigger: "initial"},
				{Name: "api", Entry: "api.yaml", IO: "tty", Ports: []contract.PortMapping{}, Trigger: "initial"},
			},
			mode:    "watch",
			inspect: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := tc.e.do(t, http.MethodPost, "/v1/sessions", tc.body, ok).created(t)
			rec := tc.e.record(t, id)
			if !reflect.DeepEqual(rec.Launch.Env, tc.env) {
				t.Errorf("launch env = %v, want %v", rec.Launch.Env, tc.env)
			}
			if !reflect.DeepEqual(rec.Apps, tc.apps) {
				t.Errorf("apps = %+v, want %+v", rec.Apps, tc.apps)
			}
			if rec.Mode != tc.mode {
				t.Errorf("mode = %q, want %q", rec.Mode, tc.mode)
			}
			if rec.Launch.Inspect != tc.inspect {
				t.Errorf("inspect = %v, want %v", rec.Launch.Inspect, tc.inspect)
			}
			if c := rec.Launch.Config; c.Image != config.DefaultImage || c.PullPolicy != "missing" {
				t.Errorf("config = %+v, want image %s, pullPolicy missing", c, config.DefaultImage)
			}
			if rec.Launch.SelfContained || rec.Launch.AgentSpec != nil {
				t.Errorf("selfContained, agentSpec = %v, %+v, want false, nil", rec.Launch.SelfContained, rec.Launch.AgentSpec)
			}
		})
	}
}

// TestCreateAgent covers 4.4.2 step 9 and 12.3: a kept agent is the
// resolved catalog entry; an agent whose port an app declares (as tcp) is
// dropped with a progress notice.
func TestCreateAgent(t *testing.T) {
	e := newEnv(t, mainVars)
	ok := terms("v1")

	t.Run("kept when only udp clashes", func(t *testing.T) {
		dns := body{"name": "dns", "entryRelativePath": "telo.yaml", "ports": []any{body{"port": 8080, "protocol": "udp"}}}
		id := e.do(t, http.MethodPost, "/v1/sessions", validCreate(watchApps(dns), set("agent", "helper")), ok).created(t)
		rec := e.record(t, id)
		want := &session.AgentSpec{Name: "helper", Image: "op/helper:1", PullPolicy: "missing", Port: 8080} // env: the driver's RUNNER_APPS
		if rec.Agent != "helper" || !reflect.DeepEqual(rec.Launch.AgentSpec, want) {
			t.Errorf("agent, spec = %q, %+v, want helper, %+v", rec.Agent, rec.Launch.AgentSpec, want)
		}
		doc := e.do(t, http.MethodGet, "/v1/sessions/"+id, nil, nil).object(t)
		if doc["agent"] != "helper" {
			t.Errorf("document agent = %v, want helper", doc["agent"])
		}
	})

	t.Run("dropped on a tcp clash", func(t *testing.T) {
		id := e.do(t, http.MethodPost, "/v1/sessions", validCreate(watchApps(app("web", 3000), app("api", 8080)), set("agent", "helper")), ok).created(t)
		rec := e.record(t, id)
		if rec.Agent != "" || rec.Launch.AgentSpec != nil {
			t.Errorf("agent, spec = %q, %+v, want none", rec.Agent, rec.Launch.AgentSpec)
		}
		doc := e.do(t, http.MethodGet, "/v1/sessions/"+id, nil, nil).object(t)
		if v, present := doc["agent"]; present {
			t.Errorf("document agent = %v, want absent", v)
		}
		_, event, data := e.firstSSE(t, id)
		if event != "progress" {
			t.Fatalf("first event = %q (%s), want progress", event, data)
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event data %q: %v", data, err)
		}
		msg, _ := ev["message"].(string)
		delete(ev, "message")
		if want := (map[string]any{"type": "progress", "phase": "provision"}); !reflect.DeepEqual(ev, want) {
			t.Errorf("notice = %v, want %v plus a message", ev, want)
		}
		for _, want := range []string{"helper", "api", "tcp/8080"} {
			if !strings.Contains(msg, want) {
				t.Errorf("notice message = %q, want it to name %q", msg, want)
			}
		}
	})
}

// A drawn id that a record already holds is never used: the record's
// create refuses it, its slot is given back and another id is drawn; the
// existing session's record and bundle are untouched. Admission is marked
// complete off the request's path, and the ledger then holds no pending
// admission.
func TestCreateDrawsAgainOnCollision(t *testing.T) {
	e := newEnv(t, mainVars)
	ok := terms("v1")
	first := e.do(t, http.MethodPost, "/v1/sessions", validCreate(set("bundle/files/0/contents", "kind: First\n")), ok).created(t)
	fresh := contract.NewSessionID()
	draws := []string{first, first, fresh}
	e.srv.newID = func() string {
		id := draws[0]
		draws = draws[1:]
		return id
	}
	second := e.do(t, http.MethodPost, "/v1/sessions", validCreate(set("bundle/files/0/contents", "kind: Second\n")), ok).created(t)
	if second != fresh || len(draws) != 0 {
		t.Fatalf("second session id = %s (draws left %v), want %s after two collisions", second, draws, fresh)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for id, want := range map[string]string{first: "kind: First\n", second: "kind: Second\n"} {
		b, err := e.store.GetBundle(ctx, id)
		if err != nil || len(b.Files) != 2 || b.Files[0].Contents != want {
			t.Fatalf("bundle of %s = %+v, %v; want %q", id, b, err, want)
		}
		if r := e.record(t, id); r.ID != id {
			t.Fatalf("record %s has id %s", id, r.ID)
		}
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		l, err := e.store.Ledger(ctx)
		return err == nil && l.Total == 2 && len(l.Pending) == 0
	}, "ledger: 2 sessions, no admission pending")
}
