package server

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// putRecord stores a session record as a driver would have left it.
func (e *testEnv) putRecord(t testing.TB, mode string, st contract.Status, workspace string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id := contract.NewSessionID()
	rec := session.Record{ID: id, Mode: mode, Status: contract.Status{Kind: contract.StatusStarting}, CreatedAt: time.Now().UTC(),
		Apps: []session.App{{Name: "web", Entry: "telo.yaml", IO: contract.IOTTY, Ports: []contract.PortMapping{}}}}
	if err := e.store.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if st.Kind != contract.StatusStarting || workspace != "" {
		if _, err := e.store.SetStatus(ctx, id, st, func(r *session.Record) error {
			r.Workspace = workspace
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// sseHeaders opens the event stream with origin and returns its status and
// response headers (the headers are flushed before any event).
func (e *testEnv) sseHeaders(t testing.TB, id, origin string) (int, http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/v1/sessions/"+id+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET events: %v", err)
	}
	defer res.Body.Close()
	return res.StatusCode, res.Header
}

// The event stream carries Vary: Origin whenever it carries
// Access-Control-Allow-Origin, "*" included (contract 6.2); ordinary JSON
// answers of a "*" runner do not need it (2.4).
func TestSSEVaryOrigin(t *testing.T) {
	ns := testkit.StartJetStream(t)
	star := newEdge(t, ns, loadConfig(t, map[string]string{"RUNNER_CORS_ORIGINS": "*"}), "star")
	list := newEdge(t, ns, loadConfig(t, map[string]string{"RUNNER_CORS_ORIGINS": "https://a.example"}), "list")
	id := star.putRecord(t, contract.ModeRun, contract.Status{Kind: contract.StatusRunning}, "")
	tests := []struct {
		name   string
		e      *testEnv
		origin string
		allow  string
	}{
		{"star with an origin", star, "https://x.example", "*"},
		{"star without an origin", star, "", "*"},
		{"list, allowed origin echoed", list, "https://a.example", "https://a.example"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, h := tc.e.sseHeaders(t, id, tc.origin)
			if status != http.StatusOK {
				t.Fatalf("GET events status = %d, want 200", status)
			}
			if got := h.Get("Content-Type"); got != "text/event-stream" {
				t.Errorf("Content-Type = %q, want text/event-stream", got)
			}
			if got := h.Get("Access-Control-Allow-Origin"); got != tc.allow {
				t.Errorf("Access-Control-Allow-Origin = %q, want %q", got, tc.allow)
			}
			if !hasToken(h.Values("Vary"), "Origin") {
				t.Errorf("Vary = %q, want Origin beside Access-Control-Allow-Origin %q (6.2)", h.Values("Vary"), tc.allow)
			}
		})
	}
}

// A bundle file's encoding is not in the request schema, which passes it
// through (contract 3.5): a value outside utf8|base64 is kept as sent.
func TestBundleEncodingPassesThrough(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		name string
		enc  any
		want string
	}{
		{"string outside the enum", "hex", "hex"},
		{"number", 5, "5"},
		{"base64", "base64", "base64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.do(t, http.MethodPost, "/v1/sessions", validCreate(set("bundle/files/1/encoding", tc.enc)), terms("v1"))
			id := res.created(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			b, err := e.store.GetBundle(ctx, id)
			if err != nil {
				t.Fatalf("GetBundle(%s) error = %v", id, err)
			}
			if len(b.Files) != 2 || b.Files[1].Encoding != tc.want || b.Files[0].Encoding != "" {
				t.Errorf("stored files = %+v, want the second with encoding %q, the first with none", b.Files, tc.want)
			}
		})
	}
}

// An id that is not a session id's shape ([a-z2-7]{12}) names no session:
// every route answers as for an unknown id, never a 500 (the id reaches
// NATS subjects and key-value keys, where `*`, `>` and `.` mean something).
func TestMalformedSessionIDIsUnknown(t *testing.T) {
	e := newEnv(t, nil)
	apps := body{"apps": []any{app("web")}}
	for _, id := range []string{"aaaaaaaaaaa*", "aaaaaaaaaaa>", "*", ">", "aaaaa.aaaaaa", "AAAAAAAAAAAA", "aaaaaaaaaaaa1", "a%2A", "aaaaaaaaaaa%20"} {
		for _, r := range []struct {
			method, path string
			body         any
			status       int
			code         string
		}{
			{http.MethodDelete, "", nil, http.StatusNoContent, ""},
			{http.MethodGet, "", nil, http.StatusNotFound, "not_found"},
			{http.MethodGet, "/events", nil, http.StatusNotFound, "not_found"},
			{http.MethodGet, "/workspace", nil, http.StatusNotFound, "not_found"},
			{http.MethodPost, "/workspace", body{"write": []any{}}, http.StatusNotFound, "not_found"},
			{http.MethodGet, "/workspace/file?path=a", nil, http.StatusNotFound, "not_found"},
			{http.MethodPost, "/reload", nil, http.StatusNotFound, "not_found"},
			{http.MethodPost, "/resume", nil, http.StatusNotFound, "not_suspended"},
			{http.MethodPut, "/apps", apps, http.StatusNotFound, "not_found"},
		} {
			path := "/v1/sessions/" + id + r.path
			res := e.do(t, r.method, path, r.body, nil)
			if res.status != r.status {
				t.Errorf("%s %s = %d %s, want %d", r.method, path, res.status, res.body, r.status)
				continue
			}
			if r.code != "" {
				if code, _ := res.envelope(t); code != r.code {
					t.Errorf("%s %s error = %q, want %q", r.method, path, code, r.code)
				}
			}
		}
		// The io route answers on the WebSocket: close 4404.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		url := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + id + "/io"
		conn, _, err := websocket.DefaultDialer.DialContext(ctx, url, nil)
		cancel()
		if err != nil {
			t.Errorf("dial %s: %v, want an upgrade", url, err)
			continue
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _, err = conn.ReadMessage()
		_ = conn.Close()
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != 4404 {
			t.Errorf("io of %q: %v, want close 4404", id, err)
		}
	}
}

// PUT apps waits only for the owning driver to take the change (contract
// 4.12 allows 202 at once, the outcome on the event stream). The request
// carries its deadline; a driver that does not answer by then gets
// 500 set_apps_failed saying nothing changed (a driver drops a request
// past its deadline, so both agree), a driver that takes it gets 202, and
// no driver, or one that finds no live workload, gets 409 not_running.
func TestPutAppsTakeTimeout(t *testing.T) {
	e := newEnv(t, nil)
	saved := appsTakeTimeout
	appsTakeTimeout = 500 * time.Millisecond
	t.Cleanup(func() { appsTakeTimeout = saved })
	put := body{"apps": []any{app("web"), app("admin")}}

	id := e.putRecord(t, contract.ModeWatch, contract.Status{Kind: contract.StatusRunning}, "http://127.0.0.1:1")
	res := e.do(t, http.MethodPut, "/v1/sessions/"+id+"/apps", put, nil)
	if code, _ := res.envelope(t); res.status != http.StatusConflict || code != "not_running" {
		t.Errorf("PUT apps with no driver = %d %s, want 409 not_running", res.status, res.body)
	}

	// A driver that never answers.
	got := make(chan *nats.Msg, 1)
	sub, err := e.driverNC.Subscribe(bus.CtlSubject(id, bus.CtlApps), func(m *nats.Msg) { got <- m })
	if err != nil {
		t.Fatal(err)
	}
	// The server knows the subscription before the edge asks (Subscribe
	// alone returns before it does).
	if err := e.driverNC.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res = e.do(t, http.MethodPut, "/v1/sessions/"+id+"/apps", put, nil)
	took := time.Since(start)
	code, msg := res.envelope(t)
	if res.status != http.StatusInternalServerError || code != "set_apps_failed" || !strings.Contains(msg, "unchanged") {
		t.Errorf("PUT apps unanswered = %d %s, want 500 set_apps_failed saying the set is unchanged", res.status, res.body)
	}
	if took > appsTakeTimeout+appsTakeMargin+2*time.Second {
		t.Errorf("PUT apps unanswered took %v, want about %v", took, appsTakeTimeout+appsTakeMargin)
	}
	select {
	case m := <-got:
		ms, err := strconv.ParseInt(m.Header.Get(bus.HeaderDeadline), 10, 64)
		if err != nil {
			t.Fatalf("request header %s = %q, want Unix milliseconds", bus.HeaderDeadline, m.Header.Get(bus.HeaderDeadline))
		}
		if dl := time.UnixMilli(ms); dl.Before(start) || dl.After(start.Add(appsTakeTimeout+time.Second)) {
			t.Errorf("request deadline %v, want within %v of %v", dl, appsTakeTimeout, start)
		}
	default:
		t.Fatal("the driver never got the change")
	}
	_ = sub.Unsubscribe()
	if err := e.driverNC.Flush(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		reply  string
		status int
		want   string
	}{
		{`{"ok":true}`, http.StatusAccepted, `{"apps":["web","admin"]}`},
		{`{"error":"not_running","message":"the session has no live workload"}`, http.StatusConflict, `"not_running"`},
	} {
		sub, err := e.driverNC.Subscribe(bus.CtlSubject(id, bus.CtlApps), func(m *nats.Msg) { _ = m.Respond([]byte(tc.reply)) })
		if err != nil {
			t.Fatal(err)
		}
		if err := e.driverNC.Flush(); err != nil {
			t.Fatal(err)
		}
		res := e.do(t, http.MethodPut, "/v1/sessions/"+id+"/apps", put, nil)
		if res.status != tc.status || !strings.Contains(string(res.body), tc.want) {
			t.Errorf("PUT apps answered %s = %d %s, want %d with %s", tc.reply, res.status, res.body, tc.status, tc.want)
		}
		_ = sub.Unsubscribe()
		if err := e.driverNC.Flush(); err != nil {
			t.Fatal(err)
		}
	}
}
