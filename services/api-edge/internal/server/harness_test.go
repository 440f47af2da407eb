package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/api-edge/internal/config"
)

// testEnv is one edge replica served over HTTP on a real in-process
// JetStream server.
type testEnv struct {
	url   string
	ns    *testkit.Server
	js    jetstream.JetStream // the edge's own connection
	store *session.Store
	// driver is a connection with the driver role, for tests that do
	// what a pod-driver does (take start commands).
	driver   jetstream.JetStream
	driverNC *nats.Conn
	cfg      config.Config
	srv      *Server
	// cancel ends the edge's streams (its context), as a stopping edge
	// does first; shutdown then also stops the HTTP server, which waits
	// for its handlers, as edge.Run does before Wait.
	cancel   context.CancelFunc
	shutdown func()
}

// loadConfig builds a configuration the way main does, from variables.
func loadConfig(t testing.TB, vars map[string]string) config.Config {
	t.Helper()
	cfg, err := config.Load(func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	})
	if err != nil {
		t.Fatalf("config.Load(%v) error = %v", vars, err)
	}
	return cfg
}

// newEnv starts a JetStream server and one edge configured from vars.
func newEnv(t testing.TB, vars map[string]string) *testEnv {
	t.Helper()
	return newEdge(t, testkit.StartJetStream(t), loadConfig(t, vars), "t")
}

// newEdge starts one more edge replica, with its own connection, over ns.
func newEdge(t testing.TB, ns *testkit.Server, cfg config.Config, edgeID string) *testEnv {
	t.Helper()
	testkit.Provision(t, ns, bus.Limits{})
	nc, js := testkit.Connect(t, ns, bus.RoleEdge)
	driverNC, driver := testkit.Connect(t, ns, bus.RoleDriver)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := session.Open(ctx, js, 5_000_000)
	if err != nil {
		t.Fatalf("session.Open() error = %v", err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	// As edge.Run serves: hijacked SSE connections come back through rl.
	hs := httptest.NewUnstartedServer(nil)
	rl := NewReuseListener(hs.Listener)
	hs.Listener = rl
	s := New(sctx, Options{Config: cfg, NC: nc, Store: store, Logger: slog.New(slog.DiscardHandler), EdgeID: edgeID, Reuse: rl.Reuse})
	hs.Config.Handler = s
	hs.Start()
	shutdown := func() {
		scancel() // ends open streams first, so Close does not wait on them
		hs.Close()
	}
	t.Cleanup(func() {
		shutdown()
		s.Wait()
	})
	return &testEnv{url: hs.URL, ns: ns, js: js, store: store, cfg: cfg, driver: driver, driverNC: driverNC, srv: s, cancel: scancel, shutdown: shutdown}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request; body is sent verbatim when it is []byte or a
// string, otherwise as its JSON encoding (nil sends no body).
func (e *testEnv) do(t testing.TB, method, path string, body any, hdr http.Header) response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("encode body: %v", err)
		}
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, rd)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, vs := range hdr {
		req.Header.Del(k)
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: res.StatusCode, header: res.Header, body: data}
}

// object decodes the body as a JSON object.
func (r response) object(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

// envelope decodes the contract's error envelope.
func (r response) envelope(t testing.TB) (code, message string) {
	t.Helper()
	var e struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("body %q is not an error envelope: %v", r.body, err)
	}
	return e.Error, e.Message
}

// sessionIDRE is the id shape of contract 5.1.
var sessionIDRE = regexp.MustCompile(`^[a-z2-7]{12}$`)

// created decodes a 201 answer and returns the session id.
func (r response) created(t testing.TB) string {
	t.Helper()
	if r.status != http.StatusCreated {
		t.Fatalf("status = %d (body %s), want 201", r.status, r.body)
	}
	var c struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(r.body, &c); err != nil || !sessionIDRE.MatchString(c.SessionID) {
		t.Fatalf("201 body %s has no valid sessionId (err %v)", r.body, err)
	}
	return c.SessionID
}

// record reads a session record straight from the registry.
func (e *testEnv) record(t testing.TB, id string) session.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, _, err := e.store.Get(ctx, id)
	if err != nil {
		t.Fatalf("store.Get(%s) error = %v", id, err)
	}
	return rec
}

// admitted returns how many sessions the admission ledger counts.
func (e *testEnv) admitted(t testing.TB) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := e.store.Ledger(ctx)
	if err != nil {
		t.Fatalf("read admission ledger: %v", err)
	}
	return l.Total
}

// body is a JSON object under construction; mutators change it by path.
type body = map[string]any

type mutator func(body)

// validCreate returns a POST /v1/sessions body that passes every check of
// a runner with the default image, changed by muts in order.
func validCreate(muts ...mutator) body {
	b := body{
		"bundle": body{
			"entryRelativePath": "telo.yaml",
			"files": []any{
				body{"relativePath": "telo.yaml", "contents": "kind: Telo.Application\n"},
				body{"relativePath": "lib/mod.yaml", "contents": "kind: Telo.Library\n"},
			},
		},
		"env":    body{},
		"config": body{"image": config.DefaultImage, "pullPolicy": "missing"},
	}
	for _, m := range muts {
		m(b)
	}
	return b
}

// walk returns the container holding the last element of a "/"-separated
// path, creating objects on the way, and that element's key.
func walk(b body, path string) (any, string) {
	parts := strings.Split(path, "/")
	var cur any = b
	for _, p := range parts[:len(parts)-1] {
		switch c := cur.(type) {
		case body:
			next, ok := c[p]
			if !ok {
				next = body{}
				c[p] = next
			}
			cur = next
		case []any:
			i, _ := strconv.Atoi(p)
			cur = c[i]
		}
	}
	return cur, parts[len(parts)-1]
}

// set sets the value at path ("bundle/files/0/relativePath").
func set(path string, v any) mutator {
	return func(b body) {
		switch c, k := walk(b, path); c := c.(type) {
		case body:
			c[k] = v
		case []any:
			i, _ := strconv.Atoi(k)
			c[i] = v
		}
	}
}

// del removes the key at path.
func del(path string) mutator {
	return func(b body) {
		if c, k := walk(b, path); c != nil {
			delete(c.(body), k)
		}
	}
}

// watchApps makes the body a watch session with the given apps.
func watchApps(apps ...body) mutator {
	return func(b body) {
		b["mode"] = "watch"
		items := make([]any, len(apps))
		for i, a := range apps {
			items[i] = a
		}
		b["apps"] = items
	}
}

// app is a SessionAppSpec with tcp ports.
func app(name string, ports ...int) body {
	ps := make([]any, len(ports))
	for i, p := range ports {
		ps[i] = body{"port": p, "protocol": "tcp"}
	}
	return body{"name": name, "entryRelativePath": "telo.yaml", "ports": ps}
}

// terms returns the header accepting terms version v.
func terms(v ...string) http.Header {
	return http.Header{"X-Telo-Accepted-Terms": v}
}

// firstSSE opens the event stream from the beginning and returns the first
// event's "event:" and "data:" values, then disconnects.
func (e *testEnv) firstSSE(t testing.TB, id string) (http.Header, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/v1/sessions/"+id+"/events?lastEventId=0", nil)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET events: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET events status = %d, want 200", res.StatusCode)
	}
	var event, data string
	buf := make([]byte, 0, 4096)
	chunk := make([]byte, 4096)
	for {
		n, err := res.Body.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if frame, _, ok := bytes.Cut(buf, []byte("\n\n")); ok {
			for line := range strings.SplitSeq(string(frame), "\n") {
				if v, ok := strings.CutPrefix(line, "event: "); ok {
					event = v
				}
				if v, ok := strings.CutPrefix(line, "data: "); ok {
					data = v
				}
			}
			return res.Header, event, data
		}
		if err != nil {
			t.Fatalf("read first SSE frame: %v (got %q)", err, buf)
		}
	}
}
