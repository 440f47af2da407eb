package contract

import (
	"errors"
	"path"
	"strings"
	"testing"
)

func TestNormalizePath(t *testing.T) {
	const reject = "\x00reject" // sentinel: NormalizePath must fail
	tests := []struct {
		name string
		in   string
		want string
	}{
		// Every example of contract section 8.2.
		{"spec plain", "telo.yaml", "telo.yaml"},
		{"spec dot and double slash", "./app//telo.yaml", "app/telo.yaml"},
		{"spec inner dotdot", "a/../b.yaml", "b.yaml"},
		{"spec absolute", "/abs/x.yaml", "abs/x.yaml"},
		{"spec dotdot at root", "/../x.yaml", "x.yaml"},
		{"spec leading dotdot", "../x.yaml", reject},
		{"spec escapes after resolve", "a/../../x", reject},
		{"spec dotdot alone", "..", reject},
		{"spec dot alone", ".", reject},
		{"spec empty", "", reject},
		{"spec resolves to nothing", "a/..", reject},

		// Accepted odd inputs.
		{"nested", "a/b/c/d.yaml", "a/b/c/d.yaml"},
		{"many leading slashes", "///etc/passwd", "etc/passwd"},
		{"many dotdots at root", "/../../../etc/passwd", "etc/passwd"},
		{"dotdot at root mid path", "/a/../../b", "b"},
		{"dot segments everywhere", "./a/./b/./c", "a/b/c"},
		{"repeated slashes", "a////b", "a/b"},
		{"resolve deep", "a/b/c/../../d", "a/d"},
		{"resolve then descend", "a/b/../c/./d", "a/c/d"},
		{"triple dot is a name", "...", "..."},
		{"triple dot dir", ".../x", ".../x"},
		{"dotdot prefix name", "..a", "..a"},
		{"dotdot suffix name", "a..", "a.."},
		{"dotdot inside name", "a/..b/c", "a/..b/c"},
		{"hidden file", ".env", ".env"},
		{"hidden dir", ".git/config", ".git/config"},
		{"backslash traversal is a name", `..\..\etc\passwd`, `..\..\etc\passwd`},
		{"backslash mixed", `a\..\b`, `a\..\b`},
		{"backslash then slash dotdot", `a\b/../c`, "c"},
		{"windows drive", `C:\Windows\x`, `C:\Windows\x`},
		{"url encoded dotdot", "%2e%2e/x", "%2e%2e/x"},
		{"space segment", " /x", " /x"},
		{"dot space", ". /x", ". /x"},
		{"unicode", "répertoire/ファイル.yaml", "répertoire/ファイル.yaml"},
		{"unicode fullwidth dots", "\uff0e\uff0e/x", "\uff0e\uff0e/x"},
		{"newline in name", "a\nb", "a\nb"},
		{"absolute dot", "/./a", "a"},
		{"trailing dot segment", "a/.", "a"},
		{"trailing dotdot resolves", "a/b/..", "a"},
		{"tilde", "~/x", "~/x"},

		// Rejected odd inputs.
		{"slash only", "/", reject},
		{"slashes only", "////", reject},
		{"trailing slash", "a/", reject},
		{"trailing slash nested", "a/b/", reject},
		{"dot slash", "./", reject},
		{"dotdot slash", "../", reject},
		{"absolute resolves to root", "/a/..", reject},
		{"absolute dot only", "/.", reject},
		{"absolute dotdot only", "/..", reject},
		{"dots only", "./././.", reject},
		{"dotdot chain", "../../..", reject},
		{"dot then dotdot", "./../x", reject},
		{"escape after descend", "a/b/../../../x", reject},
		{"escape via dot segments", "a/./../.././x", reject},
		{"escape by double slash", "a//../../x", reject},
		{"nul only", "\x00", reject},
		{"nul in name", "a\x00b", reject},
		{"nul after valid", "telo.yaml\x00.png", reject},
		{"nul absolute", "/\x00", reject},
		{"trailing dotdot escapes", "a/../..", reject},
		{"long escape", strings.Repeat("a/", 10) + strings.Repeat("../", 11) + "x", reject},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NormalizePath(tt.in)
			if tt.want == reject {
				if err == nil {
					t.Fatalf("NormalizePath(%q) = %q, want error", tt.in, got)
				}
				var pe *PathError
				if !errors.As(err, &pe) || pe.Input != tt.in {
					t.Fatalf("NormalizePath(%q) error = %#v, want *PathError{Input: %q}", tt.in, err, tt.in)
				}
				return
			}
			if err != nil {
				t.Fatalf("NormalizePath(%q) error = %v, want %q", tt.in, err, tt.want)
			}
			if got != tt.want {
				t.Errorf("NormalizePath(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestPathErrorMessage(t *testing.T) {
	_, err := NormalizePath("../etc/passwd")
	got := err.Error()
	want := "invalid bundle relativePath '../etc/passwd'"
	if got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// modelNormalize is an independent model of NormalizePath built on
// path.Clean, which implements the same lexical rules except that it maps ""
// to "." and drops a trailing slash; both cases are rejected up front here.
func modelNormalize(p string) (string, bool) {
	if p == "" || strings.HasSuffix(p, "/") || strings.Contains(p, "\x00") {
		return "", false
	}
	c := strings.TrimLeft(path.Clean(p), "/")
	if c == "" || c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", false
	}
	return c, true
}

func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{
		"", ".", "..", "/", "telo.yaml", "./app//telo.yaml", "a/../b.yaml",
		"/abs/x.yaml", "/../x.yaml", "../x.yaml", "a/../../x", "a/..", "a/",
		"a\x00b", `..\x`, "...", "a/./b/../../c", "//a//b//", "/a/b/../../../c",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := NormalizePath(in)
		want, ok := modelNormalize(in)
		if ok != (err == nil) || got != want {
			t.Fatalf("NormalizePath(%q) = %q, %v; model = %q, ok %v", in, got, err, want, ok)
		}
		if err != nil {
			var pe *PathError
			if !errors.As(err, &pe) || pe.Input != in {
				t.Fatalf("NormalizePath(%q) error = %#v, want *PathError with the input", in, err)
			}
			return
		}
		if strings.HasPrefix(got, "/") {
			t.Fatalf("NormalizePath(%q) = %q, absolute", in, got)
		}
		if strings.Contains(got, "\x00") {
			t.Fatalf("NormalizePath(%q) = %q, contains NUL", in, got)
		}
		for seg := range strings.SplitSeq(got, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("NormalizePath(%q) = %q, has segment %q", in, got, seg)
			}
		}
		again, err := NormalizePath(got)
		if err != nil || again != got {
			t.Fatalf("NormalizePath(%q) = %q, %v; want idempotent %q", got, again, err, got)
		}
	})
}
