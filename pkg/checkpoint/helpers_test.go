package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/merkle"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// memWorkspace is a Workspace over a map, standing in for the workspace
// server (the slow external edge here; the proxy's tests use the real
// one). It builds its tree with merkle.Build, as the server does, and
// counts blob and node reads.
type memWorkspace struct {
	mu      sync.Mutex
	files   map[string][]byte
	hashes  map[string]string        // Path → hash.
	modes   map[string]uint32        // Path → permission bits (default 0o644).
	nodes   map[string][]byte        // Of the last Root.
	blobs   int                      // Blob calls answered.
	reads   int                      // Node calls answered.
	failOn  func(hash string) error  // When set, may fail a Blob call.
	corrupt func(data []byte) []byte // When set, rewrites Blob answers.
}

func newMemWorkspace(files map[string][]byte) *memWorkspace {
	w := &memWorkspace{files: map[string][]byte{}, hashes: map[string]string{}, modes: map[string]uint32{}}
	for p, b := range files {
		w.set(p, b)
	}
	return w
}

func (w *memWorkspace) Root(context.Context) ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var flat []merkle.File
	for _, p := range slices.Sorted(maps.Keys(w.files)) {
		mode := w.modes[p]
		if mode == 0 {
			mode = 0o644
		}
		flat = append(flat, merkle.File{Path: p, Hash: w.hashes[p], Size: int64(len(w.files[p])), Mode: mode})
	}
	b, err := merkle.Build(flat)
	if err != nil {
		return nil, err
	}
	w.nodes = b.Nodes
	return b.Nodes[b.Root], nil
}

func (w *memWorkspace) Node(_ context.Context, hash string) ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	data, ok := w.nodes[hash]
	if !ok {
		return nil, errors.New("file_not_found")
	}
	w.reads++
	return data, nil
}

func (w *memWorkspace) chmod(path string, mode uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.modes[path] = mode
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
	delete(w.modes, path)
}

func (w *memWorkspace) nodeReads() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reads
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

// take takes a checkpoint and loads it back whole (Take returns no file
// map).
func take(t *testing.T, s *Store, id string, ws Workspace) (Manifest, Stats) {
	t.Helper()
	m, st, err := s.Take(t.Context(), id, ws)
	if err != nil {
		t.Fatalf("Take() = %v", err)
	}
	loaded, ok, err := s.Load(t.Context(), id)
	if err != nil || !ok || loaded.ID != m.ID || loaded.Root != m.Root {
		t.Fatalf("Load() after Take() = %s (root %s), %v, %v; want %s (root %s)", loaded.ID, loaded.Root, ok, err, m.ID, m.Root)
	}
	return loaded, st
}

// putFlat stores files as the session's latest checkpoint in the format
// written before trees: the file map inline in the value, or (outOfLine)
// in a manifests/<hash> object the value names. It returns the record.
func putFlat(t *testing.T, s *Store, id string, files map[string]Entry, outOfLine bool) record {
	t.Helper()
	r := record{TakenAt: time.Now().UTC().Truncate(time.Millisecond), Count: len(files), Files: files, ID: "1", Reason: ReasonPeriodic, Seq: 1}
	for _, e := range files {
		r.Bytes += e.Size
	}
	if outOfLine {
		enc, err := json.Marshal(files)
		if err != nil {
			t.Fatal(err)
		}
		r.Files, r.Manifest = nil, manifestPrefix+hashOf(enc)
		if _, err := s.blobs.PutBytes(t.Context(), r.Manifest, enc); err != nil {
			t.Fatal(err)
		}
	}
	r.History = []Checkpoint{{ID: "1", TakenAt: r.TakenAt, Reason: r.Reason, Files: r.Count, Bytes: r.Bytes, Slot: 1}}
	value, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.kv.Put(t.Context(), id, value); err != nil {
		t.Fatal(err)
	}
	if err := putSlot(t.Context(), s.kv, id, 1, r); err != nil {
		t.Fatal(err)
	}
	return r
}

// putBlobs stores files' contents as blobs and returns their flat entries.
func putBlobs(t *testing.T, s *Store, files map[string][]byte) map[string]Entry {
	t.Helper()
	entries := map[string]Entry{}
	for p, b := range files {
		h := hashOf(b)
		if _, err := s.ensureObject(t.Context(), bus.BlobKey(h), b); err != nil {
			t.Fatal(err)
		}
		entries[p] = Entry{Hash: h, Size: int64(len(b))}
	}
	return entries
}
