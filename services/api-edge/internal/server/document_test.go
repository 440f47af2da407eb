package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// TestGetSession checks the session document of 4.6.
func TestGetSession(t *testing.T) {
	e := newEnv(t, withVars(mainVars, "RUNNER_TERMS_BODY", ""))

	res := e.do(t, http.MethodPost, "/v1/sessions", validCreate(set("ports", []any{body{"port": 3000, "protocol": "tcp"}})), nil)
	id := res.created(t)
	createdAt := res.object(t)["createdAt"]
	got := e.do(t, http.MethodGet, "/v1/sessions/"+id, nil, nil)
	if got.status != http.StatusOK {
		t.Fatalf("GET status = %d, want 200", got.status)
	}
	want := map[string]any{
		"sessionId": id,
		"status":    map[string]any{"kind": "starting"},
		"mode":      "run",
		"apps":      []any{map[string]any{"name": "app", "io": "tty", "generation": float64(0), "ports": []any{map[string]any{"port": float64(3000), "protocol": "tcp"}}}},
		"createdAt": createdAt,
	}
	if doc := got.object(t); !reflect.DeepEqual(doc, want) {
		t.Errorf("GET /v1/sessions/%s = %v, want %v", id, doc, want)
	}

	// A watch session with a kept agent and an app without ports.
	id = e.do(t, http.MethodPost, "/v1/sessions", validCreate(watchApps(app("web"), app("api", 4000)), set("agent", "helper")), nil).created(t)
	doc := e.do(t, http.MethodGet, "/v1/sessions/"+id, nil, nil).object(t)
	wantApps := []any{
		map[string]any{"name": "web", "io": "tty", "generation": float64(0), "ports": []any{}},
		map[string]any{"name": "api", "io": "tty", "generation": float64(0), "ports": []any{map[string]any{"port": float64(4000), "protocol": "tcp"}}},
	}
	if doc["mode"] != "watch" || doc["agent"] != "helper" || !reflect.DeepEqual(doc["apps"], wantApps) {
		t.Errorf("watch document = %v, want mode watch, agent helper, apps %v", doc, wantApps)
	}
	if _, present := doc["exitedAt"]; present {
		t.Errorf("exitedAt present on a live session: %v", doc)
	}

	// Once terminal, exitedAt appears in the contract's timestamp form.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.store.SetStatus(ctx, id, contract.Status{Kind: contract.StatusStopped}, nil); err != nil {
		t.Fatalf("SetStatus(stopped) error = %v", err)
	}
	doc = e.do(t, http.MethodGet, "/v1/sessions/"+id, nil, nil).object(t)
	if got, want := doc["status"], (map[string]any{"kind": "stopped"}); !reflect.DeepEqual(got, want) {
		t.Errorf("status = %v, want %v", got, want)
	}
	exitedAt, _ := doc["exitedAt"].(string)
	if _, err := time.Parse("2006-01-02T15:04:05.000Z", exitedAt); err != nil || len(exitedAt) != 24 {
		t.Errorf("exitedAt = %q, want the 2006-01-02T15:04:05.000Z form", exitedAt)
	}
}

func TestGetSessionNotFound(t *testing.T) {
	e := newEnv(t, nil)
	for _, id := range []string{
		"abcdefghijkl",  // well formed, absent
		"ABCDEFGHIJKL",  // upper case
		"abcdefghijk",   // 11
		"abcdefghijklm", // 13
		"abcdefghijk1",  // 1 is not base32
		"abcdefghijk8",
		"abc-efghijkl",
		"%2e%2e",
		"a%20b",
	} {
		t.Run(id, func(t *testing.T) {
			res := e.do(t, http.MethodGet, "/v1/sessions/"+id, nil, nil)
			if res.status != http.StatusNotFound {
				t.Fatalf("GET /v1/sessions/%s status = %d, want 404", id, res.status)
			}
			code, msg := res.envelope(t)
			if code != "not_found" {
				t.Errorf("error = %q, want not_found", code)
			}
			if id == "abcdefghijkl" || id == "ABCDEFGHIJKL" {
				if want := "session '" + id + "' not in registry"; msg != want {
					t.Errorf("message = %q, want %q", msg, want)
				}
			}
		})
	}
}

// TestAdmissionAcrossReplicas fires concurrent creates at two edges over
// one bus: the registry ceiling holds exactly (5.4).
func TestAdmissionAcrossReplicas(t *testing.T) {
	const maxSessions, requests = 5, 20
	ns := testkit.StartJetStream(t)
	cfg := loadConfig(t, map[string]string{"RUNNER_MAX_SESSIONS": fmt.Sprint(maxSessions)})
	edges := []*testEnv{newEdge(t, ns, cfg, "a"), newEdge(t, ns, cfg, "b")}

	type result struct {
		status int
		code   string
		err    error
	}
	payload := mustJSON(t, validCreate())
	results := make([]result, requests)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, edges[i%2].url+"/v1/sessions", strings.NewReader(payload))
			if err != nil {
				results[i].err = err
				return
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				results[i].err = err
				return
			}
			defer res.Body.Close()
			var env struct {
				Error string `json:"error"`
			}
			results[i].status = res.StatusCode
			results[i].err = json.NewDecoder(res.Body).Decode(&env)
			results[i].code = env.Error
		})
	}
	close(start)
	wg.Wait()

	created, refused := 0, 0
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("request %d: %v", i, r.err)
		case r.status == http.StatusCreated:
			created++
		case r.status == http.StatusConflict && r.code == "too_many_sessions":
			refused++
		default:
			t.Errorf("request %d = %d %q, want 201 or 409 too_many_sessions", i, r.status, r.code)
		}
	}
	if created != maxSessions || refused != requests-maxSessions {
		t.Errorf("created, refused = %d, %d, want %d, %d", created, refused, maxSessions, requests-maxSessions)
	}
	if got := edges[0].admitted(t); got != maxSessions {
		t.Errorf("admitted slots = %d, want %d", got, maxSessions)
	}
	// Every admitted slot has its record, and no record lost its slot.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := edges[0].store.SessionIDs(ctx)
	if err != nil {
		t.Fatalf("list records: %v", err)
	}
	if len(keys) != maxSessions {
		t.Errorf("session records = %d, want %d", len(keys), maxSessions)
	}
}
