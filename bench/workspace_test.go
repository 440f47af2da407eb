package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// serverBin and kernelBin are the workspace-server and devkernel binaries
// TestMain builds.
var serverBin, kernelBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bench-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	serverBin = filepath.Join(dir, "workspace-server")
	// The module's tool directive pins the package to this repository's
	// workspace-proxy (replace => ../services/workspace-proxy).
	build := exec.Command("go", "build", "-o", serverBin, "github.com/telorunner/telorunner/services/workspace-proxy/cmd/workspace-server")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	// Named telo: Kubernetes watch app containers exec `telo` from PATH.
	kernelBin = filepath.Join(dir, "telo")
	buildKernel := exec.Command("go", "build", "-o", kernelBin, "github.com/telorunner/telorunner/tools/devkernel/cmd/devkernel")
	buildKernel.Stdout, buildKernel.Stderr = os.Stderr, os.Stderr
	code := 1
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build workspace-server:", err)
	} else if err := buildKernel.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build devkernel:", err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// startServer runs the workspace server over dir on a free loopback port
// until tb ends and returns its base URL.
func startServer(tb testing.TB, dir string) string {
	tb.Helper()
	port := freePort(tb)
	base := "http://127.0.0.1:" + port
	startProcess(tb, "workspace-server", serverBin, []string{"WORKSPACE_DIR=" + dir, "PORT=" + port, "WORKSPACE_BIND=127.0.0.1"}, base+"/healthz")
	return base
}

// meter counts the bytes of HTTP bodies, both ways.
type meter struct {
	next  http.RoundTripper
	bytes atomic.Int64
}

func (m *meter) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.ContentLength > 0 {
		m.bytes.Add(req.ContentLength)
	}
	resp, err := m.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &countingBody{ReadCloser: resp.Body, n: &m.bytes}
	return resp, nil
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// httpWorkspace is a checkpoint.Workspace over the workspace server's HTTP
// API (the proxy's wsclient is internal to its module).
type httpWorkspace struct {
	base string
	hc   *http.Client
}

func (w httpWorkspace) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := w.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d: %s", path, resp.StatusCode, body)
	}
	return body, nil
}

func (w httpWorkspace) Root(ctx context.Context) ([]byte, error) {
	return w.get(ctx, "/workspace/node")
}

func (w httpWorkspace) Node(ctx context.Context, hash string) ([]byte, error) {
	return w.get(ctx, "/workspace/node/"+hash)
}

func (w httpWorkspace) Blob(ctx context.Context, hash string) ([]byte, error) {
	data, err := w.get(ctx, "/workspace/blob/"+hash)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != hash {
		return nil, errors.New("blob does not match its hash")
	}
	return data, nil
}

// snapshot is the reference's checkpoint: GET /workspace/snapshot, every
// file base64. It returns the number of files.
func (w httpWorkspace) snapshot(ctx context.Context) (int, error) {
	body, err := w.get(ctx, "/workspace/snapshot")
	if err != nil {
		return 0, err
	}
	var s struct {
		Files []json.RawMessage `json:"files"`
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return 0, fmt.Errorf("decode snapshot: %w", err)
	}
	return len(s.Files), nil
}
