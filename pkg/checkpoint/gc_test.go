package checkpoint

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/testkit"
)

// objectNames lists runner_blobs.
func objectNames(t *testing.T, s *Store) []string {
	t.Helper()
	objs, err := s.blobs.List(t.Context())
	if err != nil && err != jetstream.ErrNoObjectsFound {
		t.Fatalf("List() = %v", err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.Name)
	}
	slices.Sort(names)
	return names
}

// after waits until the clock has passed every object's modification time
// and returns that time: objects written later are younger.
func after(t *testing.T, s *Store) time.Time {
	t.Helper()
	objs, _ := s.blobs.List(t.Context())
	var newest time.Time
	for _, o := range objs {
		if o.ModTime.After(newest) {
			newest = o.ModTime
		}
	}
	testkit.Eventually(t, time.Second, func() bool { return time.Now().After(newest) }, "clock passes %v", newest)
	return time.Now()
}

func TestCollectGarbage(t *testing.T) {
	e := newEnv(t)
	grace := 10 * time.Minute
	var now time.Time
	clock := func() time.Time { return now }
	w := e.store(t, Options{History: 1}) // Writers use the real clock; a history of one.
	gc := e.store(t, Options{Grace: grace, Now: clock})
	ctx := t.Context()

	a, b := newID(), newID()
	wsA := newMemWorkspace(map[string][]byte{"x": []byte("x"), "y": []byte("y")})
	wsB := newMemWorkspace(map[string][]byte{"z": []byte("z"), "shared": []byte("x")})
	for id, ws := range map[string]*memWorkspace{a: wsA, b: wsB} {
		if _, _, err := w.Take(ctx, id, ws); err != nil {
			t.Fatalf("Take(%s) = %v", id, err)
		}
	}
	wsB.set("z", []byte("z2")) // "z" is now referenced by no manifest.
	if _, _, err := w.Take(ctx, b, wsB); err != nil {
		t.Fatalf("Take(b) = %v", err)
	}
	cutoff := after(t, w)
	// A Take in flight has uploaded "w" but not written its manifest yet.
	if _, err := w.blobs.PutBytes(ctx, bus.BlobKey(hashOf([]byte("w"))), []byte("w")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.blobs.PutBytes(ctx, "bundles/unrelated", []byte("other")); err != nil {
		t.Fatal(err)
	}

	now = cutoff.Add(grace / 2)
	if n, err := gc.CollectGarbage(ctx); err != nil || n != 0 {
		t.Fatalf("CollectGarbage() within the grace period = %d, %v; want 0", n, err)
	}

	now = cutoff.Add(grace)
	n, err := gc.CollectGarbage(ctx)
	if err != nil || n != 2 {
		t.Fatalf("CollectGarbage() = %d, %v; want 2 (the blob of z, b's first root node)", n, err)
	}
	want := []string{"bundles/unrelated", bus.TreeKey(root(t, w, a)), bus.TreeKey(root(t, w, b))}
	for _, c := range []string{"x", "y", "z2", "w"} {
		want = append(want, bus.BlobKey(hashOf([]byte(c))))
	}
	slices.Sort(want)
	if got := objectNames(t, w); !slices.Equal(got, want) {
		t.Fatalf("objects after CollectGarbage() = %v, want %v", got, want)
	}

	// Dropping a's checkpoint frees "y" and a's root node (but "x" is
	// still b's "shared").
	if err := w.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n, err := gc.CollectGarbage(ctx); err != nil || n != 2 {
		t.Fatalf("CollectGarbage() after Delete(a) = %d, %v; want 2 (the blob of y, a's root node)", n, err)
	}
	m, _, err := w.Load(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	got := restored(t, w, m)
	if string(got["z"]) != "z2" || string(got["shared"]) != "x" {
		t.Fatalf("b restored after collection = %q, want z2 and x", got)
	}
}

// A Take that reuses an old blob it did not upload refreshes it, so a
// collection between that Take's check and its manifest write keeps it.
func TestCollectGarbageSparesAdoptedBlob(t *testing.T) {
	e := newEnv(t)
	grace := 10 * time.Minute
	var now time.Time
	clock := func() time.Time { return now }
	s := e.store(t, Options{Grace: grace, Now: clock})
	ctx := t.Context()

	now = time.Now()
	old := newID()
	if _, _, err := s.Take(ctx, old, newMemWorkspace(map[string][]byte{"a": []byte("a")})); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, old); err != nil { // "a" is unreferenced now.
		t.Fatal(err)
	}
	now = after(t, s).Add(grace) // Everything stored is old.
	if _, err := s.adopt(ctx, bus.BlobKey(hashOf([]byte("a")))); err != nil {
		t.Fatalf("adopt() = %v", err)
	}
	if n, err := s.CollectGarbage(ctx); err != nil || n != 1 {
		t.Fatalf("CollectGarbage() after adopt() = %d, %v; want 1 (the root node; the blob was refreshed)", n, err)
	}
	if names := objectNames(t, s); !slices.Equal(names, []string{bus.BlobKey(hashOf([]byte("a")))}) {
		t.Fatalf("objects after CollectGarbage() = %v, want the adopted blob only", names)
	}
}

// Checkpoints stored as flat file maps before trees stay GC-safe: their
// blobs and manifest objects are kept while referenced, and collected once
// a tree checkpoint has replaced them.
func TestCollectGarbageFlatRecords(t *testing.T) {
	e := newEnv(t)
	grace := time.Minute
	var now time.Time
	// A history of one: the next checkpoint replaces the flat one.
	s := e.store(t, Options{Grace: grace, Now: func() time.Time { return now }, History: 1})
	ctx := t.Context()
	now = time.Now()
	id, inline := newID(), newID()
	files := map[string][]byte{"a": []byte("a"), "b": []byte("b")}
	putFlat(t, s, id, putBlobs(t, s, files), true)
	putFlat(t, s, inline, putBlobs(t, s, map[string][]byte{"c": []byte("c")}), false)
	manifests := func() (n int) {
		for _, name := range objectNames(t, s) {
			if strings.HasPrefix(name, manifestPrefix) {
				n++
			}
		}
		return n
	}
	now = after(t, s).Add(grace)
	if n, err := s.CollectGarbage(ctx); err != nil || n != 0 {
		t.Fatalf("CollectGarbage() with flat records = %d, %v; want 0", n, err)
	}

	// A Take over the flat record: a flat map has no stored nodes, so
	// the whole tree is written; the blobs are the flat record's.
	ws := newMemWorkspace(files)
	ws.remove("b")
	now = time.Now()
	m, st := take(t, s, id, ws)
	if st.Removed != 1 || st.Changed != 0 || st.Uploaded != 0 || st.NodesStored != 1 || m.ID != "2" {
		t.Fatalf("Take() over a flat record = %+v, checkpoint %s; want 1 removed, nothing uploaded, 1 node, id 2", st, m.ID)
	}
	now = after(t, s).Add(grace)
	n, err := s.CollectGarbage(ctx)
	if err != nil || n != 2 {
		t.Fatalf("CollectGarbage() = %d, %v; want 2 (the flat manifest object and b)", n, err)
	}
	if got := manifests(); got != 0 {
		t.Fatalf("manifest objects after CollectGarbage() = %d, want 0", got)
	}
	if got := restored(t, s, m); len(got) != 1 || string(got["a"]) != "a" {
		t.Fatalf("Files() = %q", got)
	}
	c, ok, err := s.Load(ctx, inline)
	if err != nil || !ok {
		t.Fatalf("Load(inline flat) = %v, %v", ok, err)
	}
	if got := restored(t, s, c); string(got["c"]) != "c" {
		t.Fatalf("Files(inline flat) = %q", got)
	}
}

// The collector keeps every node and blob of the checkpoints a history
// keeps, and deletes those only checkpoints that fell out of it had.
func TestCollectGarbageKeepsHistory(t *testing.T) {
	e := newEnv(t)
	grace := time.Minute
	var now time.Time
	s := e.store(t, Options{History: 2})
	gc := e.store(t, Options{Grace: grace, Now: func() time.Time { return now }})
	ctx := t.Context()
	id := newID()
	ws := newMemWorkspace(map[string][]byte{"src/app/main.yaml": []byte("v1"), "src/lib/util.yaml": []byte("lib")})
	var ids []string
	for _, v := range []string{"v1", "v2", "v3"} {
		ws.set("src/app/main.yaml", []byte(v))
		m, _, err := s.TakeAs(ctx, id, ReasonManual, ws)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	now = after(t, s).Add(grace)
	// Checkpoint 1 fell out: its blob v1 and its root, src and src/app
	// nodes are unreferenced; src/lib is shared by all three.
	if n, err := gc.CollectGarbage(ctx); err != nil || n != 4 {
		t.Fatalf("CollectGarbage() = %d, %v; want 4 (v1 and checkpoint 1's three nodes)", n, err)
	}
	for i, v := range map[int]string{1: "v2", 2: "v3"} {
		m, _, err := s.LoadCheckpoint(ctx, id, ids[i])
		if err != nil {
			t.Fatalf("LoadCheckpoint(%s) = %v", ids[i], err)
		}
		got := restored(t, s, m)
		if string(got["src/app/main.yaml"]) != v || string(got["src/lib/util.yaml"]) != "lib" {
			t.Fatalf("checkpoint %s after collection = %q, want main %s and lib", ids[i], got, v)
		}
	}
	if n, err := gc.CollectGarbage(ctx); err != nil || n != 0 {
		t.Fatalf("second CollectGarbage() = %d, %v; want 0", n, err)
	}
}

// root returns the root hash of the session's latest checkpoint.
func root(t *testing.T, s *Store, id string) string {
	t.Helper()
	r, _, err := s.latest(t.Context(), id)
	if err != nil || r.Root == "" {
		t.Fatalf("latest(%s) = root %q, %v", id, r.Root, err)
	}
	return r.Root
}

func TestCollectGarbageEmpty(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	if n, err := s.CollectGarbage(t.Context()); err != nil || n != 0 {
		t.Fatalf("CollectGarbage() on an empty store = %d, %v; want 0, nil", n, err)
	}
}
