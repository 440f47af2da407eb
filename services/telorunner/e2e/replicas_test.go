package e2e

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/api-edge/edge"
)

// startEdge runs a second api-edge replica against the runner's NATS.
func startEdge(t *testing.T, r *runner, vars map[string]string) string {
	t.Helper()
	cfg, err := edge.LoadConfig(env(vars))
	if err != nil {
		t.Fatal(err)
	}
	cfg.BaseImages.Enabled = false // the local backend runs no base images (as the all-in-one)
	nc := r.connect(t, bus.RoleEdge)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- edge.Run(ctx, cfg, edge.Deps{NC: nc, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Listener: ln, EdgeID: "edge-b"})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("edge Run() = %v", err)
		}
		nc.Close()
	})
	url := "http://" + ln.Addr().String()
	if !testkit.Poll(context.Background(), 10*time.Second, func() bool {
		var resp *http.Response
		if resp, err = http.Get(url + "/v1/health"); err == nil {
			resp.Body.Close()
		}
		return err == nil
	}) {
		t.Fatalf("second edge not serving /v1/health within 10s: %v", err)
	}
	return url
}

// A session created on one edge is streamed (SSE and io) from another with
// identical event ids and io sequence numbers.
func TestTwoEdgeReplicasServeOneSession(t *testing.T) {
	r := startRunner(t, nil)
	other := startEdge(t, r, nil)
	c := r.create(t, runBody(manifest("shared", nil, map[string]any{"exitAfterMs": 500, "outputBytes": 100000}), nil, false))
	a := openSSE(t, r.URL+c.StreamURL, nil).drain(t, 30*time.Second)
	b := openSSE(t, other+c.StreamURL, nil).drain(t, 30*time.Second)
	if summarize(a) != summarize(b) || len(a) < 3 {
		t.Fatalf("edge A events %s\nedge B events %s", summarize(a), summarize(b))
	}
	_, _, fa := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io", nil).closeCode(t, 20*time.Second)
	_, _, fb := openIO(t, wsURL(other)+"/v1/sessions/"+c.SessionID+"/io", nil).closeCode(t, 20*time.Second)
	if len(fa) != len(fb) || len(fa) < 3 {
		t.Fatalf("io frames: A %d, B %d", len(fa), len(fb))
	}
	for i := range fa {
		if fa[i].Seq != fb[i].Seq || string(fa[i].Payload) != string(fb[i].Payload) || fa[i].Text != fb[i].Text {
			t.Fatalf("io frame %d differs: A seq %d, B seq %d", i, fa[i].Seq, fb[i].Seq)
		}
	}
	// Live streaming across replicas: a session created on B, followed on A.
	c2 := createOn(t, other, runBody(manifest("live", nil, nil), nil, true))
	s := openSSE(t, r.URL+c2.StreamURL, nil)
	s.until(t, 30*time.Second, isStatus("running"))
	if resp := do(t, "DELETE", other+"/v1/sessions/"+c2.SessionID, nil, nil); resp.Status != 204 {
		t.Fatalf("DELETE via B = %d", resp.Status)
	}
	s.until(t, 30*time.Second, isStatus("stopped"))
}

func createOn(t *testing.T, base string, body any) createdResp {
	t.Helper()
	resp := do(t, "POST", base+"/v1/sessions", body, nil)
	if resp.Status != 201 {
		t.Fatalf("create = %d %s", resp.Status, resp.Body)
	}
	var c createdResp
	resp.json(t, &c)
	return c
}

// Starting the all-in-one twice on one data dir keeps streams, buckets and
// sessions: nothing is recreated destructively.
func TestRestartSameDataDirKeepsState(t *testing.T) {
	dir := t.TempDir()
	vars := map[string]string{"RUNNER_DATA_DIR": dir, "RUNNER_MAX_SESSIONS": "7", "RUNNER_REPLAY_BUFFER_BYTES": "123456"}
	r := startRunner(t, vars)
	c := r.create(t, runBody(manifest("persist", nil, map[string]any{"exitAfterMs": 100}), nil, false))
	before := openSSE(t, r.URL+c.StreamURL, nil).drain(t, 30*time.Second)
	r.stop()

	r2 := startRunner(t, vars)
	after := openSSE(t, r2.URL+c.StreamURL, nil).drain(t, 30*time.Second)
	if summarize(before) != summarize(after) {
		t.Fatalf("events after restart %s, want %s", summarize(after), summarize(before))
	}
	resp := do(t, "GET", r2.URL+"/v1/sessions/"+c.SessionID, nil, nil)
	if resp.Status != 200 || !strings.Contains(string(resp.Body), `"kind":"exited"`) {
		t.Fatalf("session after restart = %d %s", resp.Status, resp.Body)
	}
	// Every stream, bucket and object store exists with the configured limits.
	// The provisioner may read what it configured.
	js, _ := jetstream.New(r2.connect(t, bus.RoleProvisioner))
	ctx := context.Background()
	want := bus.Limits{ReplayBytes: 123456}.Defaults()
	for _, cfg := range bus.StreamConfigs(want) {
		s, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatalf("stream %s: %v", cfg.Name, err)
		}
		got := s.CachedInfo().Config
		if cfg.MaxMsgsPerSubject == 0 {
			cfg.MaxMsgsPerSubject = -1 // unlimited, as the server reports it
		}
		if got.Retention != cfg.Retention || got.MaxMsgsPerSubject != cfg.MaxMsgsPerSubject || got.MaxAge != cfg.MaxAge || got.Storage != jetstream.FileStorage {
			t.Errorf("stream %s config = %+v, want limits of %+v", cfg.Name, got, cfg)
		}
	}
	for _, cfg := range bus.BucketConfigs(want) {
		kv, err := js.KeyValue(ctx, cfg.Bucket)
		if err != nil {
			t.Fatalf("bucket %s: %v", cfg.Bucket, err)
		}
		st, _ := kv.Status(ctx)
		if st.TTL() != cfg.TTL || st.History() != 1 {
			t.Errorf("bucket %s ttl %v history %d, want %v 1", cfg.Bucket, st.TTL(), st.History(), cfg.TTL)
		}
	}
	for _, cfg := range bus.ObjectConfigs(want) {
		if _, err := js.ObjectStore(ctx, cfg.Bucket); err != nil {
			t.Errorf("object store %s: %v", cfg.Bucket, err)
		}
	}
	if _, err := js.Consumer(ctx, bus.StreamCmd, bus.ConsumerDrivers); err != nil {
		t.Errorf("drivers consumer: %v", err)
	}
}
