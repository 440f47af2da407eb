package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/merkle"
)

func TestTakeMovesOnlyChanges(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	ctx := t.Context()
	files := sourceFiles(1000)
	ws := newMemWorkspace(files)
	id := newID()

	// 20 directories pkgNN, each with src/: 41 tree nodes.
	m, st := take(t, s, id, ws)
	want := Stats{Files: 1000, Changed: 1000, Uploaded: 1000, BytesUploaded: sumSizes(files), BytesTotal: sumSizes(files),
		NodesRead: 41, NodesStored: 41}
	if st != want {
		t.Fatalf("first Take() stats = %+v, want %+v", st, want)
	}
	if len(m.Files) != 1000 || ws.blobCalls() != 1000 || len(objectNames(t, s)) != 1041 {
		t.Fatalf("first Take() = %d files, %d blob reads, %d objects; want 1000, 1000, 1041", len(m.Files), ws.blobCalls(), len(objectNames(t, s)))
	}

	// One changed file: the blob and the three nodes on its path (root,
	// pkg07, pkg07/src) are read and written, nothing else.
	changed := "pkg07/src/module-0007.yaml"
	content := []byte("kind: Thing\nname: edited\n")
	ws.set(changed, content)
	before := objectNames(t, s)
	reads := ws.nodeReads()
	m2, st := take(t, s, id, ws)
	if st.Uploaded != 1 || st.BytesUploaded != int64(len(content)) || st.Changed != 1 || st.Files != 1000 ||
		st.NodesRead != 3 || st.NodesStored != 3 {
		t.Fatalf("second Take() stats = %+v, want 1 upload of %d bytes, 1 changed, 3 nodes read and stored", st, len(content))
	}
	if got := ws.blobCalls(); got != 1001 {
		t.Fatalf("blob reads after second Take() = %d, want 1001", got)
	}
	if got := ws.nodeReads() - reads; got != 2 {
		t.Fatalf("node reads below the root in the second Take() = %d, want 2 (pkg07, pkg07/src)", got)
	}
	added := newNames(before, objectNames(t, s))
	wantAdded := []string{bus.BlobKey(hashOf(content)), bus.TreeKey(m2.Root)}
	if len(added) != 4 || !slices.Contains(added, wantAdded[0]) || !slices.Contains(added, wantAdded[1]) {
		t.Fatalf("objects written by the second Take() = %v, want 4: the blob, the root and the 2 nodes on the path", added)
	}
	if got := m2.Files[changed]; got.Hash != hashOf(content) || got.Size != int64(len(content)) || got.Mode != 0o644 {
		t.Fatalf("manifest[%s] = %+v, want the new content, mode 0644", changed, got)
	}

	gone := "pkg03/src/module-0003.yaml"
	ws.remove(gone)
	m3, st := take(t, s, id, ws)
	if _, ok := m3.Files[gone]; ok || st.Removed != 1 || st.Uploaded != 0 || st.Files != 999 || len(m3.Files) != 999 {
		t.Fatalf("after delete: %s in manifest = %v, stats = %+v; want dropped, 1 removed, no upload", gone, ok, st)
	}

	before = objectNames(t, s)
	unchanged, st, err := s.Take(ctx, id, ws)
	if err != nil || st.Uploaded != 0 || st.Changed != 0 || st.BytesUploaded != 0 || st.NodesRead != 1 || st.NodesStored != 0 {
		t.Fatalf("unchanged Take() = %+v, %v; want nothing moved but the root", st, err)
	}
	if unchanged.ID != m3.ID || len(newNames(before, objectNames(t, s))) != 0 {
		t.Fatalf("unchanged Take() = checkpoint %s, new objects %v; want %s and none", unchanged.ID, newNames(before, objectNames(t, s)), m3.ID)
	}
}

// A mode change alone is a change: a new checkpoint with the new mode,
// which Load and Files give back.
func TestTakeRecordsModes(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	ws := newMemWorkspace(map[string][]byte{"bin/run.sh": []byte("#!/bin/sh\necho hi\n"), "README": []byte("hi")})
	id := newID()
	first, _ := take(t, s, id, ws)
	if got := first.Files["bin/run.sh"].Mode; got != 0o644 {
		t.Fatalf("mode of bin/run.sh = %o, want 644", got)
	}
	ws.chmod("bin/run.sh", 0o755)
	m, st := take(t, s, id, ws)
	if st.Changed != 1 || st.Uploaded != 0 || st.NodesStored != 2 || m.ID == first.ID {
		t.Fatalf("Take() after chmod = %+v (checkpoint %s after %s); want 1 changed, no upload, 2 nodes stored, a new checkpoint", st, m.ID, first.ID)
	}
	if got := m.Files["bin/run.sh"]; got.Mode != 0o755 || got.Hash != first.Files["bin/run.sh"].Hash {
		t.Fatalf("bin/run.sh after chmod = %+v, want mode 755, same content", got)
	}
	modes := map[string]uint32{}
	for f, err := range s.Files(t.Context(), m) {
		if err != nil {
			t.Fatal(err)
		}
		modes[f.Path] = f.Mode
	}
	if modes["bin/run.sh"] != 0o755 || modes["README"] != 0o644 {
		t.Fatalf("Files() modes = %v, want bin/run.sh 0o755 (493), README 0o644 (420)", modes)
	}
	// The history keeps the mode of each checkpoint.
	old, _, err := s.LoadCheckpoint(t.Context(), id, first.ID)
	if err != nil || old.Files["bin/run.sh"].Mode != 0o644 {
		t.Fatalf("LoadCheckpoint(%s) = %+v, %v; want mode 644", first.ID, old.Files["bin/run.sh"], err)
	}
}

// newNames returns the names of after not in before.
func newNames(before, after []string) []string {
	var added []string
	for _, n := range after {
		if !slices.Contains(before, n) {
			added = append(added, n)
		}
	}
	return added
}

func TestSessionsShareBlobs(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	files := sourceFiles(50)
	if _, _, err := s.Take(t.Context(), newID(), newMemWorkspace(files)); err != nil {
		t.Fatalf("Take(a) = %v", err)
	}
	ws := newMemWorkspace(files)
	m, st := take(t, s, newID(), ws)
	if st.Uploaded != 0 || st.BytesUploaded != 0 || ws.blobCalls() != 0 {
		t.Fatalf("Take(b) stats = %+v, blob reads %d; want nothing uploaded or read", st, ws.blobCalls())
	}
	if st.BytesTotal != sumSizes(files) || m.Files["pkg01/src/module-0001.yaml"].Size != int64(len(files["pkg01/src/module-0001.yaml"])) {
		t.Fatalf("Take(b) sizes: total %d, want %d", st.BytesTotal, sumSizes(files))
	}
}

func TestLoadFilesRoundTrip(t *testing.T) {
	e := newEnv(t)
	binary := make([]byte, 300_000) // Several object chunks, every byte value.
	for i := range binary {
		binary[i] = byte(i * 7)
	}
	files := map[string][]byte{
		"telo.yaml":           []byte("kind: Application\n"),
		"assets/logo.png":     binary,
		"assets/copy.png":     binary, // Same content at two paths.
		"empty":               {},
		"deep/a/b/c/d/e.json": []byte(`{"ok":true}`),
		"naïve ünïcode.txt":   []byte("\xff\xfe not utf-8 \x00"),
	}
	// Checkpoints stored before trees (a flat file map, inline or in a
	// manifests/ object) still load.
	for _, format := range []string{"tree", "flat inline", "flat out of line"} {
		t.Run(format, func(t *testing.T) {
			s := e.store(t, Options{})
			id := newID()
			if _, ok, err := s.Load(t.Context(), id); ok || err != nil {
				t.Fatalf("Load() before any Take = %v, %v; want false, nil", ok, err)
			}
			if format == "tree" {
				if _, _, err := s.Take(t.Context(), id, newMemWorkspace(files)); err != nil {
					t.Fatalf("Take() = %v", err)
				}
			} else {
				putFlat(t, s, id, putBlobs(t, s, files), format == "flat out of line")
			}
			m, ok, err := s.Load(t.Context(), id)
			if err != nil || !ok {
				t.Fatalf("Load() = %v, %v", ok, err)
			}
			got := restored(t, s, m)
			if len(got) != len(files) {
				t.Fatalf("Files() = %d files, want %d", len(got), len(files))
			}
			for p, want := range files {
				if !bytes.Equal(got[p], want) {
					t.Fatalf("Files()[%q] = %d bytes, want %d identical bytes", p, len(got[p]), len(want))
				}
			}
		})
	}
}

func TestFilesWindows(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	files := sourceFiles(200) // More than one window of 64.
	files["big/one.bin"] = bytes.Repeat([]byte{1}, windowBytes+1)
	files["big/two.bin"] = bytes.Repeat([]byte{2}, windowBytes/2)
	m, _ := take(t, s, newID(), newMemWorkspace(files))
	got := restored(t, s, m)
	for p, want := range files {
		if !bytes.Equal(got[p], want) {
			t.Fatalf("Files()[%q] differs", p)
		}
	}
	n := 0
	for _, err := range s.Files(t.Context(), m) {
		if err != nil {
			t.Fatalf("Files() = %v", err)
		}
		if n++; n == 3 {
			break // Stopping early must not leak or panic.
		}
	}
}

func TestTakeFailureKeepsManifest(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	id := newID()
	files := sourceFiles(20)
	ws := newMemWorkspace(files)
	before, _ := take(t, s, id, ws)
	ws.set("pkg01/src/module-0001.yaml", []byte("one"))
	ws.set("pkg02/src/module-0002.yaml", []byte("two"))
	ws.set("new.yaml", []byte("three"))
	ws.remove("pkg04/src/module-0004.yaml")

	tests := []struct {
		name  string
		setup func()
	}{
		{"blob read fails", func() {
			ws.failOn = func(h string) error {
				if h == hashOf([]byte("two")) {
					return errors.New("workspace GET /workspace/blob: status 502")
				}
				return nil
			}
		}},
		{"blob content wrong", func() {
			ws.failOn = nil
			ws.corrupt = func(b []byte) []byte { return append(b, '!') }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.setup()
			if _, _, err := s.Take(t.Context(), id, ws); err == nil {
				t.Fatal("Take() = nil, want an error")
			}
			got, ok, err := s.Load(t.Context(), id)
			if err != nil || !ok {
				t.Fatalf("Load() = %v, %v", ok, err)
			}
			if !got.TakenAt.Equal(before.TakenAt) || !equalFiles(got.Files, before.Files) {
				t.Fatalf("Load() after a failed Take = %d files taken %v, want the previous manifest (%d files, %v)",
					len(got.Files), got.TakenAt, len(before.Files), before.TakenAt)
			}
		})
	}
	ws.corrupt = nil
	after, st := take(t, s, id, ws)
	if len(after.Files) != 20 || st.Changed != 3 || st.Removed != 1 {
		t.Fatalf("Take() after recovery = %+v; want 20 files, 3 changed, 1 removed", st)
	}
}

func TestTakeConflict(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	id := newID()
	ws := newMemWorkspace(sourceFiles(3))
	if _, _, err := s.Take(t.Context(), id, ws); err != nil {
		t.Fatalf("Take() = %v", err)
	}
	staleRec, rev, err := s.latest(t.Context(), id)
	if err != nil {
		t.Fatalf("latest() = %v", err)
	}
	stale := record{TakenAt: staleRec.TakenAt, Count: staleRec.Count, Root: staleRec.Root}
	ws.set("x", []byte("x"))
	winner, _ := take(t, s, id, ws)
	if _, err := s.write(t.Context(), id, stale, ReasonPeriodic, staleRec, rev); !errors.Is(err, ErrConflict) {
		t.Fatalf("write() with a stale revision = %v, want ErrConflict", err)
	}
	if _, err := s.write(t.Context(), newID(), stale, ReasonPeriodic, staleRec, 7); !errors.Is(err, ErrConflict) {
		t.Fatalf("write() expecting a value that is not there = %v, want ErrConflict", err)
	}
	if _, err := s.write(t.Context(), id, stale, ReasonPeriodic, record{}, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("write() creating a value that exists = %v, want ErrConflict", err)
	}
	got, _, _ := s.Load(t.Context(), id)
	if !equalFiles(got.Files, winner.Files) {
		t.Fatal("Load() after conflicts is not the winning manifest")
	}
}

func TestTakeRefusesBadInput(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	h := hashOf(nil)
	file := func(name, hash string) merkle.Entry {
		return merkle.Entry{Name: name, Kind: merkle.KindFile, Hash: hash, Mode: 0o644}
	}
	node := func(entries ...merkle.Entry) []byte {
		data, err := json.Marshal(merkle.Node{Entries: entries})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	sub := node(file("b", h))
	tests := []struct {
		name  string
		id    string
		root  []byte
		nodes map[string][]byte
	}{
		{"bad session id", "../etc", node(), nil},
		{"hash not hex", newID(), node(file("a", strings.Repeat("z", 64))), nil},
		{"hash names a path", newID(), node(file("a", "../../manifests/x")), nil},
		{"empty name", newID(), node(file("", h)), nil},
		{"name with a slash", newID(), node(file("a/b", h)), nil},
		{"name twice", newID(), node(file("a", h), file("a", h)), nil},
		{"out of order", newID(), node(file("b", h), file("a", h)), nil},
		{"not json", newID(), []byte("files"), nil},
		{"mode beyond permissions", newID(), node(merkle.Entry{Name: "a", Kind: merkle.KindFile, Hash: h, Mode: 0o4755}), nil},
		{"unknown kind", newID(), node(merkle.Entry{Name: "a", Kind: "link", Hash: h}), nil},
		{"node not matching its hash", newID(), node(merkle.Entry{Name: "d", Kind: merkle.KindDir, Hash: hashOf(sub), Files: 1}),
			map[string][]byte{hashOf(sub): node(file("c", h))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := s.Take(t.Context(), tt.id, fixedTree{tt.root, tt.nodes}); err == nil {
				t.Fatal("Take() = nil, want an error")
			}
			if _, ok, err := s.Load(t.Context(), tt.id); ok {
				t.Fatalf("Load() after a refused Take() = %v, %v; want no checkpoint", ok, err)
			}
		})
	}
}

// fixedTree answers a fixed root and nodes, and no blob.
type fixedTree struct {
	root  []byte
	nodes map[string][]byte
}

func (w fixedTree) Root(context.Context) ([]byte, error) { return w.root, nil }
func (w fixedTree) Node(_ context.Context, h string) ([]byte, error) {
	if data, ok := w.nodes[h]; ok {
		return data, nil
	}
	return nil, errors.New("file_not_found")
}
func (w fixedTree) Blob(context.Context, string) ([]byte, error) { return nil, errors.New("no blobs") }

func TestDelete(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	id := newID()
	if _, _, err := s.Take(t.Context(), id, newMemWorkspace(sourceFiles(2))); err != nil {
		t.Fatalf("Take() = %v", err)
	}
	for range 2 { // Deleting twice is fine.
		if err := s.Delete(t.Context(), id); err != nil {
			t.Fatalf("Delete() = %v", err)
		}
	}
	if _, ok, err := s.Load(t.Context(), id); ok || err != nil {
		t.Fatalf("Load() after Delete() = %v, %v; want false, nil", ok, err)
	}
	// A new Take after Delete starts a new chain.
	if _, st, err := s.Take(t.Context(), id, newMemWorkspace(sourceFiles(2))); err != nil || st.Changed != 2 {
		t.Fatalf("Take() after Delete() = %+v, %v; want 2 changed", st, err)
	}
}

// TestManifestSize measures a 10,000-file flat manifest (the format
// before trees) against the largest value the bucket accepts, and the
// tree nodes of the same workspace: each node is far below it.
func TestManifestSize(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	files := map[string]Entry{}
	var flat []merkle.File
	for i := range 10_000 {
		p := fmt.Sprintf("packages/app-%02d/src/components/widget-%04d/index.yaml", i%50, i)
		files[p] = Entry{Hash: hashOf([]byte(p)), Size: int64(1024 + i), Mode: 0o644}
		flat = append(flat, merkle.File{Path: p, Hash: hashOf([]byte(p)), Size: int64(1024 + i), Mode: 0o644})
	}
	enc, err := json.Marshal(record{Count: len(files), Files: files})
	if err != nil {
		t.Fatal(err)
	}
	limit := e.nc.MaxPayload()
	t.Logf("10,000-file flat manifest: %d bytes inline (%d per file); max payload %d bytes", len(enc), len(enc)/10_000, limit)
	if int64(len(enc)) <= limit {
		t.Fatalf("10,000-file manifest = %d bytes, fits the %d-byte limit: inline would do", len(enc), limit)
	}
	b, err := merkle.Build(flat)
	if err != nil {
		t.Fatal(err)
	}
	largest := 0
	for _, data := range b.Nodes {
		largest = max(largest, len(data))
	}
	t.Logf("as a tree: %d nodes, the largest %d bytes", len(b.Nodes), largest)
	if int64(largest) >= limit {
		t.Fatalf("largest node = %d bytes, want under the %d-byte limit", largest, limit)
	}
	// A flat manifest stored out of line before trees still loads.
	id := newID()
	putFlat(t, s, id, files, true)
	got, ok, err := s.Load(t.Context(), id)
	if err != nil || !ok || !equalFiles(got.Files, files) {
		t.Fatalf("Load() = %d files, %v, %v; want the 10,000-file manifest", len(got.Files), ok, err)
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		ok   bool
	}{
		{"zero", Options{}, true},
		{"set", Options{Concurrency: 8, Grace: time.Minute, History: 3}, true},
		{"negative concurrency", Options{Concurrency: -1}, false},
		{"negative grace", Options{Grace: -time.Second}, false},
		{"history too long", Options{History: MaxHistory + 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.opts.Validate(); (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok %v", err, tt.ok)
			}
		})
	}
}

func equalFiles(a, b map[string]Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for p, e := range a {
		if b[p] != e {
			return false
		}
	}
	return true
}

// A checkpoint stored as a flat file map before trees: a periodic Take of
// the same tree writes nothing (modes were not recorded, so they are not
// a change); any other Take writes the whole tree once, and no blob.
func TestTakeOverFlatRecord(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	files := sourceFiles(30) // 20 pkgNN/src directories: 41 nodes.
	id := newID()
	putFlat(t, s, id, putBlobs(t, s, files), false)
	ws := newMemWorkspace(files)
	before := objectNames(t, s)
	m, st, err := s.Take(t.Context(), id, ws)
	if err != nil || m.ID != "1" || st.Changed != 0 || st.Removed != 0 || len(newNames(before, objectNames(t, s))) != 0 {
		t.Fatalf("periodic Take() of the same tree = %s, %+v, %v, objects %v; want checkpoint 1, nothing written", m.ID, st, err, newNames(before, objectNames(t, s)))
	}
	m, st, err = s.TakeAs(t.Context(), id, ReasonSuspend, ws)
	if err != nil || m.ID != "2" || st.Uploaded != 0 || st.NodesStored != 41 || ws.blobCalls() != 0 {
		t.Fatalf("TakeAs(suspend) = %s, %+v, %v, %d blob reads; want checkpoint 2, 41 nodes, no blob", m.ID, st, err, ws.blobCalls())
	}
	got, _, err := s.Load(t.Context(), id)
	if err != nil || len(got.Files) != 30 || got.Files["pkg01/src/module-0001.yaml"].Mode != 0o644 {
		t.Fatalf("Load() = %d files, %v; want 30 with modes", len(got.Files), err)
	}
	// The flat checkpoint is still in the history, and loads.
	old, _, err := s.LoadCheckpoint(t.Context(), id, "1")
	if err != nil || len(old.Files) != 30 || old.Root != "" {
		t.Fatalf("LoadCheckpoint(1) = %d files, root %q, %v; want the flat 30", len(old.Files), old.Root, err)
	}
}
