package wsserver_test

import (
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// outcome is what a traversal-corpus path must do on the path routes.
type outcome int

const (
	// rejected: 400 invalid_path everywhere, before any filesystem work.
	rejected outcome = iota
	// inside: a valid path; it names norm inside the root.
	inside
	// crossesLink: the directory part crosses a symbolic link; every
	// route fails.
	crossesLink
	// isLink: the path is a symbolic link; writes replace the link with a
	// regular file, deletes remove the link, reads and touches are 404.
	isLink
	// either: may succeed or fail (e.g. names the filesystem refuses);
	// only the sandbox invariants are checked.
	either
)

type traversalCase struct {
	name    string
	path    string
	outcome outcome
	norm    string // For inside; "{outside}" expands like in path.
}

// traversalCorpus: every entry is tried on write, delete, read, touch and
// blob against a fresh sandbox. "{outside}" is the sentinel directory's
// absolute path (and its root-relative form in norm).
var traversalCorpus = []traversalCase{
	{"parent", "../x", rejected, ""},
	{"inner escape", "a/../../x", rejected, ""},
	{"deep escape", "../../../../../../../../tmp/x", rejected, ""},
	{"dotdot", "..", rejected, ""},
	{"dot", ".", rejected, ""},
	{"empty", "", rejected, ""},
	{"resolves to nothing", "a/..", rejected, ""},
	{"dot then parent", "./../x", rejected, ""},
	{"resolved then escape", "a/b/c/../../../../x", rejected, ""},
	{"trailing slash", "a/", rejected, ""},
	{"slash only", "/", rejected, ""},
	{"NUL", "x\x00y", rejected, ""},
	{"NUL only", "\x00", rejected, ""},
	{"NUL hiding escape", "ok\x00/../../x", rejected, ""},
	{"absolute system file", "/etc/passwd", inside, "etc/passwd"},
	{"absolute double slashes", "//etc//shadow", inside, "etc/shadow"},
	{"absolute climbing", "/../x", inside, "x"},
	{"absolute deep climb", "/../../../../x", inside, "x"},
	{"absolute sentinel", "{outside}/secret", inside, "{outside}/secret"},
	{"absolute sentinel climb", "/../../{outside}/d/f", inside, "{outside}/d/f"},
	{"backslash traversal", `a\..\..\x`, inside, `a\..\..\x`},
	{"backslash parent", `..\x`, inside, `..\x`},
	{"backslash absolute", `\etc\passwd`, inside, `\etc\passwd`},
	{"dot slash doubles", "./a//b", inside, "a/b"},
	{"resolved inner parent", "a/./b/../c", inside, "a/c"},
	{"link then parent is lexical", "escape/../x", inside, "x"},
	{"unicode", "ünïcødé/日本語.yaml", inside, "ünïcødé/日本語.yaml"},
	{"fullwidth dots", "．．/x", inside, "．．/x"},
	{"three dots", "...", inside, "..."},
	{"four dots dir", "..../x", inside, "..../x"},
	{"percent-encoded parent", "%2e%2e/x", inside, "%2e%2e/x"},
	{"space", " ", inside, " "},
	{"newline", "a\nb", inside, "a\nb"},
	{"excluded dir", ".git/config", inside, ".git/config"},
	{"deep", strings.Repeat("d/", 60) + "f", inside, strings.Repeat("d/", 60) + "f"},
	{"segment too long", strings.Repeat("n", 256), either, ""},
	{"path too long", strings.Repeat(strings.Repeat("p", 250)+"/", 20) + "f", rejected, ""},
	{"path too deep", strings.Repeat("a/", 2049) + "f", rejected, ""},
	{"symlink dir out", "escape/pwned", crossesLink, ""},
	{"symlink dir out deep", "escape/new/deep/file", crossesLink, ""},
	{"symlink dir out existing", "escape/secret", crossesLink, ""},
	{"symlink dir out nested existing", "escape/d/f", crossesLink, ""},
	{"absolute symlink dir", "abslink/secret", crossesLink, ""},
	{"symlink to parent", "dotdot/outside/secret", crossesLink, ""},
	{"symlink to fs root", "rootlink/etc/passwd", crossesLink, ""},
	{"symlink dir inside", "inlink/file", crossesLink, ""},
	{"symlink file out", "secretlink", isLink, ""},
	{"absolute symlink file", "abssecret", isLink, ""},
	{"symlink dir itself", "escape", isLink, ""},
	{"symlink to parent itself", "dotdot", isLink, ""},
}

func TestTraversalCorpus(t *testing.T) {
	if len(traversalCorpus) < 30 {
		t.Fatalf("corpus has %d paths, want at least 30", len(traversalCorpus))
	}
	passwd, passwdErr := os.Stat("/etc/passwd")
	for _, tc := range traversalCorpus {
		for _, route := range []string{"write", "delete", "read", "touch", "blob"} {
			t.Run(tc.name+"/"+route, func(t *testing.T) {
				t.Parallel()
				sb := newSandbox(t)
				outsideRel := strings.TrimPrefix(filepath.ToSlash(sb.outside), "/")
				p := strings.ReplaceAll(tc.path, "{outside}", filepath.ToSlash(sb.outside))
				norm := strings.ReplaceAll(tc.norm, "{outside}", outsideRel)
				if tc.outcome == inside && route != "write" {
					writeFiles(t, sb.root, map[string]string{norm: "before\n"})
				}
				before := sb.describe(t)
				f := start(t, sb.root, nil)

				status, code, body := runRoute(t, f, route, p)
				t.Logf("%s %q: %d %s", route, p, status, body)

				sb.assertUnchanged(t, before)
				if passwdErr == nil {
					if now, err := os.Stat("/etc/passwd"); err != nil || !now.ModTime().Equal(passwd.ModTime()) || now.Size() != passwd.Size() {
						t.Fatalf("/etc/passwd changed")
					}
				}
				ok := status/100 == 2
				if route == "blob" {
					// No path is a hash: refused, whatever it spells.
					if ok {
						t.Fatalf("blob %q = %d, want a refusal", p, status)
					}
					return
				}
				switch tc.outcome {
				case rejected:
					if status != 400 || code != "invalid_path" {
						t.Fatalf("%s %q = %d %s, want 400 invalid_path", route, p, status, body)
					}
				case inside:
					checkInside(t, sb, route, norm, status, body)
				case crossesLink:
					if ok {
						t.Fatalf("%s %q = %d %s, want a failure (crosses a symlink)", route, p, status, body)
					}
					if (route == "read" || route == "touch") && status != 404 {
						t.Fatalf("%s %q = %d %s, want 404", route, p, status, body)
					}
				case isLink:
					checkLink(t, sb, route, p, status, body)
				case either:
					if ok && route == "write" {
						assertRootFile(t, sb, p, "pwned")
					}
				}
			})
		}
	}
}

func runRoute(t *testing.T, f *fixture, route, p string) (int, string, []byte) {
	t.Helper()
	switch route {
	case "write":
		return f.call(t, "POST", "/workspace", map[string]any{"write": []map[string]string{{"path": p, "content": "pwned"}}})
	case "delete":
		return f.call(t, "POST", "/workspace", map[string]any{"delete": []string{p}})
	case "read":
		return f.call(t, "GET", "/workspace/file?path="+url.QueryEscape(p), nil)
	case "touch":
		return f.call(t, "POST", "/workspace/touch", map[string]any{"paths": []string{p}})
	default:
		return f.call(t, "GET", "/workspace/blob/"+url.PathEscape(p), nil)
	}
}

func checkInside(t *testing.T, sb *sandbox, route, norm string, status int, body []byte) {
	t.Helper()
	if status != 200 {
		t.Fatalf("%s %q = %d %s, want 200", route, norm, status, body)
	}
	switch route {
	case "write":
		assertRootFile(t, sb, norm, "pwned")
	case "read":
		if !strings.Contains(string(body), `"content":"before\n"`) {
			t.Fatalf("read %q = %s, want the file made inside the root", norm, body)
		}
	case "touch":
		assertRootFile(t, sb, norm, "before\n")
	case "delete":
		if _, err := os.Lstat(filepath.Join(sb.root, filepath.FromSlash(norm))); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("delete %q left the file: %v", norm, err)
		}
	}
}

func checkLink(t *testing.T, sb *sandbox, route, name string, status int, body []byte) {
	t.Helper()
	full := filepath.Join(sb.root, name)
	switch route {
	case "write":
		if status != 200 {
			t.Fatalf("write %q = %d %s, want 200 (the link is replaced)", name, status, body)
		}
		assertRootFile(t, sb, name, "pwned")
	case "delete":
		if status != 200 {
			t.Fatalf("delete %q = %d %s, want 200 (the link is removed)", name, status, body)
		}
		if _, err := os.Lstat(full); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("delete %q left the link: %v", name, err)
		}
	default:
		if status != 404 {
			t.Fatalf("%s %q = %d %s, want 404 (a link is not a workspace file)", route, name, status, body)
		}
	}
}

// assertRootFile checks that norm is a regular file inside the root,
// reached without links, holding want.
func assertRootFile(t *testing.T, sb *sandbox, norm, want string) {
	t.Helper()
	root, err := os.OpenRoot(sb.root)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close() }()
	fi, err := root.Lstat(norm)
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("%q inside the root: %v, %v; want a regular file", norm, fi, err)
	}
	got, err := root.ReadFile(norm)
	if err != nil || string(got) != want {
		t.Fatalf("%q inside the root = %q, %v; want %q", norm, got, err, want)
	}
}
