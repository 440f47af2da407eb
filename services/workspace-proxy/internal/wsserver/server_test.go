package wsserver_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/wsapi"
	"github.com/telorunner/telorunner/services/workspace-proxy/internal/wsserver"
)

func treePaths(tr wsapi.Tree) []string {
	var out []string
	for _, f := range tr.Files {
		out = append(out, f.Path)
	}
	return out
}

func TestTree(t *testing.T) {
	sb := newSandbox(t)
	writeFiles(t, sb.root, map[string]string{
		"telo.yaml":             "kind: Application\n",
		"a/b.yaml":              "b\n",
		"a-b/c":                 "c\n",
		"a/node_modules/x/y.js": "excluded\n",
		"node_modules/z":        "excluded\n",
		".git/HEAD":             "ref: main\n",
		".telo/cache/m":         "excluded\n",
		"sub/deeper/.git":       "gitdir: elsewhere\n", // A file named .git is excluded too.
		"dist/out.js":           "kept\n",
	})
	if err := os.MkdirAll(filepath.Join(sb.root, "empty", "nested"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("telo.yaml", filepath.Join(sb.root, "link-in")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", filepath.Join(sb.root, "dirlink-in")); err != nil {
		t.Fatal(err)
	}
	f := start(t, sb.root, nil)

	got, err := f.c.Tree(t.Context())
	if err != nil {
		t.Fatalf("Tree() = %v", err)
	}
	// "a-b/c" sorts before "a/b.yaml" in byte order ('-' < '/'), although a
	// directory walk visits "a" first.
	want := []wsapi.TreeFile{
		{Path: "a-b/c", Hash: sha([]byte("c\n"))},
		{Path: "a/b.yaml", Hash: sha([]byte("b\n"))},
		{Path: "dist/out.js", Hash: sha([]byte("kept\n"))},
		{Path: "file.txt", Hash: sha([]byte("inside\n"))},
		{Path: "sub/file", Hash: sha([]byte("sub\n"))},
		{Path: "telo.yaml", Hash: sha([]byte("kind: Application\n"))},
	}
	if !reflect.DeepEqual(got.Files, want) {
		t.Fatalf("Tree() = %+v, want %+v", got.Files, want)
	}
}

func TestTreeExcludeOverride(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"node_modules/m.js": "m", "dist/d.js": "d", ".git/HEAD": "h", "x/dist": "file named dist"})
	tests := []struct {
		name    string
		exclude []string
		want    []string
	}{
		{"default", nil, []string{"dist/d.js", "x/dist"}},
		{"dist only", []string{"dist"}, []string{".git/HEAD", "node_modules/m.js"}},
		{"nothing", []string{}, []string{".git/HEAD", "dist/d.js", "node_modules/m.js", "x/dist"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, dir, tt.exclude)
			tr, err := f.c.Tree(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if got := treePaths(tr); !slices.Equal(got, tt.want) {
				t.Fatalf("Tree() paths = %q, want %q", got, tt.want)
			}
			snap, err := f.c.Snapshot(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var snapPaths []string
			for _, s := range snap {
				snapPaths = append(snapPaths, s.Path)
			}
			if !slices.Equal(snapPaths, tt.want) {
				t.Fatalf("Snapshot() paths = %q, want %q (same exclusions as the tree)", snapPaths, tt.want)
			}
		})
	}
}

func TestTreeEmpty(t *testing.T) {
	f := start(t, t.TempDir(), nil)
	status, _, body := f.call(t, "GET", "/workspace", nil)
	if status != 200 || strings.TrimSpace(string(body)) != `{"files":[]}` {
		t.Fatalf("GET /workspace = %d %s, want 200 {\"files\":[]}", status, body)
	}
	status, _, body = f.call(t, "GET", "/workspace/snapshot", nil)
	if status != 200 || strings.TrimSpace(string(body)) != `{"files":[]}` {
		t.Fatalf("GET /workspace/snapshot = %d %s, want 200 {\"files\":[]}", status, body)
	}
}

// An in-place rewrite keeps inode and size; the tree must still see it
// (the hash cache may not serve a stale hash).
func TestTreeSeesInPlaceRewrite(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"f": "aaaa"})
	f := start(t, dir, nil)
	for i, content := range []string{"bbbb", "cccc", "dddd"} {
		if _, err := f.c.Tree(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tr, err := f.c.Tree(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got, want := tr.Files[0].Hash, sha([]byte(content)); got != want {
			t.Fatalf("round %d: Tree() hash = %s, want %s", i, got, want)
		}
	}
}

func TestApply(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"old.yaml": "old", "gone/a/b": "x", "gone/c": "y", "keep.txt": "keep"})
	if err := os.Chmod(filepath.Join(dir, "keep.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := start(t, dir, nil)
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	res, err := f.c.Apply(t.Context(), wsapi.ChangeSet{
		Write: []wsapi.WriteOp{
			{Path: "new/deep/dir/telo.yaml", Content: "name: x\n"},
			{Path: "old.yaml", Content: "new", Encoding: wsapi.EncodingUTF8},
			{Path: "bin/all.bytes", Content: base64.StdEncoding.EncodeToString(binary), Encoding: wsapi.EncodingBase64},
			{Path: "keep.txt", Content: "kept, still executable"},
			{Path: "empty", Content: ""},
		},
		Delete: []string{"gone", "never-existed", "also/never/existed", "keep.txt/below-a-file"},
	})
	if err != nil {
		t.Fatalf("Apply() = %v", err)
	}
	if want := (wsapi.ApplyResult{Written: 5, Deleted: 4}); res != want {
		t.Fatalf("Apply() = %+v, want %+v", res, want)
	}
	for p, want := range map[string][]byte{
		"new/deep/dir/telo.yaml": []byte("name: x\n"),
		"old.yaml":               []byte("new"),
		"bin/all.bytes":          binary,
		"keep.txt":               []byte("kept, still executable"),
		"empty":                  {},
	} {
		got, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(got) != string(want) {
			t.Fatalf("file %s = %q, %v; want %q", p, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "keep.txt")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("keep.txt mode = %v, %v; want 0755 kept across the rewrite", fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "gone")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("gone/ still there after a recursive delete: %v", err)
	}
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Fatalf("temporary files left behind: %q", left)
	}

	// Deleting again is success.
	res, err = f.c.Apply(t.Context(), wsapi.ChangeSet{Delete: []string{"gone", "gone"}})
	if err != nil || res != (wsapi.ApplyResult{Deleted: 2}) {
		t.Fatalf("Apply(delete absent) = %+v, %v; want {0 2}, nil", res, err)
	}
	// An empty change set is fine.
	res, err = f.c.Apply(t.Context(), wsapi.ChangeSet{})
	if err != nil || res != (wsapi.ApplyResult{}) {
		t.Fatalf("Apply(empty) = %+v, %v", res, err)
	}
	// Base64 round-trips through the read route too.
	file, err := f.c.Read(t.Context(), "bin/all.bytes", wsapi.EncodingBase64)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := base64.StdEncoding.DecodeString(file.Content); string(got) != string(binary) || file.Size != 256 {
		t.Fatalf("Read(base64) = %d bytes (size %d), want the 256 written", len(got), file.Size)
	}
}

// Writes to a file being replaced must never be observed half-written,
// and a listing never shows temporary files.
func TestApplyConcurrentWithTree(t *testing.T) {
	dir := t.TempDir()
	f := start(t, dir, nil)
	contents := map[string]bool{}
	for i := range 20 {
		contents[sha([]byte(strings.Repeat(fmt.Sprint(i), 10000)))] = true
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				n := (i + w) % 20
				_, err := f.c.Apply(ctx, wsapi.ChangeSet{Write: []wsapi.WriteOp{{Path: "hot/file", Content: strings.Repeat(fmt.Sprint(n), 10000)}}})
				if err != nil && ctx.Err() == nil {
					t.Errorf("Apply() = %v", err)
					return
				}
			}
		})
	}
	for range 50 {
		tr, err := f.c.Tree(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range tr.Files {
			if file.Path != "hot/file" || !contents[file.Hash] {
				t.Errorf("Tree() lists %s %s: not a complete written file", file.Path, file.Hash)
			}
		}
		snap, err := f.c.Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range snap {
			if file.Path != "hot/file" || !contents[file.Hash] {
				t.Errorf("Snapshot() lists %s %s: not a complete written file", file.Path, file.Hash)
			}
		}
	}
	cancel()
	wg.Wait()
	f.ts.Close() // Waits for handlers still writing after their client gave up.
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Fatalf("temporary files left behind: %q", left)
	}
}

func TestApplyRejects(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		wantStatus int
		wantCode   string
	}{
		{"not JSON", `{"write":`, 400, "invalid_request"},
		{"not an object", `[1,2]`, 400, "invalid_request"},
		{"trailing data", `{} {}`, 400, "invalid_request"},
		{"empty body", ``, 400, "invalid_request"},
		{"path missing", `{"write":[{"content":"x"}]}`, 400, "invalid_request"},
		{"content missing", `{"write":[{"path":"ok"}]}`, 400, "invalid_request"},
		{"path not a string", `{"write":[{"path":1,"content":"x"}]}`, 400, "invalid_request"},
		{"bad encoding", `{"write":[{"path":"ok","content":"x","encoding":"hex"}]}`, 400, "invalid_request"},
		{"bad base64", `{"write":[{"path":"ok","content":"!!!","encoding":"base64"}]}`, 400, "invalid_request"},
		{"delete null", `{"delete":[null]}`, 400, "invalid_request"},
		{"second write path invalid", `{"write":[{"path":"ok","content":"x"},{"path":"../x","content":"x"}]}`, 400, "invalid_path"},
		{"delete path invalid", `{"write":[{"path":"ok","content":"x"}],"delete":["/"]}`, 400, "invalid_path"},
		{"empty path", `{"write":[{"path":"","content":"x"}]}`, 400, "invalid_path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			f := start(t, dir, nil)
			status, code, body := f.call(t, "POST", "/workspace", tt.body)
			if status != tt.wantStatus || code != tt.wantCode {
				t.Fatalf("POST /workspace %s = %d %s, want %d %s", tt.body, status, body, tt.wantStatus, tt.wantCode)
			}
			// A refused request applies nothing, not even its valid writes.
			if _, err := os.Lstat(filepath.Join(dir, "ok")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("refused change set wrote ok: %v", err)
			}
		})
	}
}

func TestApplyBodyLimit(t *testing.T) {
	f := start(t, t.TempDir(), nil)
	body := io.MultiReader(
		strings.NewReader(`{"write":[{"path":"big","content":"`),
		io.LimitReader(repeatReader('a'), wsserver.MaxBodyBytes),
		strings.NewReader(`"}]}`),
	)
	status, code, _ := f.call(t, "POST", "/workspace", body)
	if status != http.StatusRequestEntityTooLarge || code != "payload_too_large" {
		t.Fatalf("POST /workspace over 64 MiB = %d %s, want 413 payload_too_large", status, code)
	}
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

// Not transactional: a failing write leaves the earlier ones applied.
func TestApplyPartialFailure(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"plain": "a file", "adir/x": "x"})
	f := start(t, dir, nil)
	for _, bad := range []string{"plain/child", "adir"} {
		_, err := f.c.Apply(t.Context(), wsapi.ChangeSet{Write: []wsapi.WriteOp{
			{Path: "first", Content: bad},
			{Path: bad, Content: "cannot be written"},
			{Path: "third", Content: "never reached"},
		}})
		var we *wsapi.Error
		if !errors.As(err, &we) || we.Status != 500 || we.Code != "write_failed" {
			t.Fatalf("Apply(write %s) = %v, want 500 write_failed", bad, err)
		}
		if got, err := os.ReadFile(filepath.Join(dir, "first")); err != nil || string(got) != bad {
			t.Fatalf("first write = %q, %v; want it applied", got, err)
		}
		if _, err := os.Lstat(filepath.Join(dir, "third")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("third write applied after a failure: %v", err)
		}
	}
	if left := tempFiles(t, dir); len(left) > 0 {
		t.Fatalf("temporary files left behind: %q", left)
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a/t.yaml": "héllo\n", "d/x": "x"})
	f := start(t, dir, nil)

	got, err := f.c.Read(t.Context(), "a/t.yaml", "")
	if want := (wsapi.File{Content: "héllo\n", Size: 7}); err != nil || got != want {
		t.Fatalf("Read(utf8) = %+v, %v; want %+v", got, err, want)
	}
	got, err = f.c.Read(t.Context(), "/a//./t.yaml", wsapi.EncodingBase64)
	if want := (wsapi.File{Content: base64.StdEncoding.EncodeToString([]byte("héllo\n")), Size: 7}); err != nil || got != want {
		t.Fatalf("Read(base64, unnormalized path) = %+v, %v; want %+v", got, err, want)
	}

	tests := []struct {
		name, target string
		wantStatus   int
		wantCode     string
	}{
		{"missing", "/workspace/file?path=nope.yaml", 404, "file_not_found"},
		{"missing parent", "/workspace/file?path=nope/x", 404, "file_not_found"},
		{"parent is a file", "/workspace/file?path=a/t.yaml/x", 404, "file_not_found"},
		{"directory", "/workspace/file?path=d", 404, "file_not_found"},
		{"no path", "/workspace/file", 400, "invalid_path"},
		{"empty path", "/workspace/file?path=", 400, "invalid_path"},
		{"escaping path", "/workspace/file?path=../x", 400, "invalid_path"},
		{"bad encoding", "/workspace/file?path=a/t.yaml&encoding=hex", 400, "invalid_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, code, body := f.call(t, "GET", tt.target, nil)
			if status != tt.wantStatus || code != tt.wantCode {
				t.Fatalf("GET %s = %d %s, want %d %s", tt.target, status, body, tt.wantStatus, tt.wantCode)
			}
		})
	}
	if _, err := f.c.Read(t.Context(), "nope", ""); !wsapi.IsNotFound(err) {
		t.Fatalf("Read(missing) = %v, want IsNotFound", err)
	}
}

func TestSnapshot(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"telo.yaml": "a", "b/c.bin": "\x00\xff\xfe binary", "node_modules/x": "no"})
	for i := range 30 { // More files than the read concurrency.
		writeFiles(t, dir, map[string]string{fmt.Sprintf("many/%02d", i): strings.Repeat("z", i)})
	}
	f := start(t, dir, nil)
	tr, err := f.c.Tree(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	snap, err := f.c.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap) != len(tr.Files) {
		t.Fatalf("Snapshot() has %d files, Tree() %d", len(snap), len(tr.Files))
	}
	for i, s := range snap {
		content, err := base64.StdEncoding.DecodeString(s.Content)
		if err != nil || s.Encoding != "base64" {
			t.Fatalf("Snapshot()[%d] encoding %q, content %v", i, s.Encoding, err)
		}
		want, err := os.ReadFile(filepath.Join(dir, s.Path))
		if err != nil || string(content) != string(want) {
			t.Fatalf("Snapshot() %s = %q, want %q", s.Path, content, want)
		}
		if s.Path != tr.Files[i].Path || s.Hash != tr.Files[i].Hash || s.Hash != sha(content) {
			t.Fatalf("Snapshot()[%d] = %s %s, Tree() = %+v", i, s.Path, s.Hash, tr.Files[i])
		}
	}
}

func TestTouch(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"app/telo.yaml": "kind: Application\n", "other.yaml": "o"})
	old := time.Now().Add(-time.Hour)
	for _, p := range []string{"app/telo.yaml", "other.yaml"} {
		if err := os.Chtimes(filepath.Join(dir, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "app/telo.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(filepath.Join(dir, "app/telo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, dir, nil)

	n, err := f.c.Touch(t.Context(), []string{"/app/telo.yaml"})
	if err != nil || n != 1 {
		t.Fatalf("Touch() = %d, %v; want 1, nil", n, err)
	}
	after, err := os.Stat(filepath.Join(dir, "app/telo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if os.SameFile(before, after) {
		t.Fatal("Touch() kept the inode; file watchers need a new one")
	}
	if !after.ModTime().After(old.Add(time.Minute)) {
		t.Fatalf("Touch() mtime = %v, want newer than %v", after.ModTime(), old)
	}
	if after.Mode().Perm() != 0o600 {
		t.Fatalf("Touch() mode = %v, want 0600 kept", after.Mode())
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "app/telo.yaml")); string(got) != "kind: Application\n" {
		t.Fatalf("Touch() changed the bytes to %q", got)
	}

	// A missing path fails before anything is touched.
	otherBefore, _ := os.Stat(filepath.Join(dir, "other.yaml"))
	_, err = f.c.Touch(t.Context(), []string{"other.yaml", "missing.yaml"})
	if !wsapi.IsNotFound(err) {
		t.Fatalf("Touch(missing) = %v, want file_not_found", err)
	}
	if otherAfter, _ := os.Stat(filepath.Join(dir, "other.yaml")); !os.SameFile(otherBefore, otherAfter) {
		t.Fatal("Touch() touched other.yaml although the request failed")
	}
	for _, body := range []string{`{"paths":["../x"]}`, `{"paths":[""]}`} {
		if status, code, _ := f.call(t, "POST", "/workspace/touch", body); status != 400 || code != "invalid_path" {
			t.Fatalf("POST /workspace/touch %s = %d %s, want 400 invalid_path", body, status, code)
		}
	}
	if status, code, _ := f.call(t, "POST", "/workspace/touch", `{"paths":"x"}`); status != 400 || code != "invalid_request" {
		t.Fatalf("POST /workspace/touch bad body = %d %s, want 400 invalid_request", status, code)
	}
}

func TestBlob(t *testing.T) {
	sb := newSandbox(t)
	writeFiles(t, sb.root, map[string]string{"a.yaml": "alpha", "dup1": "same", "dup2": "same", ".git/HEAD": "only in git"})
	f := start(t, sb.root, nil)
	tr, err := f.c.Tree(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range tr.Files {
		got, err := f.c.Blob(t.Context(), file.Hash)
		want, _ := os.ReadFile(filepath.Join(sb.root, file.Path))
		if err != nil || string(got) != string(want) {
			t.Fatalf("Blob(%s of %s) = %q, %v; want %q", file.Hash, file.Path, got, err, want)
		}
	}
	// A file written after the last tree is found by walking again.
	if err := os.WriteFile(filepath.Join(sb.root, "a.yaml"), []byte("beta"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := f.c.Blob(t.Context(), sha([]byte("beta"))); err != nil || string(got) != "beta" {
		t.Fatalf("Blob(new content) = %q, %v; want beta", got, err)
	}
	for name, hash := range map[string]string{
		"replaced content":          sha([]byte("alpha")),
		"unknown":                   sha([]byte("never written")),
		"excluded file":             sha([]byte("only in git")),
		"sentinel outside via link": sha([]byte("top secret\n")),
	} {
		if _, err := f.c.Blob(t.Context(), hash); !wsapi.IsNotFound(err) {
			t.Fatalf("Blob(%s) = %v, want file_not_found", name, err)
		}
	}
	for _, bad := range []string{"abc", strings.Repeat("g", 64), strings.Repeat("a", 65)} {
		if status, code, _ := f.call(t, "GET", "/workspace/blob/"+bad, nil); status != 400 || code != "invalid_request" {
			t.Fatalf("GET /workspace/blob/%s = %d %s, want 400 invalid_request", bad, status, code)
		}
	}
}

func TestHealth(t *testing.T) {
	f := start(t, t.TempDir(), nil)
	if err := f.c.Health(t.Context()); err != nil {
		t.Fatalf("Health() = %v", err)
	}
}

func TestNewRejects(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	writeFiles(t, filepath.Dir(file), map[string]string{"file": "x"})
	tests := []struct {
		name string
		opts wsserver.Options
	}{
		{"no dir", wsserver.Options{}},
		{"missing dir", wsserver.Options{Dir: filepath.Join(t.TempDir(), "missing")}},
		{"dir is a file", wsserver.Options{Dir: file}},
		{"exclude with slash", wsserver.Options{Dir: t.TempDir(), Exclude: []string{"a/b"}}},
		{"exclude empty name", wsserver.Options{Dir: t.TempDir(), Exclude: []string{""}}},
		{"exclude dotdot", wsserver.Options{Dir: t.TempDir(), Exclude: []string{".."}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if srv, err := wsserver.New(tt.opts); err == nil {
				_ = srv.Close()
				t.Fatalf("New(%+v) = nil error, want one", tt.opts)
			}
		})
	}
}

func TestServeStopsOnCancel(t *testing.T) {
	srv, err := wsserver.New(wsserver.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	c := wsapi.New("http://"+ln.Addr().String(), &http.Client{Transport: &http.Transport{}})
	if err := c.Health(t.Context()); err != nil {
		t.Fatalf("Health() = %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve() = %v, want nil after cancel", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve() did not return after cancel")
	}
	if err := c.Health(t.Context()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Health() after shutdown = %v, want connection refused", err)
	}
}
