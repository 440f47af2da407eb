package wsserver_test

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/telorunner/telorunner/pkg/merkle"
	"github.com/telorunner/telorunner/pkg/wsapi"
)

// root walks the workspace through GET /workspace/node and returns the
// root's hash and node.
func root(t *testing.T, c *wsapi.Client) (string, merkle.Node) {
	t.Helper()
	data, err := c.Root(t.Context())
	if err != nil {
		t.Fatalf("Root() = %v", err)
	}
	n, err := merkle.Decode(data)
	if err != nil {
		t.Fatalf("root node %s: %v", data, err)
	}
	return merkle.Hash(data), n
}

// flatten lists every file of the tree rooted at h through
// GET /workspace/node/{hash}, by path.
func flatten(t *testing.T, c *wsapi.Client, h string) map[string]merkle.File {
	t.Helper()
	get := func(ctx context.Context, h string) (merkle.Node, error) {
		data, err := c.Node(ctx, h)
		if err != nil {
			return merkle.Node{}, err
		}
		return merkle.DecodeAs(h, data)
	}
	flat, err := merkle.Flatten(t.Context(), h, get, 2)
	if err != nil {
		t.Fatalf("Flatten() = %v", err)
	}
	files := map[string]merkle.File{}
	for _, f := range flat {
		files[f.Path] = f
	}
	return files
}

func TestNodes(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"telo.yaml":            "kind: Application\n",
		"bin/run.sh":           "#!/bin/sh\necho hi\n",
		"src/a/x.yaml":         "x: 1\n",
		"src/b/y.yaml":         "y: 2\n",
		"node_modules/skip.js": "skipped",
		"src/.git/config":      "skipped",
	})
	if err := os.Chmod(filepath.Join(dir, "bin", "run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("telo.yaml", filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "empty", "deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := start(t, dir, nil)

	h1, n1 := root(t, f.c)
	var names []string
	for _, e := range n1.Entries {
		names = append(names, e.Name+":"+e.Kind)
	}
	// No excluded name, no symbolic link, no directory without files.
	if want := []string{"bin:dir", "src:dir", "telo.yaml:file"}; !slices.Equal(names, want) {
		t.Fatalf("root entries = %v, want %v", names, want)
	}
	if files, size := n1.Totals(); files != 4 || size != int64(len("kind: Application\n#!/bin/sh\necho hi\nx: 1\ny: 2\n")) {
		t.Fatalf("root totals = %d files, %d bytes", files, size)
	}
	got := flatten(t, f.c, h1)
	want := map[string]merkle.File{
		"telo.yaml":    {Path: "telo.yaml", Hash: sha([]byte("kind: Application\n")), Size: 18, Mode: 0o644},
		"bin/run.sh":   {Path: "bin/run.sh", Hash: sha([]byte("#!/bin/sh\necho hi\n")), Size: 18, Mode: 0o755},
		"src/a/x.yaml": {Path: "src/a/x.yaml", Hash: sha([]byte("x: 1\n")), Size: 5, Mode: 0o644},
		"src/b/y.yaml": {Path: "src/b/y.yaml", Hash: sha([]byte("y: 2\n")), Size: 5, Mode: 0o644},
	}
	if len(got) != len(want) {
		t.Fatalf("tree files = %v, want %v", got, want)
	}
	for p, w := range want {
		if got[p] != w {
			t.Fatalf("tree file %s = %+v, want %+v", p, got[p], w)
		}
	}

	// One changed file changes the nodes on its path only.
	writeFiles(t, dir, map[string]string{"src/a/x.yaml": "x: 2\n"})
	h2, n2 := root(t, f.c)
	bin1, _ := n1.Lookup("bin")
	bin2, _ := n2.Lookup("bin")
	src1, _ := n1.Lookup("src")
	src2, _ := n2.Lookup("src")
	if h2 == h1 || bin2 != bin1 || src2.Hash == src1.Hash {
		t.Fatalf("after editing src/a/x.yaml: root changed %v, bin same %v, src changed %v; want true, true, true", h2 != h1, bin2 == bin1, src2.Hash != src1.Hash)
	}
	// The previous walk's nodes are still served (a checkpoint may be
	// reading them); unknown or malformed hashes are not.
	if _, err := f.c.Node(t.Context(), src1.Hash); err != nil {
		t.Fatalf("Node(previous walk's src) = %v", err)
	}
	if _, err := f.c.Node(t.Context(), sha([]byte("nothing"))); !wsapi.IsNotFound(err) {
		t.Fatalf("Node(unknown) = %v, want file_not_found", err)
	}
	if status, code, _ := f.call(t, http.MethodGet, "/workspace/node/xyz", nil); status != http.StatusBadRequest || code != "invalid_request" {
		t.Fatalf("GET /workspace/node/xyz = %d %s, want 400 invalid_request", status, code)
	}

	// A mode change alone changes the tree.
	if err := os.Chmod(filepath.Join(dir, "telo.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	h3, n3 := root(t, f.c)
	telo, _ := n3.Lookup("telo.yaml")
	if h3 == h2 || telo.Mode != 0o755 || telo.Hash != want["telo.yaml"].Hash {
		t.Fatalf("after chmod: root changed %v, telo.yaml %+v; want a new root, mode 0755, same content", h3 != h2, telo)
	}
	// An unchanged tree is the same root.
	if h4, _ := root(t, f.c); h4 != h3 {
		t.Fatalf("root of an unchanged tree = %s, then %s", h3, h4)
	}
	// A node is served for 8 walks after the last that produced it (the
	// first walk's src: walk 1 of 4 so far), then dropped.
	if _, err := f.c.Node(t.Context(), src1.Hash); err != nil {
		t.Fatalf("Node(src of walk 1) after 4 walks = %v", err)
	}
	for range 5 {
		root(t, f.c)
	}
	if _, err := f.c.Node(t.Context(), src1.Hash); !wsapi.IsNotFound(err) {
		t.Fatalf("Node(src of walk 1) after 9 walks = %v, want file_not_found", err)
	}
	if _, err := f.c.Node(t.Context(), bin1.Hash); err != nil {
		t.Fatalf("Node(bin, produced by every walk) = %v", err)
	}
}

func TestNodesEmpty(t *testing.T) {
	f := start(t, t.TempDir(), nil)
	h, n := root(t, f.c)
	if len(n.Entries) != 0 || h != merkle.Hash([]byte(`{"entries":[]}`)) {
		t.Fatalf("root of an empty workspace = %s %+v", h, n)
	}
}

func TestApplyMode(t *testing.T) {
	dir := t.TempDir()
	f := start(t, dir, nil)
	ctx := t.Context()
	perm := func(p string) fs.FileMode {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	cs := wsapi.ChangeSet{Write: []wsapi.WriteOp{
		{Path: "run.sh", Content: "#!/bin/sh\n", Mode: 0o750},
		{Path: "plain.txt", Content: "plain"},
		{Path: "secret", Content: "s", Mode: 0o600},
	}}
	if _, err := f.c.Apply(ctx, cs); err != nil {
		t.Fatalf("Apply() = %v", err)
	}
	for p, want := range map[string]fs.FileMode{"run.sh": 0o750, "plain.txt": 0o644, "secret": 0o600} {
		if got := perm(p); got != want {
			t.Fatalf("mode of %s = %o, want %o", p, got, want)
		}
	}
	// Without a mode a rewrite keeps the file's; with one it sets it.
	if _, err := f.c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{{Path: "run.sh", Content: "#!/bin/sh\necho\n"}}}); err != nil {
		t.Fatal(err)
	}
	if got := perm("run.sh"); got != 0o750 {
		t.Fatalf("mode after a rewrite without mode = %o, want 750", got)
	}
	if _, err := f.c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{{Path: "run.sh", Content: "#!/bin/sh\n", Mode: 0o644}}}); err != nil {
		t.Fatal(err)
	}
	if got := perm("run.sh"); got != 0o644 {
		t.Fatalf("mode after a rewrite with mode 644 = %o", got)
	}
	// Only permission bits; nothing of a refused change set is applied.
	body := map[string]any{"write": []map[string]any{{"path": "ok.txt", "content": "x"}, {"path": "bad", "content": "x", "mode": 0o4755}}}
	if status, code, _ := f.call(t, http.MethodPost, "/workspace", body); status != http.StatusBadRequest || code != "invalid_request" {
		t.Fatalf("apply with mode 04755 = %d %s, want 400 invalid_request", status, code)
	}
	if _, err := os.Lstat(filepath.Join(dir, "ok.txt")); !os.IsNotExist(err) {
		t.Fatalf("ok.txt after a refused change set: %v, want absent", err)
	}
}

// A file whose name is not UTF-8 cannot be named in JSON: the tree leaves
// it out rather than fail every checkpoint of the workspace.
func TestNodesSkipNonUTF8Names(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"ok.txt": "ok", "d/bad\xff.txt": "bad", "d/bad\xfe.txt": "bad"})
	f := start(t, dir, nil)
	h, n := root(t, f.c)
	if len(n.Entries) != 1 || n.Entries[0].Name != "ok.txt" {
		t.Fatalf("root = %+v, want ok.txt only", n)
	}
	if got := flatten(t, f.c, h); len(got) != 1 {
		t.Fatalf("tree = %v, want ok.txt only", got)
	}
}
