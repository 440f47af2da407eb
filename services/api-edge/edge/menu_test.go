package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/api-edge/internal/baseimage/hubtest"
)

const defaultImage = "telorun/node:latest-slim"

// startEdge runs edge.Run configured from vars against a fresh JetStream
// and returns its base URL once it serves.
func startEdge(t *testing.T, vars map[string]string) string {
	t.Helper()
	cfg, err := LoadConfig(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatalf("LoadConfig() = %v", err)
	}
	ns := testkit.StartJetStream(t)
	testkit.Provision(t, ns, bus.Limits{})
	nc, _ := testkit.Connect(t, ns, bus.RoleEdge)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, Deps{NC: nc, Logger: slog.New(slog.DiscardHandler), Listener: ln, EdgeID: "menu", Ready: func(net.Addr) { close(ready) }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run() = %v before serving", err)
	case <-time.After(30 * time.Second):
		t.Fatal("edge not serving within 30s")
	}
	return "http://" + ln.Addr().String()
}

// imageSchema returns the config schema's image property of /v1/capabilities.
func imageSchema(t *testing.T, url string) map[string]any {
	t.Helper()
	resp, err := http.Get(url + "/v1/capabilities")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var caps struct {
		Config struct {
			Schema struct {
				Properties map[string]map[string]any `json:"properties"`
			} `json:"schema"`
		} `json:"config"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/capabilities status = %d, want 200", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&caps); err != nil {
		t.Fatal(err)
	}
	return caps.Config.Schema.Properties["image"]
}

func enumOf(t *testing.T, url string) []string {
	t.Helper()
	img := imageSchema(t, url)
	raw, ok := img["enum"].([]any)
	if !ok {
		return nil
	}
	out := make([]string, len(raw))
	for i, v := range raw {
		out[i] = v.(string)
	}
	return out
}

// create posts a run (or watch) session asking for image and returns the
// status and the error body.
func create(t *testing.T, url, image, mode string) (int, map[string]string) {
	t.Helper()
	body := map[string]any{
		"bundle": map[string]any{"entryRelativePath": "telo.yaml", "files": []any{map[string]any{"relativePath": "telo.yaml", "contents": "kind: Telo.Application\n"}}},
		"env":    map[string]string{}, "config": map[string]any{"image": image, "pullPolicy": "missing"}, "mode": mode,
	}
	data, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/sessions", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := map[string]string{}
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

// The menu end to end over HTTP: fetched before the edge listens, the
// image enum of /v1/capabilities, the create allowlist (run and watch),
// a refresh that changes it, and a failing tag API keeping the last good
// list.
func TestBaseImageMenu(t *testing.T) {
	hub := hubtest.New(t)
	hub.SetTags("telorun/node", "latest", "0.31.0-rc.1", "0.30.1-slim", "sha-abcdef1", "0.30.1", "0.29.0")
	url := startEdge(t, map[string]string{
		"RUNNER_BASE_IMAGE_API_URL": hub.URL, "RUNNER_BASE_IMAGE_REFRESH_SECONDS": "1",
		"RUNNER_BASE_IMAGE_LIMIT": "2", "RUNNER_WATCH_SESSIONS": "true",
	})

	// Fetched at boot: the first answer already has the menu.
	first := []string{defaultImage, "telorun/node:0.30.1-slim", "telorun/node:0.30.1"}
	if got := enumOf(t, url); !reflect.DeepEqual(got, first) {
		t.Fatalf("image enum right after boot = %q, want %q", got, first)
	}
	if img := imageSchema(t, url); img["readOnly"] != nil || img["default"] != defaultImage {
		t.Errorf("image schema = %v, want default %q and no readOnly", img, defaultImage)
	}

	for _, mode := range []string{"run", "watch"} {
		if status, body := create(t, url, "telorun/node:0.30.1", mode); status != http.StatusCreated {
			t.Errorf("create %s with a menu image = %d %v, want 201", mode, status, body)
		}
		status, body := create(t, url, "telorun/node:0.29.0", mode) // beyond the limit
		if status != http.StatusBadRequest || body["error"] != "invalid_config" || !strings.Contains(body["message"], strings.Join(first, ", ")) {
			t.Errorf("create %s with an image off the menu = %d %v, want 400 invalid_config listing %q", mode, status, body, first)
		}
	}

	// A refresh that changes the menu.
	hub.SetTags("telorun/node", "0.32.0", "0.30.1")
	second := []string{defaultImage, "telorun/node:0.32.0", "telorun/node:0.30.1"}
	if !testkit.Poll(context.Background(), 15*time.Second, func() bool { return reflect.DeepEqual(enumOf(t, url), second) }) {
		t.Fatalf("image enum = %q 15s after the tags changed, want %q", enumOf(t, url), second)
	}
	if status, _ := create(t, url, "telorun/node:0.32.0", "run"); status != http.StatusCreated {
		t.Errorf("create with the new tag = %d, want 201", status)
	}
	if status, body := create(t, url, "telorun/node:0.30.1-slim", "run"); status != http.StatusBadRequest || body["error"] != "invalid_config" {
		t.Errorf("create with a tag that left the menu = %d %v, want 400 invalid_config", status, body)
	}

	// The tag API fails: refreshes happen and fail, the last good list stays.
	hub.Fail(true, 0)
	n := hub.Requests()
	if !testkit.Poll(context.Background(), 15*time.Second, func() bool { return hub.Requests() >= n+2 }) {
		t.Fatalf("no refresh reached the tag API in 15s (%d requests)", hub.Requests())
	}
	if got := enumOf(t, url); !reflect.DeepEqual(got, second) {
		t.Errorf("image enum after failed refreshes = %q, want the last good %q", got, second)
	}
	if status, _ := create(t, url, "telorun/node:0.32.0", "run"); status != http.StatusCreated {
		t.Errorf("create with a last-good image = %d, want 201", status)
	}
}

// A tag API down at boot: the edge still starts and offers the default
// image alone, as an enum.
func TestBaseImageMenuBootFailure(t *testing.T) {
	hub := hubtest.New(t)
	hub.Fail(true, 0)
	url := startEdge(t, map[string]string{"RUNNER_BASE_IMAGE_API_URL": hub.URL})
	if hub.Requests() == 0 {
		t.Error("the edge listened without asking the tag API first")
	}
	if got, want := enumOf(t, url), []string{defaultImage}; !reflect.DeepEqual(got, want) {
		t.Errorf("image enum = %q, want %q", got, want)
	}
	if status, _ := create(t, url, defaultImage, "run"); status != http.StatusCreated {
		t.Errorf("create with the default image = %d, want 201", status)
	}
	if status, body := create(t, url, "telorun/node:0.30.1", "run"); status != http.StatusBadRequest || body["error"] != "invalid_config" {
		t.Errorf("create off the menu = %d %v, want 400 invalid_config", status, body)
	}
}

// The catalog disabled: image readOnly, no enum, only the default accepted
// (11.12 last bullet), and no call to the tag API.
func TestBaseImageMenuDisabled(t *testing.T) {
	hub := hubtest.New(t)
	hub.SetTags("telorun/node", "0.30.1")
	url := startEdge(t, map[string]string{"RUNNER_BASE_IMAGE_API_URL": hub.URL, "RUNNER_BASE_IMAGE_CATALOG_ENABLED": "false"})
	img := imageSchema(t, url)
	if img["readOnly"] != true || img["enum"] != nil || img["default"] != defaultImage {
		t.Errorf("image schema = %v, want readOnly, no enum, default %q", img, defaultImage)
	}
	if status, _ := create(t, url, defaultImage, "run"); status != http.StatusCreated {
		t.Errorf("create with the default image = %d, want 201", status)
	}
	if status, body := create(t, url, "telorun/node:0.30.1", "watch"); status != http.StatusBadRequest || body["error"] != "invalid_config" || !strings.Contains(body["message"], defaultImage) {
		t.Errorf("create with another image = %d %v, want 400 invalid_config naming %s", status, body, defaultImage)
	}
	if n := hub.Requests(); n != 0 {
		t.Errorf("tag API requests = %d with the catalog disabled, want 0", n)
	}
}
