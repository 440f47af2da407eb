package proxy

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/pkg/wsapi"
	"github.com/telorunner/telorunner/services/workspace-proxy/internal/wsserver"
)

// natsPutLeak ignores a goroutine nats.go v1.55.0 itself leaks now and then
// in ObjectStore.Put: the reconnect listener it starts reads its status
// channel after Put's cleanup has set it to nil, and blocks forever.
var natsPutLeak = goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect")

// newProxy returns a proxy over a fresh, provisioned in-process JetStream.
func newProxy(t *testing.T) *proxy {
	t.Helper()
	srv := testkit.StartJetStream(t)
	testkit.Provision(t, srv, bus.Limits{})
	_, js := testkit.Connect(t, srv, bus.RoleProxy)
	store, err := session.Open(t.Context(), js, 0)
	if err != nil {
		t.Fatalf("session.Open() = %v", err)
	}
	ckpt, err := newCheckpointStore(t.Context(), js, 0)
	if err != nil {
		t.Fatalf("newCheckpointStore() = %v", err)
	}
	return &proxy{store: store, ckpt: ckpt}
}

// restoreLatest writes every file of the session's latest checkpoint into
// the workspace c (the restore of a resume, which the driver does while
// seeding; here it checks what a checkpoint holds). No checkpoint answers
// no_checkpoint.
func restoreLatest(ctx context.Context, p *proxy, c *wsapi.Client, sessionID string) (any, error) {
	return restore(ctx, p.ckpt, c, sessionID, restoreBatch)
}

func restore(ctx context.Context, st *checkpoint.Store, c *wsapi.Client, sessionID string, lim batchLimits) (restoreResult, error) {
	m, ok, err := st.Load(ctx, sessionID)
	if err != nil {
		return restoreResult{}, storeErr("restore", sessionID, err)
	}
	if !ok {
		return restoreResult{}, contract.Errorf("no_checkpoint", "session '%s' has no checkpoint", sessionID)
	}
	return applyTree(ctx, st, c, sessionID, m, nil, lim)
}

// applyCounter records the change sets a workspace server receives.
type applyCounter struct {
	mu   sync.Mutex
	n    int
	sets []appliedSet
}

// appliedSet is one change set: how many writes, and their decoded bytes.
type appliedSet struct {
	writes int
	bytes  int
}

// serveWorkspace runs a real workspace server over dir and returns a
// client for it.
func serveWorkspace(t *testing.T, dir string, applies *applyCounter) *wsapi.Client {
	t.Helper()
	srv, err := wsserver.New(wsserver.Options{Dir: dir})
	if err != nil {
		t.Fatalf("wsserver.New() = %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	h := http.Handler(srv)
	if applies != nil {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/workspace" {
				body, _ := io.ReadAll(r.Body)
				var cs wsapi.ChangeSet
				_ = json.Unmarshal(body, &cs) // The server judges the body itself.
				set := appliedSet{writes: len(cs.Write)}
				for _, w := range cs.Write {
					b, _ := base64.StdEncoding.DecodeString(w.Content)
					set.bytes += len(b)
				}
				applies.mu.Lock()
				applies.n++
				applies.sets = append(applies.sets, set)
				applies.mu.Unlock()
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
			srv.ServeHTTP(w, r)
		})
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return wsapi.New(ts.URL, ts.Client())
}

// writeTree writes files under dir.
func writeTree(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for p, b := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func sampleFiles() map[string][]byte {
	binary := make([]byte, 200_000)
	for i := range binary {
		binary[i] = byte(i*31 + i/256)
	}
	files := map[string][]byte{
		"telo.yaml":           []byte("kind: Application\nname: demo\n"),
		"telo-workspace.yaml": []byte("kind: Workspace\n"),
		"assets/blob.bin":     binary,
		"assets/copy.bin":     binary,
		"empty.txt":           {},
		"a/b/c/deep.yaml":     []byte("deep: true\n"),
		"dist/out.js":         []byte("console.log(1)\n"), // dist is not excluded.
	}
	for i := range 40 {
		files[fmt.Sprintf("src/mod-%02d.yaml", i)] = bytes.Repeat([]byte(fmt.Sprintf("line %d\n", i)), 200+i*10)
	}
	return files
}

func TestCheckpointRestoreRoundTrip(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, natsPutLeak) }) // Runs after every other cleanup.
	p := newProxy(t)
	ctx := t.Context()
	id := contract.NewSessionID()

	src := t.TempDir()
	files := sampleFiles()
	writeTree(t, src, files)
	writeTree(t, src, map[string][]byte{"node_modules/dep/index.js": []byte("excluded")})
	live := serveWorkspace(t, src, nil)

	res, err := p.checkpointOp(ctx, live, id, nil)
	if err != nil {
		t.Fatalf("checkpointOp() = %v", err)
	}
	cr := res.(checkpointResult)
	if cr.Files != len(files) || cr.Uploaded != len(files)-1 || cr.TakenAt.IsZero() {
		t.Fatalf("checkpointOp() = %+v, want %d files and %d uploads (two share content)", cr, len(files), len(files)-1)
	}
	res, err = p.checkpointOp(ctx, live, id, nil)
	if err != nil {
		t.Fatalf("checkpointOp() unchanged = %v", err)
	}
	if cr = res.(checkpointResult); cr.Uploaded != 0 || cr.BytesUploaded != 0 || cr.Changed != 0 || cr.Files != len(files) {
		t.Fatalf("checkpointOp() unchanged = %+v, want nothing uploaded", cr)
	}

	dst := t.TempDir()
	applies := &applyCounter{}
	fresh := serveWorkspace(t, dst, applies)
	res, err = restoreLatest(ctx, p, fresh, id)
	if err != nil {
		t.Fatalf("restoreOp() = %v", err)
	}
	if rr := res.(restoreResult); rr.Files != len(files) || rr.Batches != applies.n || !rr.TakenAt.Equal(cr.TakenAt) {
		t.Fatalf("restoreOp() = %+v, want %d files in %d batches", rr, len(files), applies.n)
	}

	want, err := live.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fresh.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Files, want.Files) {
		t.Fatalf("restored tree = %v\nwant %v", got.Files, want.Files)
	}
	for p, b := range files {
		if disk, err := os.ReadFile(filepath.Join(dst, filepath.FromSlash(p))); err != nil || !bytes.Equal(disk, b) {
			t.Fatalf("restored %s = %d bytes, %v; want %d identical bytes", p, len(disk), err, len(b))
		}
	}
}

func TestRestoreBatches(t *testing.T) {
	p := newProxy(t)
	ctx := t.Context()
	id := contract.NewSessionID()
	src := t.TempDir()
	files := sampleFiles()
	writeTree(t, src, files)
	if _, err := p.checkpointOp(ctx, serveWorkspace(t, src, nil), id, nil); err != nil {
		t.Fatalf("checkpointOp() = %v", err)
	}
	st := p.ckpt
	tests := []struct {
		name        string
		lim         batchLimits
		wantBatches int // 0: more than one.
	}{
		{"one set", batchLimits{files: 1000, bytes: 1 << 30}, 1},
		{"by count", batchLimits{files: 10, bytes: 1 << 30}, (len(files) + 9) / 10},
		{"by bytes", batchLimits{files: 1000, bytes: 50_000}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			applies := &applyCounter{}
			res, err := restore(ctx, st, serveWorkspace(t, t.TempDir(), applies), id, tt.lim)
			if err != nil {
				t.Fatalf("restore() = %v", err)
			}
			if res.Files != len(files) || res.Batches != applies.n {
				t.Fatalf("restore() = %+v, server saw %d change sets", res, applies.n)
			}
			if tt.wantBatches > 0 && applies.n != tt.wantBatches || tt.wantBatches == 0 && applies.n < 2 {
				t.Fatalf("change sets = %d, want %d", applies.n, tt.wantBatches)
			}
			for _, set := range applies.sets {
				// A file over the byte bound goes in a set of its own.
				if set.writes > tt.lim.files || set.writes > 1 && int64(set.bytes) > tt.lim.bytes {
					t.Fatalf("change sets = %+v, want each within %+v", applies.sets, tt.lim)
				}
			}
		})
	}
}

func TestRestoreWithoutCheckpoint(t *testing.T) {
	p := newProxy(t)
	_, err := restoreLatest(t.Context(), p, serveWorkspace(t, t.TempDir(), nil), contract.NewSessionID())
	var ce *contract.Error
	if !errors.As(err, &ce) || ce.Code != "no_checkpoint" {
		t.Fatalf("restoreOp() = %v, want no_checkpoint", err)
	}
}

// A workspace that fails part-way keeps the previous checkpoint and the
// failure keeps the workspace server's own error for mapErr.
func TestCheckpointWorkspaceFailure(t *testing.T) {
	p := newProxy(t)
	ctx := t.Context()
	id := contract.NewSessionID()
	dir := t.TempDir()
	writeTree(t, dir, map[string][]byte{"a.yaml": []byte("a")})
	c := serveWorkspace(t, dir, nil)
	if _, err := p.checkpointOp(ctx, c, id, nil); err != nil {
		t.Fatalf("checkpointOp() = %v", err)
	}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	}))
	defer down.Close()
	_, err := p.checkpointOp(ctx, wsapi.New(down.URL, down.Client()), id, nil)
	var we *wsapi.Error
	if !errors.As(err, &we) || we.Status != http.StatusBadGateway {
		t.Fatalf("checkpointOp() against a failing workspace = %v, want its 502", err)
	}
	if ce := mapErr(err).(*contract.Error); ce.Code != "workspace_error" {
		t.Fatalf("mapErr() = %v, want workspace_error", ce)
	}
	applies := &applyCounter{}
	if _, err := restoreLatest(ctx, p, serveWorkspace(t, t.TempDir(), applies), id); err != nil || applies.n != 1 {
		t.Fatalf("restoreOp() = %v after %d change sets; want the previous checkpoint restored", err, applies.n)
	}
}
