package proxy

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
)

// Restoring a kept checkpoint makes the workspace that tree exactly:
// changed files rewritten, files it lacks removed, unchanged ones left
// alone (only the entries of apps the restore did not rewrite are
// touched), and a restore checkpoint recorded.
func TestRestoreToKeptCheckpoint(t *testing.T) {
	p := newProxy(t)
	ctx := t.Context()
	dir := t.TempDir()
	var applies applyCounter
	c := serveWorkspace(t, dir, &applies)
	rec := session.Record{ID: contract.NewSessionID(), Apps: []session.App{{Name: "web", Entry: "web/telo.yaml"}, {Name: "worker", Entry: "worker/telo.yaml"}}}
	writeTree(t, dir, map[string][]byte{"web/telo.yaml": []byte("web A\n"), "worker/telo.yaml": []byte("worker\n"), "notes/a.txt": []byte("A\n"), "same.txt": []byte("same\n")})
	res, err := p.checkpointOp(ctx, c, rec.ID, []byte(`{"reason":"manual"}`))
	if err != nil {
		t.Fatalf("checkpointOp() = %v", err)
	}
	a := res.(checkpointResult)
	if a.ID != "1" || a.Reason != checkpoint.ReasonManual {
		t.Fatalf("checkpoint A = %+v", a)
	}
	// B: web's entry changed, a.txt gone, b.txt new.
	writeTree(t, dir, map[string][]byte{"web/telo.yaml": []byte("web B\n"), "notes/b.txt": []byte("B\n")})
	if err := os.Remove(filepath.Join(dir, "notes", "a.txt")); err != nil {
		t.Fatal(err)
	}
	sameBefore, _ := os.Stat(filepath.Join(dir, "same.txt"))
	workerBefore, _ := os.Stat(filepath.Join(dir, "worker", "telo.yaml"))

	got, err := p.restoreTo(ctx, c, rec, []byte(`{"checkpoint":"1"}`))
	if err != nil {
		t.Fatalf("restoreTo() = %v", err)
	}
	r := got.(restoreToResult)
	if r.Restored != "1" || r.Written != 2 || r.Deleted != 1 || !slices.Equal(r.Touched, []string{"worker/telo.yaml"}) {
		t.Fatalf("restoreTo() = %+v, want web and a.txt written, b.txt deleted, worker touched", r)
	}
	if r.Checkpoint.Reason != checkpoint.ReasonRestore || r.Checkpoint.ID != "2" || r.Checkpoint.Uploaded != 0 {
		t.Fatalf("restore checkpoint = %+v, want id 2, reason restore, nothing uploaded", r.Checkpoint)
	}
	tree, err := c.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range tree.Files {
		paths = append(paths, f.Path)
	}
	if want := []string{"notes/a.txt", "same.txt", "web/telo.yaml", "worker/telo.yaml"}; !slices.Equal(paths, want) {
		t.Fatalf("tree after restore = %v, want %v", paths, want)
	}
	for p, want := range map[string]string{"web/telo.yaml": "web A\n", "notes/a.txt": "A\n"} {
		if b, _ := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p))); string(b) != want {
			t.Fatalf("%s = %q, want %q", p, b, want)
		}
	}
	if sameAfter, _ := os.Stat(filepath.Join(dir, "same.txt")); !os.SameFile(sameBefore, sameAfter) {
		t.Fatal("an unchanged file was rewritten")
	}
	if workerAfter, _ := os.Stat(filepath.Join(dir, "worker", "telo.yaml")); os.SameFile(workerBefore, workerAfter) {
		t.Fatal("the worker's entry was not touched (its kernel would not reload)")
	}

	for _, body := range []string{`{"checkpoint":"3"}`, `{"checkpoint":"../1"}`, `{"checkpoint":""}`} {
		_, err := p.restoreTo(ctx, c, rec, []byte(body))
		var ce *contract.Error
		if !errors.As(err, &ce) || ce.Code != "checkpoint_not_found" {
			t.Fatalf("restoreTo(%s) = %v, want checkpoint_not_found", body, err)
		}
	}
	if _, err := p.checkpointOp(ctx, c, rec.ID, []byte(`{"reason":"whim"}`)); err == nil {
		t.Fatal("checkpointOp(whim) succeeded")
	}
	var h []checkpoint.Checkpoint
	h, err = checkpoint.History(ctx, p.store.Checkpoints(), rec.ID)
	if err != nil || len(h) != 2 || h[0].Reason != "restore" || h[1].Reason != "manual" {
		out, _ := json.Marshal(h)
		t.Fatalf("history = %s, %v", out, err)
	}
}
