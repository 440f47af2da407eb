package wsserver_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/telorunner/telorunner/pkg/wsapi"
)

// A frozen workspace refuses every write and touch (409 workspace_frozen)
// and still answers reads and the tree; thawed, it takes writes again.
func TestFreezeRefusesWrites(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.txt": "a"})
	f := start(t, dir, nil)
	ctx := t.Context()
	if err := f.c.Freeze(ctx, true); err != nil {
		t.Fatalf("Freeze(true) = %v", err)
	}
	_, err := f.c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{{Path: "b.txt", Content: "b"}}, Delete: []string{"a.txt"}})
	var we *wsapi.Error
	if !errors.As(err, &we) || we.Code != wsapi.CodeFrozen || we.Status != 409 {
		t.Fatalf("Apply() on a frozen workspace = %v, want 409 %s", err, wsapi.CodeFrozen)
	}
	if _, err := f.c.Touch(ctx, []string{"a.txt"}); !errors.As(err, &we) || we.Code != wsapi.CodeFrozen {
		t.Fatalf("Touch() on a frozen workspace = %v, want %s", err, wsapi.CodeFrozen)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("b.txt written while frozen (stat: %v)", err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "a.txt")); err != nil || string(got) != "a" {
		t.Fatalf("a.txt = %q, %v; want it untouched", got, err)
	}
	tree, err := f.c.Tree(ctx)
	if err != nil || len(tree.Files) != 1 {
		t.Fatalf("Tree() while frozen = %+v, %v; want a.txt", tree, err)
	}
	if file, err := f.c.Read(ctx, "a.txt", ""); err != nil || file.Content != "a" {
		t.Fatalf("Read() while frozen = %+v, %v", file, err)
	}
	if err := f.c.Freeze(ctx, false); err != nil {
		t.Fatalf("Freeze(false) = %v", err)
	}
	if _, err := f.c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{{Path: "b.txt", Content: "b"}}}); err != nil {
		t.Fatalf("Apply() after thaw = %v", err)
	}
}
