package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestTakeMovesOnlyChanges(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	ctx := t.Context()
	files := sourceFiles(1000)
	ws := newMemWorkspace(files)
	id := newID()

	m, st, err := s.Take(ctx, id, ws)
	if err != nil {
		t.Fatalf("first Take() = %v", err)
	}
	want := Stats{Files: 1000, Changed: 1000, Uploaded: 1000, BytesUploaded: sumSizes(files), BytesTotal: sumSizes(files)}
	if st != want {
		t.Fatalf("first Take() stats = %+v, want %+v", st, want)
	}
	if len(m.Files) != 1000 || ws.blobCalls() != 1000 {
		t.Fatalf("first Take() = %d files, %d blob reads; want 1000, 1000", len(m.Files), ws.blobCalls())
	}

	changed := "pkg07/src/module-0007.yaml"
	content := []byte("kind: Thing\nname: edited\n")
	ws.set(changed, content)
	m2, st, err := s.Take(ctx, id, ws)
	if err != nil {
		t.Fatalf("second Take() = %v", err)
	}
	if st.Uploaded != 1 || st.BytesUploaded != int64(len(content)) || st.Changed != 1 || st.Files != 1000 {
		t.Fatalf("second Take() stats = %+v, want 1 upload of %d bytes, 1 changed", st, len(content))
	}
	if got := ws.blobCalls(); got != 1001 {
		t.Fatalf("blob reads after second Take() = %d, want 1001", got)
	}
	if got := m2.Files[changed]; got.Hash != hashOf(content) || got.Size != int64(len(content)) {
		t.Fatalf("manifest[%s] = %+v, want the new content", changed, got)
	}

	gone := "pkg03/src/module-0003.yaml"
	ws.remove(gone)
	m3, st, err := s.Take(ctx, id, ws)
	if err != nil {
		t.Fatalf("third Take() = %v", err)
	}
	if _, ok := m3.Files[gone]; ok || st.Removed != 1 || st.Uploaded != 0 || st.Files != 999 {
		t.Fatalf("after delete: %s in manifest = %v, stats = %+v; want dropped, 1 removed, no upload", gone, ok, st)
	}
	loaded, ok, err := s.Load(ctx, id)
	if err != nil || !ok {
		t.Fatalf("Load() = %v, %v", ok, err)
	}
	if _, ok := loaded.Files[gone]; ok || len(loaded.Files) != 999 || !loaded.TakenAt.Equal(m3.TakenAt) {
		t.Fatalf("Load() = %d files (deleted present: %v), takenAt %v; want the third manifest", len(loaded.Files), ok, loaded.TakenAt)
	}

	_, st, err = s.Take(ctx, id, ws)
	if err != nil || st.Uploaded != 0 || st.Changed != 0 || st.BytesUploaded != 0 {
		t.Fatalf("unchanged Take() = %+v, %v; want nothing moved", st, err)
	}
}

func TestSessionsShareBlobs(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	files := sourceFiles(50)
	if _, _, err := s.Take(t.Context(), newID(), newMemWorkspace(files)); err != nil {
		t.Fatalf("Take(a) = %v", err)
	}
	ws := newMemWorkspace(files)
	m, st, err := s.Take(t.Context(), newID(), ws)
	if err != nil {
		t.Fatalf("Take(b) = %v", err)
	}
	if st.Uploaded != 0 || st.BytesUploaded != 0 || ws.blobCalls() != 0 {
		t.Fatalf("Take(b) stats = %+v, blob reads %d; want nothing uploaded or read", st, ws.blobCalls())
	}
	if st.BytesTotal != sumSizes(files) || m.Files["pkg01/src/module-0001.yaml"].Size != int64(len(files["pkg01/src/module-0001.yaml"])) {
		t.Fatalf("Take(b) sizes: total %d, want %d (sizes come from the store)", st.BytesTotal, sumSizes(files))
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
	for name, opts := range map[string]Options{"inline": {}, "out of line": {InlineLimit: 1}} {
		t.Run(name, func(t *testing.T) {
			s := e.store(t, opts)
			id := newID()
			if _, ok, err := s.Load(t.Context(), id); ok || err != nil {
				t.Fatalf("Load() before any Take = %v, %v; want false, nil", ok, err)
			}
			if _, _, err := s.Take(t.Context(), id, newMemWorkspace(files)); err != nil {
				t.Fatalf("Take() = %v", err)
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
	id := newID()
	m, _, err := s.Take(t.Context(), id, newMemWorkspace(files))
	if err != nil {
		t.Fatalf("Take() = %v", err)
	}
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
	before, _, err := s.Take(t.Context(), id, ws)
	if err != nil {
		t.Fatalf("Take() = %v", err)
	}
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
	after, st, err := s.Take(t.Context(), id, ws)
	if err != nil || len(after.Files) != 20 || st.Changed != 3 || st.Removed != 1 {
		t.Fatalf("Take() after recovery = %+v, %v; want 20 files, 3 changed, 1 removed", st, err)
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
	stale, staleRec, rev, err := s.load(t.Context(), id)
	if err != nil {
		t.Fatalf("load() = %v", err)
	}
	ws.set("x", []byte("x"))
	winner, _, err := s.Take(t.Context(), id, ws)
	if err != nil {
		t.Fatalf("Take() = %v", err)
	}
	if _, err := s.write(t.Context(), id, stale, ReasonPeriodic, 0, staleRec, rev); !errors.Is(err, ErrConflict) {
		t.Fatalf("write() with a stale revision = %v, want ErrConflict", err)
	}
	if _, err := s.write(t.Context(), newID(), stale, ReasonPeriodic, 0, staleRec, 7); !errors.Is(err, ErrConflict) {
		t.Fatalf("write() expecting a value that is not there = %v, want ErrConflict", err)
	}
	if _, err := s.write(t.Context(), id, stale, ReasonPeriodic, 0, record{}, 0); !errors.Is(err, ErrConflict) {
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
	tests := []struct {
		name string
		id   string
		tree []File
	}{
		{"bad session id", "../etc", nil},
		{"hash not hex", newID(), []File{{Path: "a", Hash: strings.Repeat("z", 64)}}},
		{"hash names a path", newID(), []File{{Path: "a", Hash: "../../manifests/x"}}},
		{"empty path", newID(), []File{{Path: "", Hash: hashOf(nil)}}},
		{"path twice", newID(), []File{{Path: "a", Hash: hashOf(nil)}, {Path: "a", Hash: hashOf(nil)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := s.Take(t.Context(), tt.id, treeOnly(tt.tree)); err == nil {
				t.Fatal("Take() = nil, want an error")
			}
		})
	}
}

type treeOnly []File

func (w treeOnly) Tree(context.Context) ([]File, error)         { return w, nil }
func (w treeOnly) Blob(context.Context, string) ([]byte, error) { return nil, errors.New("no blobs") }

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

// TestManifestSize measures a 10,000-file manifest against the largest
// value the bucket accepts and checks that the store keeps such a manifest
// out of line and reads it back.
func TestManifestSize(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	m := Manifest{TakenAt: time.Now().UTC(), Files: map[string]Entry{}}
	for i := range 10_000 {
		p := fmt.Sprintf("packages/app-%02d/src/components/widget-%04d/index.yaml", i%50, i)
		m.Files[p] = Entry{Hash: hashOf([]byte(p)), Size: int64(1024 + i)}
	}
	enc, err := json.Marshal(record{TakenAt: m.TakenAt, Count: len(m.Files), Files: m.Files})
	if err != nil {
		t.Fatal(err)
	}
	limit := e.nc.MaxPayload()
	t.Logf("10,000-file manifest: %d bytes inline (%d per file); max payload %d bytes", len(enc), len(enc)/10_000, limit)
	if int64(len(enc)) <= limit {
		t.Fatalf("10,000-file manifest = %d bytes, fits the %d-byte limit: inline would do", len(enc), limit)
	}
	if _, err := s.kv.Put(t.Context(), "probe", enc); err == nil {
		t.Fatal("KV Put() of the inline manifest = nil, want a size error")
	}

	id := newID()
	if _, err := s.write(t.Context(), id, m, ReasonPeriodic, 0, record{}, 0); err != nil {
		t.Fatalf("write() = %v", err)
	}
	v, err := s.kv.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	var r record
	if err := json.Unmarshal(v.Value(), &r); err != nil || !strings.HasPrefix(r.Manifest, manifestPrefix) || r.Files != nil || r.Count != 10_000 {
		t.Fatalf("stored value = %s, want a pointer to a manifest object", v.Value())
	}
	t.Logf("stored value: %d bytes", len(v.Value()))
	got, ok, err := s.Load(t.Context(), id)
	if err != nil || !ok || !equalFiles(got.Files, m.Files) || !got.TakenAt.Equal(m.TakenAt) {
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
		{"set", Options{Concurrency: 8, Grace: time.Minute, InlineLimit: 1}, true},
		{"negative concurrency", Options{Concurrency: -1}, false},
		{"negative grace", Options{Grace: -time.Second}, false},
		{"negative inline limit", Options{InlineLimit: -1}, false},
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
