package proxy

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/merkle"
	"github.com/telorunner/telorunner/pkg/session"
)

// blobObjects lists the object names of runner_blobs.
func blobObjects(t *testing.T, p *proxy) []string {
	t.Helper()
	obs, err := p.store.JetStream().ObjectStore(t.Context(), bus.ObjectBlobs)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := obs.List(t.Context())
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		t.Fatal(err)
	}
	var names []string
	for _, o := range infos {
		names = append(names, o.Name)
	}
	slices.Sort(names)
	return names
}

func added(before, after []string) []string {
	var out []string
	for _, n := range after {
		if !slices.Contains(before, n) {
			out = append(out, n)
		}
	}
	return out
}

func perm(t *testing.T, dir, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(p)))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func chmod(t *testing.T, dir, p string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(filepath.Join(dir, filepath.FromSlash(p)), mode); err != nil {
		t.Fatal(err)
	}
}

// Through a real workspace server: one changed file stores its blob and
// the tree nodes on its path and nothing else, an unchanged tree stores
// nothing, and a mode change alone is a checkpoint that a restore into a
// fresh workspace gives back.
func TestCheckpointTreeAndModes(t *testing.T) {
	p := newProxy(t)
	ctx := t.Context()
	id := contract.NewSessionID()
	src := t.TempDir()
	files := sampleFiles()
	files["bin/run.sh"] = []byte("#!/bin/sh\necho run\n")
	writeTree(t, src, files)
	chmod(t, src, "bin/run.sh", 0o755)
	live := serveWorkspace(t, src, nil)

	if _, err := p.checkpointOp(ctx, live, id, nil); err != nil {
		t.Fatalf("checkpointOp() = %v", err)
	}

	// a/b/c/deep.yaml: the root, a, a/b and a/b/c nodes, and the blob.
	writeTree(t, src, map[string][]byte{"a/b/c/deep.yaml": []byte("deep: false\n")})
	before := blobObjects(t, p)
	res, err := p.checkpointOp(ctx, live, id, nil)
	if err != nil {
		t.Fatalf("checkpointOp() after one edit = %v", err)
	}
	cr := res.(checkpointResult)
	got := added(before, blobObjects(t, p))
	trees := 0
	for _, n := range got {
		if strings.HasPrefix(n, "trees/") {
			trees++
		}
	}
	if cr.Changed != 1 || cr.Uploaded != 1 || len(got) != 5 || trees != 4 || !slices.Contains(got, bus.BlobKey(merkle.Hash([]byte("deep: false\n")))) {
		t.Fatalf("one edit: %+v, objects written %v; want 1 changed, 1 upload, the blob and 4 tree nodes", cr, got)
	}

	// Unchanged: nothing written, the same checkpoint.
	before = blobObjects(t, p)
	res, err = p.checkpointOp(ctx, live, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again := res.(checkpointResult); again.ID != cr.ID || again.Changed != 0 || len(added(before, blobObjects(t, p))) != 0 {
		t.Fatalf("unchanged: %+v (was %s), objects written %v; want the same checkpoint, nothing written", again, cr.ID, added(before, blobObjects(t, p)))
	}

	// A mode change alone: a new checkpoint, no blob, and it survives a
	// restore into a fresh workspace.
	chmod(t, src, "telo.yaml", 0o755)
	chmod(t, src, "bin/run.sh", 0o700)
	before = blobObjects(t, p)
	res, err = p.checkpointOp(ctx, live, id, []byte(`{"reason":"suspend"}`))
	if err != nil {
		t.Fatal(err)
	}
	modes := res.(checkpointResult)
	if modes.ID == cr.ID || modes.Changed != 2 || modes.Uploaded != 0 {
		t.Fatalf("mode change: %+v; want a new checkpoint, 2 changed, no upload", modes)
	}
	for _, n := range added(before, blobObjects(t, p)) {
		if !strings.HasPrefix(n, "trees/") {
			t.Fatalf("mode change wrote %s, want tree nodes only", n)
		}
	}

	dst := t.TempDir()
	fresh := serveWorkspace(t, dst, nil)
	if _, err := restoreLatest(ctx, p, fresh, id); err != nil {
		t.Fatalf("restoreOp() = %v", err)
	}
	for path, want := range map[string]fs.FileMode{"telo.yaml": 0o755, "bin/run.sh": 0o700, "src/mod-01.yaml": 0o644, "a/b/c/deep.yaml": 0o644} {
		if got := perm(t, dst, path); got != want {
			t.Fatalf("restored %s mode = %o, want %o", path, got, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a", "b", "c", "deep.yaml")); string(b) != "deep: false\n" {
		t.Fatalf("restored deep.yaml = %q", b)
	}
	// And a fresh checkpoint of the restored workspace is the same tree.
	st := p.ckpt
	other := contract.NewSessionID()
	res, err = p.checkpointOp(ctx, fresh, other, nil)
	if err != nil {
		t.Fatal(err)
	}
	m1, _, err := st.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	m2, _, err := st.Load(ctx, other)
	if err != nil || m2.Root != m1.Root || res.(checkpointResult).Uploaded != 0 {
		t.Fatalf("checkpoint of the restored workspace: root %s, want %s (%v)", m2.Root, m1.Root, err)
	}
}

// Restoring a kept checkpoint puts back the modes it recorded, also for a
// file whose content did not change.
func TestRestoreToModes(t *testing.T) {
	p := newProxy(t)
	ctx := t.Context()
	dir := t.TempDir()
	c := serveWorkspace(t, dir, nil)
	rec := session.Record{ID: contract.NewSessionID(), Apps: []session.App{{Name: "web", Entry: "telo.yaml"}}}
	writeTree(t, dir, map[string][]byte{"telo.yaml": []byte("web\n"), "run.sh": []byte("#!/bin/sh\n")})
	chmod(t, dir, "run.sh", 0o755)
	if _, err := p.checkpointOp(ctx, c, rec.ID, []byte(`{"reason":"manual"}`)); err != nil {
		t.Fatal(err)
	}
	chmod(t, dir, "run.sh", 0o644)
	if _, err := p.checkpointOp(ctx, c, rec.ID, []byte(`{"reason":"manual"}`)); err != nil {
		t.Fatal(err)
	}
	got, err := p.restoreTo(ctx, c, rec, []byte(`{"checkpoint":"1"}`))
	if err != nil {
		t.Fatalf("restoreTo() = %v", err)
	}
	if r := got.(restoreToResult); r.Written != 1 || r.Deleted != 0 {
		t.Fatalf("restoreTo() = %+v, want run.sh written (its mode), nothing deleted", r)
	}
	if m := perm(t, dir, "run.sh"); m != 0o755 {
		t.Fatalf("run.sh after restore = %o, want 755", m)
	}
}

// The bus's apply op (the /v1 change set) carries no mode: one in its
// body is dropped, so a new file gets the default 0644.
func TestApplyOpDropsMode(t *testing.T) {
	p := newProxy(t)
	dir := t.TempDir()
	c := serveWorkspace(t, dir, nil)
	body := []byte(`{"write":[{"path":"x.sh","content":"x","mode":493}]}`)
	if _, err := p.op(t.Context(), c, contract.NewSessionID(), bus.WSApply, body); err != nil {
		t.Fatalf("op(apply) = %v", err)
	}
	if m := perm(t, dir, "x.sh"); m != 0o644 {
		t.Fatalf("x.sh written through the apply op has mode %o, want 644", m)
	}
}
