package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nats-io/nats.go"
	"github.com/telorunner/telorunner/pkg/contract"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/api-edge/internal/config"
)

func TestHealthAndUnknownRoute(t *testing.T) {
	e := newEnv(t, nil)

	res := e.do(t, http.MethodGet, "/v1/health", nil, nil)
	if res.status != http.StatusOK {
		t.Fatalf("GET /v1/health status = %d, want 200", res.status)
	}
	if got, want := res.object(t), (body{"ok": true, "version": config.Version}); !reflect.DeepEqual(got, want) {
		t.Errorf("GET /v1/health = %v, want %v", got, want)
	}

	for _, tc := range []struct{ name, method, path string }{
		{"unknown path", http.MethodGet, "/v1/nope"},
		{"outside v1", http.MethodGet, "/"},
		{"unknown session subroute", http.MethodPut, "/v1/sessions/abcdefghijkl/nope"},
		{"wrong method", http.MethodDelete, "/v1/health"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.do(t, tc.method, tc.path, nil, nil)
			if res.status != http.StatusNotFound {
				t.Fatalf("%s %s status = %d, want 404", tc.method, tc.path, res.status)
			}
			if code, _ := res.envelope(t); code != "not_found" {
				t.Errorf("%s %s error = %q, want not_found", tc.method, tc.path, code)
			}
		})
	}
}

const catalogJSON = `{
	"helper": {"image": "secret.example/helper:1", "env": {"API_KEY": "sk-very-secret"}, "port": 8080, "title": "Helper", "description": "Helps."},
	"tool":   {"image": "secret.example/tool:2", "pullPolicy": "always"}
}`

func TestCapabilities(t *testing.T) {
	wantSchema := func(image string) map[string]any {
		return map[string]any{
			"type":     "object",
			"required": []any{"image", "pullPolicy"},
			"properties": map[string]any{
				"image": map[string]any{
					"type": "string", "minLength": float64(1), "default": image, "readOnly": true,
					"title": "Image", "description": "Kernel image the session runs on. Fixed by the operator.",
				},
				"pullPolicy": map[string]any{
					"type": "string", "enum": []any{"missing", "always", "never"}, "default": "missing",
					"title": "Pull policy", "description": "When to pull the kernel image.",
				},
			},
		}
	}
	tests := []struct {
		name        string
		vars        map[string]string
		displayName string
		description string
		watch       bool
		agents      any // nil: key absent
		apps        any // nil: key absent
		terms       any // nil: key absent
		image       string
	}{
		{
			name:        "defaults",
			displayName: config.DefaultDisplayName, description: config.DefaultDescription,
			image: config.DefaultImage,
		},
		{
			name: "operator texts, image and watch without catalog",
			vars: map[string]string{
				"RUNNER_DISPLAY_NAME": "Acme", "RUNNER_DESCRIPTION": "Acme runner",
				"RUNNER_IMAGE": "acme/node:1", "RUNNER_WATCH_SESSIONS": "yes",
			},
			displayName: "Acme", description: "Acme runner", watch: true, image: "acme/node:1",
		},
		{
			name:        "catalog with watch: only entries with a port are agents",
			vars:        map[string]string{"RUNNER_APPS": catalogJSON, "RUNNER_WATCH_SESSIONS": "true"},
			displayName: config.DefaultDisplayName, description: config.DefaultDescription, watch: true,
			agents: []any{"helper"},
			apps: []any{
				map[string]any{"name": "helper", "title": "Helper", "description": "Helps."},
				map[string]any{"name": "tool"},
			},
			image: config.DefaultImage,
		},
		{
			name:        "catalog without watch: no agents advertised",
			vars:        map[string]string{"RUNNER_APPS": catalogJSON},
			displayName: config.DefaultDisplayName, description: config.DefaultDescription,
			apps: []any{
				map[string]any{"name": "helper", "title": "Helper", "description": "Helps."},
				map[string]any{"name": "tool"},
			},
			image: config.DefaultImage,
		},
		{
			name:        "watch with a catalog of portless entries: agents omitted",
			vars:        map[string]string{"RUNNER_APPS": `{"tool":{"image":"secret.example/tool:2"}}`, "RUNNER_WATCH_SESSIONS": "1"},
			displayName: config.DefaultDisplayName, description: config.DefaultDescription, watch: true,
			apps:  []any{map[string]any{"name": "tool"}},
			image: config.DefaultImage,
		},
		{
			name:        "terms configured",
			vars:        map[string]string{"RUNNER_TERMS_BODY": "Be nice.", "RUNNER_TERMS_VERSION": "v7", "RUNNER_TERMS_TITLE": "Rules"},
			displayName: config.DefaultDisplayName, description: config.DefaultDescription,
			terms: map[string]any{"version": "v7", "title": "Rules", "body": "Be nice."},
			image: config.DefaultImage,
		},
	}
	ns := testkit.StartJetStream(t)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEdge(t, ns, loadConfig(t, tc.vars), "t"+string(rune('a'+i)))
			res := e.do(t, http.MethodGet, "/v1/capabilities", nil, nil)
			if res.status != http.StatusOK {
				t.Fatalf("GET /v1/capabilities status = %d, want 200", res.status)
			}
			got := res.object(t)
			if got["displayName"] != tc.displayName || got["description"] != tc.description {
				t.Errorf("displayName, description = %q, %q, want %q, %q", got["displayName"], got["description"], tc.displayName, tc.description)
			}
			features, _ := got["features"].(map[string]any)
			if got, want := features["io"], []any{"tty", "streams"}; !reflect.DeepEqual(got, want) {
				t.Errorf("features.io = %v, want %v", got, want)
			}
			if features["ports"] != true {
				t.Errorf("features.ports = %v, want true", features["ports"])
			}
			if features["watch"] != tc.watch {
				t.Errorf("features.watch = %v, want %v", features["watch"], tc.watch)
			}
			checkOptional(t, "features.agents", features, "agents", tc.agents)
			checkOptional(t, "apps", got, "apps", tc.apps)
			checkOptional(t, "terms", got, "terms", tc.terms)
			if got, want := got["config"], (map[string]any{"schema": wantSchema(tc.image)}); !reflect.DeepEqual(got, want) {
				t.Errorf("config = %v, want %v", got, want)
			}
			// The catalog is secret material: images and env never leak.
			for _, secret := range []string{"secret.example", "sk-very-secret", "API_KEY", "8080", `"image":"secret`, `"env"`, `"port"`} {
				if bytes.Contains(res.body, []byte(secret)) {
					t.Errorf("capabilities body %s contains %q", res.body, secret)
				}
			}
		})
	}
}

func checkOptional(t *testing.T, name string, m map[string]any, key string, want any) {
	t.Helper()
	got, present := m[key]
	switch {
	case want == nil && present:
		t.Errorf("%s = %v, want absent", name, got)
	case want != nil && !reflect.DeepEqual(got, want):
		t.Errorf("%s = %v, want %v", name, got, want)
	}
}

func TestProbe(t *testing.T) {
	e := newEnv(t, nil)
	tests := []struct {
		name string
		body any
	}{
		{"not JSON", "{"},
		{"not an object", `["config"]`},
		{"missing config", body{}},
		{"config not an object", body{"config": "x"}},
		{"missing image", body{"config": body{"pullPolicy": "missing"}}},
		{"empty image", body{"config": body{"image": "", "pullPolicy": "missing"}}},
		{"missing pullPolicy", body{"config": body{"image": "x"}}},
		{"bad pullPolicy", body{"config": body{"image": "x", "pullPolicy": "sometimes"}}},
		{"trailing garbage", `{"config":{"image":"x","pullPolicy":"missing"}} x`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := e.do(t, http.MethodPost, "/v1/probe", tc.body, nil)
			if res.status != http.StatusBadRequest {
				t.Fatalf("POST /v1/probe status = %d (body %s), want 400", res.status, res.body)
			}
			if code, _ := res.envelope(t); code != "invalid_request" {
				t.Errorf("POST /v1/probe error = %q, want invalid_request", code)
			}
		})
	}

	// Unknown and extra properties at either level are dropped, whatever
	// their type (4.3): the editor sends capability fields such as
	// registryUrl.
	for _, tc := range []struct {
		name string
		body body
	}{
		{"extra fields", body{"config": body{"image": "x", "pullPolicy": "never", "registryUrl": "https://r.example", "baseUrl": "http://x"}, "extra": 1}},
		{"extra fields of any type", body{"config": body{"image": "x", "pullPolicy": "always", "registryUrl": body{"nested": true}, "flag": []any{1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.do(t, http.MethodPost, "/v1/probe", tc.body, nil)
			if res.status != http.StatusOK {
				t.Fatalf("POST /v1/probe status = %d (body %s), want 200", res.status, res.body)
			}
			if got := res.object(t)["status"]; got != "unavailable" {
				t.Errorf("POST /v1/probe status field = %v, want unavailable (no driver)", got)
			}
		})
	}
}

func TestProbeUnavailableWithoutDriver(t *testing.T) {
	e := newEnv(t, nil)
	res := e.do(t, http.MethodPost, "/v1/probe", body{"config": body{"image": config.DefaultImage, "pullPolicy": "missing"}}, nil)
	if res.status != http.StatusOK {
		t.Fatalf("POST /v1/probe status = %d, want 200", res.status)
	}
	got := res.object(t)
	if got["status"] != "unavailable" {
		t.Errorf("probe status = %v, want unavailable", got["status"])
	}
	for _, k := range []string{"message", "remediation"} {
		if s, _ := got[k].(string); s == "" {
			t.Errorf("probe %s = %v, want a non-empty string", k, got[k])
		}
	}
}

func TestProbeReadyWithWaitingDriver(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := e.driver.Consumer(ctx, bus.StreamCmd, bus.ConsumerDrivers)
	if err != nil {
		t.Fatalf("consumer %s: %v", bus.ConsumerDrivers, err)
	}
	// What a pod-driver does: keep a pull request waiting for start commands.
	cc, err := cons.Consume(func(jetstream.Msg) {})
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	defer cc.Stop()

	var last map[string]any
	testkit.Eventually(t, 5*time.Second, func() bool {
		res := e.do(t, http.MethodPost, "/v1/probe", body{"config": body{"image": config.DefaultImage, "pullPolicy": "missing"}}, nil)
		last = res.object(t)
		return res.status == http.StatusOK && last["status"] == "ready"
	}, "probe never ready with a waiting driver: last %v", &last)
	if got, want := last, (map[string]any{"status": "ready"}); !reflect.DeepEqual(got, want) {
		t.Errorf("probe = %v, want %v", got, want)
	}
}

// A driver that finds its backend not set up turns the probe into
// needs-setup with its issues; one that cannot check into unavailable.
func TestProbeNeedsSetupFromDriver(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := e.driver.Consumer(ctx, bus.StreamCmd, bus.ConsumerDrivers)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(jetstream.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	var reply atomic.Value
	reply.Store(contract.ProbeReply{Issues: []contract.Issue{{Path: "/kubernetes/namespace", Message: "the session namespace \"telo-sessions\" does not exist"}}})
	sub, err := e.driverNC.QueueSubscribe(bus.SubjectProbe, bus.QueueDrivers, func(m *nats.Msg) {
		data, _ := json.Marshal(reply.Load())
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	probe := func() map[string]any {
		var last map[string]any
		testkit.Eventually(t, 5*time.Second, func() bool {
			res := e.do(t, http.MethodPost, "/v1/probe", body{"config": body{"image": config.DefaultImage, "pullPolicy": "missing"}}, nil)
			last = res.object(t)
			// Until the consumer sees the waiting pull request.
			return res.status == http.StatusOK && last["message"] != "no pod-driver is connected to start sessions"
		}, "probe: %v", &last)
		return last
	}
	want := map[string]any{"status": "needs-setup", "issues": []any{map[string]any{"path": "/kubernetes/namespace", "message": "the session namespace \"telo-sessions\" does not exist"}}}
	if got := probe(); !reflect.DeepEqual(got, want) {
		t.Errorf("probe = %v, want %v", got, want)
	}
	reply.Store(contract.ProbeReply{Error: "dial tcp: connection refused"})
	if got := probe(); got["status"] != "unavailable" || !strings.Contains(fmt.Sprint(got["message"]), "connection refused") || got["remediation"] == nil {
		t.Errorf("probe = %v, want unavailable naming the error, with a remediation", got)
	}
}

func TestCORS(t *testing.T) {
	ns := testkit.StartJetStream(t)
	anyOrigin := newEdge(t, ns, loadConfig(t, nil), "any")
	star := newEdge(t, ns, loadConfig(t, map[string]string{"RUNNER_CORS_ORIGINS": " * "}), "star")
	list := newEdge(t, ns, loadConfig(t, map[string]string{"RUNNER_CORS_ORIGINS": "https://a.example, ,https://b.example"}), "list")
	// The all-in-one's default: loopback origins plus what the variable adds.
	loopbackBase := config.Default()
	loopbackBase.CORS = config.LoopbackCORS()
	loopbackCfg, err := config.LoadOver(loopbackBase, func(k string) (string, bool) {
		if k == "RUNNER_CORS_ORIGINS" {
			return "https://editor.example", true
		}
		return "", false
	})
	if err != nil {
		t.Fatal(err)
	}
	loopback := newEdge(t, ns, loopbackCfg, "loopback")

	type want struct {
		status int
		code   string // error code, when the answer is an error
		allow  string // Access-Control-Allow-Origin ("" absent)
		vary   bool
	}
	tests := []struct {
		name   string
		e      *testEnv
		method string
		path   string
		origin string
		body   any
		want   want
	}{
		{"unset list, any origin", anyOrigin, http.MethodGet, "/v1/health", "https://x.example", nil, want{status: 200, allow: "*"}},
		{"star, any origin", star, http.MethodGet, "/v1/health", "https://x.example", nil, want{status: 200, allow: "*"}},
		{"star, no origin", star, http.MethodGet, "/v1/health", "", nil, want{status: 200, allow: "*"}},
		{"star, error answers carry it too", star, http.MethodGet, "/v1/sessions/abcdefghijkl", "https://x.example", nil, want{status: 404, code: "not_found", allow: "*"}},
		{"list, allowed origin echoed", list, http.MethodGet, "/v1/health", "https://b.example", nil, want{status: 200, allow: "https://b.example", vary: true}},
		{"list, allowed origin on an error", list, http.MethodGet, "/v1/nope", "https://a.example", nil, want{status: 404, code: "not_found", allow: "https://a.example", vary: true}},
		{"list, no origin passes", list, http.MethodGet, "/v1/health", "", nil, want{status: 200, vary: true}},
		{"list, disallowed origin refused", list, http.MethodGet, "/v1/health", "https://evil.example", nil, want{status: 403, code: "origin_not_allowed", vary: true}},
		{"list, match is exact", list, http.MethodGet, "/v1/health", "https://a.example/", nil, want{status: 403, code: "origin_not_allowed", vary: true}},
		{"list, disallowed origin never creates", list, http.MethodPost, "/v1/sessions", "https://evil.example", validCreate(), want{status: 403, code: "origin_not_allowed", vary: true}},
		{"loopback, localhost any port", loopback, http.MethodGet, "/v1/health", "http://localhost:5173", nil, want{status: 200, allow: "http://localhost:5173", vary: true}},
		{"loopback, 127.0.0.1 without port", loopback, http.MethodGet, "/v1/health", "http://127.0.0.1", nil, want{status: 200, allow: "http://127.0.0.1", vary: true}},
		{"loopback, ipv6", loopback, http.MethodGet, "/v1/health", "http://[::1]:8080", nil, want{status: 200, allow: "http://[::1]:8080", vary: true}},
		{"loopback, added origin", loopback, http.MethodGet, "/v1/health", "https://editor.example", nil, want{status: 200, allow: "https://editor.example", vary: true}},
		{"loopback, other site refused", loopback, http.MethodGet, "/v1/health", "https://example.com", nil, want{status: 403, code: "origin_not_allowed", vary: true}},
		{"loopback, look-alike host refused", loopback, http.MethodGet, "/v1/health", "http://localhost.example.com:80", nil, want{status: 403, code: "origin_not_allowed", vary: true}},
		{"loopback, https scheme refused", loopback, http.MethodGet, "/v1/health", "https://localhost:8062", nil, want{status: 403, code: "origin_not_allowed", vary: true}},
		{"loopback, other site never creates", loopback, http.MethodPost, "/v1/sessions", "https://example.com", validCreate(), want{status: 403, code: "origin_not_allowed", vary: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hdr := http.Header{}
			if tc.origin != "" {
				hdr.Set("Origin", tc.origin)
			}
			res := tc.e.do(t, tc.method, tc.path, tc.body, hdr)
			if res.status != tc.want.status {
				t.Fatalf("%s %s status = %d (body %s), want %d", tc.method, tc.path, res.status, res.body, tc.want.status)
			}
			if tc.want.code != "" {
				if code, _ := res.envelope(t); code != tc.want.code {
					t.Errorf("error = %q, want %q", code, tc.want.code)
				}
			}
			if got := res.header.Get("Access-Control-Allow-Origin"); got != tc.want.allow {
				t.Errorf("Access-Control-Allow-Origin = %q, want %q", got, tc.want.allow)
			}
			if got := hasToken(res.header.Values("Vary"), "Origin"); got != tc.want.vary {
				t.Errorf("Vary has Origin = %v (Vary %q), want %v", got, res.header.Values("Vary"), tc.want.vary)
			}
		})
	}
	for _, e := range []*testEnv{list, loopback} {
		if n := e.admitted(t); n != 0 {
			t.Errorf("sessions admitted after refused requests = %d, want 0", n)
		}
	}

	preflights := []struct {
		name   string
		e      *testEnv
		path   string
		origin string
		allow  string
	}{
		{"star", star, "/v1/sessions", "https://x.example", "*"},
		{"list, allowed origin", list, "/v1/sessions", "https://a.example", "https://a.example"},
		{"route without OPTIONS handler", list, "/v1/sessions/abcdefghijkl/apps", "https://a.example", "https://a.example"},
	}
	for _, tc := range preflights {
		t.Run("preflight "+tc.name, func(t *testing.T) {
			hdr := http.Header{
				"Origin":                         {tc.origin},
				"Access-Control-Request-Method":  {"PUT"},
				"Access-Control-Request-Headers": {"content-type,x-telo-accepted-terms"},
			}
			res := tc.e.do(t, http.MethodOptions, tc.path, nil, hdr)
			if res.status != http.StatusNoContent {
				t.Fatalf("OPTIONS %s status = %d, want 204", tc.path, res.status)
			}
			for k, want := range map[string]string{
				"Access-Control-Allow-Origin":  tc.allow,
				"Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, OPTIONS",
				"Access-Control-Allow-Headers": "content-type,x-telo-accepted-terms",
			} {
				if got := res.header.Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
		})
	}

	// Private-network preflights (a public page calling the loopback
	// runner) are granted to allowed origins only.
	privateNetwork := []struct {
		name   string
		e      *testEnv
		origin string
		status int
		grant  string
	}{
		{"loopback origin granted", loopback, "http://localhost:3000", http.StatusNoContent, "true"},
		{"added origin granted", loopback, "https://editor.example", http.StatusNoContent, "true"},
		{"other origin refused", loopback, "https://example.com", http.StatusForbidden, ""},
		{"star grants any origin", star, "https://x.example", http.StatusNoContent, "true"},
	}
	for _, tc := range privateNetwork {
		t.Run("private network preflight "+tc.name, func(t *testing.T) {
			hdr := http.Header{
				"Origin":                                 {tc.origin},
				"Access-Control-Request-Method":          {"POST"},
				"Access-Control-Request-Private-Network": {"true"},
			}
			res := tc.e.do(t, http.MethodOptions, "/v1/sessions", nil, hdr)
			if res.status != tc.status {
				t.Fatalf("OPTIONS status = %d (body %s), want %d", res.status, res.body, tc.status)
			}
			if got := res.header.Get("Access-Control-Allow-Private-Network"); got != tc.grant {
				t.Errorf("Access-Control-Allow-Private-Network = %q, want %q", got, tc.grant)
			}
			if tc.status == http.StatusForbidden {
				if code, _ := res.envelope(t); code != "origin_not_allowed" {
					t.Errorf("error = %q, want origin_not_allowed", code)
				}
			}
		})
	}
	t.Run("preflight without the private-network request gets no grant", func(t *testing.T) {
		res := loopback.do(t, http.MethodOptions, "/v1/sessions", nil, http.Header{"Origin": {"http://localhost:3000"}, "Access-Control-Request-Method": {"POST"}})
		if got := res.header.Get("Access-Control-Allow-Private-Network"); res.status != http.StatusNoContent || got != "" {
			t.Errorf("status %d, Access-Control-Allow-Private-Network = %q, want 204 and none", res.status, got)
		}
	})
}

func hasToken(values []string, token string) bool {
	for _, v := range values {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// TestCORSUpgradeLeftToIO checks that the CORS layer does not refuse a
// WebSocket upgrade from a disallowed origin with 403: the /io route does
// its own check and answers with close code 4403 (2.4, 7.2).
func TestCORSUpgradeLeftToIO(t *testing.T) {
	e := newEnv(t, map[string]string{"RUNNER_CORS_ORIGINS": "https://a.example"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/abcdefghijkl/io"
	conn, res, err := websocket.DefaultDialer.DialContext(ctx, url, http.Header{"Origin": {"https://evil.example"}})
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		t.Fatalf("dial /io from a disallowed origin: %v (status %d), want an upgrade", err, status)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err = conn.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		t.Fatalf("read after dial: %v, want a close frame", err)
	}
	if ce.Code != 4403 || ce.Text != "forbidden_origin" {
		t.Errorf("close = %d %q, want 4403 %q", ce.Code, ce.Text, "forbidden_origin")
	}
}
