package wsserver_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/telorunner/telorunner/pkg/wsapi"
	"github.com/telorunner/telorunner/services/workspace-proxy/internal/wsserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a workspace server over dir behind a real HTTP listener.
type fixture struct {
	dir string
	srv *wsserver.Server
	ts  *httptest.Server
	c   *wsapi.Client
}

func start(t *testing.T, dir string, exclude []string) *fixture {
	t.Helper()
	srv, err := wsserver.New(wsserver.Options{Dir: dir, Exclude: exclude})
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		_ = srv.Close()
	})
	return &fixture{dir: dir, srv: srv, ts: ts, c: wsapi.New(ts.URL, ts.Client())}
}

// call sends a raw request without following redirects and returns the
// status, the "error" code of a JSON failure and the body.
func (f *fixture) call(t *testing.T, method, target string, body any) (int, string, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case io.Reader:
		rd = b
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, f.ts.URL+target, rd)
	if err != nil {
		t.Fatal(err)
	}
	hc := *f.ts.Client()
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var env struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(raw, &env)
	return resp.StatusCode, env.Error, raw
}

// writeFiles creates files (and parents) under dir.
func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// tempFiles lists the server's temporary files left under dir.
func tempFiles(t testing.TB, dir string) []string {
	t.Helper()
	var left []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".wsserver-") {
			left = append(left, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return left
}

// sandbox is a workspace root next to a sentinel directory it must never
// touch, with symbolic links from inside the root pointing out of it:
//
//	top/outer/outside/secret, top/outer/outside/d/f   sentinel
//	top/outer/root/file.txt, root/sub/file           ordinary files
//	root/escape    -> ../outside        (relative, leaves the root)
//	root/abslink   -> <abs>/outside     (absolute)
//	root/secretlink-> ../outside/secret (file, leaves the root)
//	root/abssecret -> <abs>/outside/secret
//	root/dotdot    -> ..
//	root/rootlink  -> /
//	root/inlink    -> sub               (stays inside)
//
// Escapes of up to two levels land in top, which describe watches.
type sandbox struct {
	top, root, outside string
}

func newSandbox(t testing.TB) *sandbox {
	t.Helper()
	top := t.TempDir()
	sb := &sandbox{
		top:     top,
		root:    filepath.Join(top, "outer", "root"),
		outside: filepath.Join(top, "outer", "outside"),
	}
	writeFiles(t, sb.outside, map[string]string{"secret": "top secret\n", "d/f": "deep\n"})
	if err := os.MkdirAll(sb.root, 0o755); err != nil {
		t.Fatal(err)
	}
	sb.restore(t)
	return sb
}

// links are the sandbox's symbolic links, by name inside the root.
func (sb *sandbox) links() map[string]string {
	return map[string]string{
		"escape":     "../outside",
		"abslink":    sb.outside,
		"secretlink": "../outside/secret",
		"abssecret":  filepath.Join(sb.outside, "secret"),
		"dotdot":     "..",
		"rootlink":   "/",
		"inlink":     "sub",
	}
}

// restore puts the root's fixtures back after a test changed them.
func (sb *sandbox) restore(t testing.TB) {
	t.Helper()
	for p, content := range map[string]string{"file.txt": "inside\n", "sub/file": "sub\n"} {
		full := filepath.Join(sb.root, filepath.FromSlash(p))
		for _, q := range []string{filepath.Dir(full), full} {
			fi, err := os.Lstat(q)
			if err == nil && (q == full) == fi.IsDir() { // A fuzz run turned a file into a directory or back.
				if err := os.RemoveAll(q); err != nil {
					t.Fatal(err)
				}
			}
		}
		writeFiles(t, sb.root, map[string]string{p: content})
	}
	for name, target := range sb.links() {
		p := filepath.Join(sb.root, name)
		if got, err := os.Readlink(p); err == nil && got == target {
			continue
		}
		if err := os.RemoveAll(p); err != nil { // The link itself, or what replaced it inside the root.
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
}

// describe renders everything under top except the root's subtree: names,
// types, modes, sizes, mtimes, link targets and content hashes.
func (sb *sandbox) describe(t testing.TB) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(sb.top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == sb.root {
			return fs.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v", p, fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %d %d %s", fi.Size(), fi.ModTime().UnixNano(), sha(b))
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func (sb *sandbox) assertUnchanged(t testing.TB, before string) {
	t.Helper()
	if after := sb.describe(t); after != before {
		t.Fatalf("outside the root changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
