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
	if err != nil || n != 1 {
		t.Fatalf("CollectGarbage() = %d, %v; want 1 (the blob of z)", n, err)
	}
	want := []string{"bundles/unrelated"}
	for _, c := range []string{"x", "y", "z2", "w"} {
		want = append(want, bus.BlobKey(hashOf([]byte(c))))
	}
	slices.Sort(want)
	if got := objectNames(t, w); !slices.Equal(got, want) {
		t.Fatalf("objects after CollectGarbage() = %v, want %v", got, want)
	}

	// Dropping a's manifest frees "y" (but "x" is still b's "shared").
	if err := w.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n, err := gc.CollectGarbage(ctx); err != nil || n != 1 {
		t.Fatalf("CollectGarbage() after Delete(a) = %d, %v; want 1 (the blob of y)", n, err)
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
	if n, err := s.CollectGarbage(ctx); err != nil || n != 0 {
		t.Fatalf("CollectGarbage() after adopt() = %d, %v; want 0 (the blob was refreshed)", n, err)
	}
}

func TestCollectGarbageManifestObjects(t *testing.T) {
	e := newEnv(t)
	grace := time.Minute
	var now time.Time
	// A history of one: the second checkpoint replaces the first.
	s := e.store(t, Options{InlineLimit: 1, Grace: grace, Now: func() time.Time { return now }, History: 1})
	ctx := t.Context()
	now = time.Now()
	id := newID()
	ws := newMemWorkspace(map[string][]byte{"a": []byte("a"), "b": []byte("b")})
	if _, _, err := s.Take(ctx, id, ws); err != nil {
		t.Fatal(err)
	}
	ws.remove("b")
	if _, _, err := s.Take(ctx, id, ws); err != nil {
		t.Fatal(err)
	}
	manifests := func() (n int) {
		for _, name := range objectNames(t, s) {
			if strings.HasPrefix(name, manifestPrefix) {
				n++
			}
		}
		return n
	}
	if got := manifests(); got != 2 {
		t.Fatalf("manifest objects = %d, want 2", got)
	}
	now = after(t, s).Add(grace)
	n, err := s.CollectGarbage(ctx)
	if err != nil || n != 2 {
		t.Fatalf("CollectGarbage() = %d, %v; want 2 (the first manifest and b)", n, err)
	}
	if got := manifests(); got != 1 {
		t.Fatalf("manifest objects after CollectGarbage() = %d, want 1", got)
	}
	m, _, err := s.Load(ctx, id)
	if err != nil || len(m.Files) != 1 {
		t.Fatalf("Load() = %d files, %v; want 1", len(m.Files), err)
	}
	if got := restored(t, s, m); string(got["a"]) != "a" {
		t.Fatalf("Files() = %q", got)
	}
}

func TestCollectGarbageEmpty(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, Options{})
	if n, err := s.CollectGarbage(t.Context()); err != nil || n != 0 {
		t.Fatalf("CollectGarbage() on an empty store = %d, %v; want 0, nil", n, err)
	}
}
