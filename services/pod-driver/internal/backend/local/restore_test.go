package local

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
)

// A restore (resume after a crash whose workspace directory is not
// intact, e.g. its seed never finished) seeds on top of the workspace
// directory a lost workload left on this machine: content it already
// holds at the right path is not fetched, what the checkpoint lacks goes,
// and the kernels start on exactly the checkpoint's tree.
func TestRestoreReusesALeftoverWorkspace(t *testing.T) {
	b := newWatchBackend(t, nil)
	spec := webWorker(0)
	id := spec.SessionID
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	files := map[string][]byte{
		"web/telo.yaml":       []byte(manifest("web", nil)),
		"worker/telo.yaml":    []byte(manifest("worker", nil)),
		"data/big.bin":        big,
		"data/new.txt":        []byte("only in the checkpoint\n"),
		kernelwire.MarkerPath: []byte(kernelwire.MarkerContent),
	}
	// What a driver that died mid-seed left: no marker, a stale file.
	dir := filepath.Join(b.root, id)
	for p, c := range map[string][]byte{
		"workspace/web/telo.yaml":    files["web/telo.yaml"],
		"workspace/worker/telo.yaml": files["worker/telo.yaml"],
		"workspace/data/big.bin":     big,
		"workspace/notes/stale.txt":  []byte("not in the checkpoint\n"),
		driverFileName:               []byte("driver-a\n"),
	} {
		path := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, c, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if b.WorkspaceIntact(id, "driver-a") {
		t.Fatal("WorkspaceIntact of a directory without the marker = true")
	}
	byHash := map[string][]byte{}
	r := &backend.Restore{}
	for p, c := range files {
		sum := sha256.Sum256(c)
		h := hex.EncodeToString(sum[:])
		byHash[h] = c
		r.Files = append(r.Files, backend.RestoreFile{Path: p, Hash: h, Size: int64(len(c))})
	}
	var mu sync.Mutex
	var fetched []string
	r.Fetch = func(_ context.Context, hash string) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		c, ok := byHash[hash]
		if !ok {
			return nil, errors.New("no such blob")
		}
		fetched = append(fetched, string(c))
		return c, nil
	}
	spec.Bundle = contract.Bundle{EntryRelativePath: "web/telo.yaml"}
	spec.Restore = r
	rec := newRecorder()
	w := startWatch(t, b, spec, rec)
	rec.waitEvents(t, "web", "Kernel.Started", 1)
	rec.waitEvents(t, "worker", "Kernel.Started", 1)
	mu.Lock()
	got := slices.Sorted(slices.Values(fetched))
	mu.Unlock()
	if want := []string{kernelwire.MarkerContent, "only in the checkpoint\n"}; !slices.Equal(got, want) {
		t.Errorf("fetched %q, want only %q (the rest was in the directory)", got, want)
	}
	paths := treePaths(t, rec.wsURL(t))
	if want := slices.Sorted(func(yield func(string) bool) {
		for p := range files {
			if !yield(p) {
				return
			}
		}
	}); !slices.Equal(paths, want) {
		t.Errorf("tree = %v, want %v", paths, want)
	}
	for p, c := range files {
		if data, err := os.ReadFile(filepath.Join(dir, workspaceDirName, filepath.FromSlash(p))); err != nil || !bytes.Equal(data, c) {
			t.Errorf("%s: %d bytes (%v), want %d identical bytes", p, len(data), err, len(c))
		}
	}
	stop(t, w)
}
