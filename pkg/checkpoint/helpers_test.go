package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// memWorkspace is a Workspace over a map, standing in for the workspace
// server (the slow external edge here). It counts blob reads.
type memWorkspace struct {
	mu      sync.Mutex
	files   map[string][]byte
	hashes  map[string]string        // Path → hash.
	blobs   int                      // Blob calls answered.
	failOn  func(hash string) error  // When set, may fail a Blob call.
	corrupt func(data []byte) []byte // When set, rewrites Blob answers.
}

func newMemWorkspace(files map[string][]byte) *memWorkspace {
	w := &memWorkspace{files: map[string][]byte{}, hashes: map[string]string{}}
	for p, b := range files {
		w.set(p, b)
	}
	return w
}

func (w *memWorkspace) Tree(context.Context) ([]File, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []File
	for _, p := range slices.Sorted(maps.Keys(w.files)) {
		out = append(out, File{Path: p, Hash: w.hashes[p]})
	}
	return out, nil
}

func (w *memWorkspace) Blob(_ context.Context, hash string) ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failOn != nil {
		if err := w.failOn(hash); err != nil {
			return nil, err
		}
	}
	for p, h := range w.hashes {
		if h == hash {
			w.blobs++
			data := slices.Clone(w.files[p])
			if w.corrupt != nil {
				return w.corrupt(data), nil
			}
			return data, nil
		}
	}
	return nil, errors.New("file_not_found")
}

func (w *memWorkspace) set(path string, data []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.files[path] = data
	w.hashes[path] = hashOf(data)
}

func (w *memWorkspace) remove(path string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.files, path)
	delete(w.hashes, path)
}

func (w *memWorkspace) blobCalls() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.blobs
}

func hashOf(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// env is a provisioned in-process JetStream.
type env struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func newEnv(t *testing.T) env {
	t.Helper()
	srv := testkit.StartJetStream(t)
	testkit.Provision(t, srv, bus.Limits{})
	nc, js := testkit.Connect(t, srv, bus.RoleProxy)
	return env{nc: nc, js: js}
}

func (e env) store(t *testing.T, opts Options) *Store {
	t.Helper()
	s, err := NewStore(t.Context(), e.js, opts)
	if err != nil {
		t.Fatalf("NewStore() = %v", err)
	}
	return s
}

// sourceFiles returns n distinct text files of 1–8 KiB under nested dirs.
func sourceFiles(n int) map[string][]byte {
	files := make(map[string][]byte, n)
	for i := range n {
		p := fmt.Sprintf("pkg%02d/src/module-%04d.yaml", i%20, i)
		size := 1024 + (i*977)%(7*1024)
		b := make([]byte, size)
		line := fmt.Sprintf("kind: Thing\nname: thing-%d\n", i)
		for j := range b {
			b[j] = line[j%len(line)]
		}
		files[p] = b
	}
	return files
}

// restored collects Files(m) into a map.
func restored(t *testing.T, s *Store, m Manifest) map[string][]byte {
	t.Helper()
	got := map[string][]byte{}
	for f, err := range s.Files(t.Context(), m) {
		if err != nil {
			t.Fatalf("Files() = %v", err)
		}
		if _, dup := got[f.Path]; dup {
			t.Fatalf("Files() yielded %q twice", f.Path)
		}
		got[f.Path] = f.Content
	}
	return got
}

func sumSizes(files map[string][]byte) (total int64) {
	for _, b := range files {
		total += int64(len(b))
	}
	return total
}

func newID() string { return contract.NewSessionID() }

// kv is the checkpoints bucket.
func (e env) kv(t *testing.T) jetstream.KeyValue {
	t.Helper()
	kv, err := e.js.KeyValue(t.Context(), bus.BucketCheckpoints)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// keys lists every key of the checkpoints bucket.
func (e env) keys(t *testing.T) []string {
	t.Helper()
	l, err := e.kv(t).ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	return keys
}
