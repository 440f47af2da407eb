package imagemap

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRepository(t *testing.T) {
	tests := []struct{ in, want string }{
		{"busybox", "busybox"},
		{"busybox:stable", "busybox"},
		{"docker.io/library/busybox:1.36", "docker.io/library/busybox"},
		{"localhost:5000/telo/app", "localhost:5000/telo/app"},
		{"localhost:5000/telo/app:abc", "localhost:5000/telo/app"},
		{"ghcr.io/x/y@sha256:0123", "ghcr.io/x/y"},
		{"ghcr.io/x/y:tag@sha256:0123", "ghcr.io/x/y"},
	}
	for _, tt := range tests {
		if got := Repository(tt.in); got != tt.want {
			t.Errorf("Repository(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseAndLookup(t *testing.T) {
	dir := t.TempDir()
	exe := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sh, exact, any := exe("sh"), exe("exact"), exe("any")

	m, err := Parse("busybox=" + sh + ", registry:5000/telo:v1=" + exact + ",*=" + any)
	if err != nil {
		t.Fatalf("Parse() error = %v", err)
	}
	tests := []struct{ image, want string }{
		{"busybox", sh},
		{"busybox:stable", sh},
		{"busybox@sha256:00", sh},
		{"registry:5000/telo:v1", exact},
		{"registry:5000/telo:v2", any},
		{"other", any},
	}
	for _, tt := range tests {
		if got, ok := m.Lookup(tt.image); !ok || got != tt.want {
			t.Errorf("Lookup(%q) = %q, %v, want %q", tt.image, got, ok, tt.want)
		}
	}

	noWildcard, err := Parse("busybox=" + sh)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := noWildcard.Lookup("nginx:1"); ok {
		t.Errorf("Lookup(nginx:1) = %q, true, want unmapped", got)
	}
}

func TestParseErrors(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "data")
	if err := os.WriteFile(notExec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{
		"busybox",
		"=/bin/sh",
		"busybox=",
		"busybox=/bin/sh,busybox=/bin/sh",
		"x=" + filepath.Join(dir, "missing"),
		"x=" + notExec,
		"x=" + dir,
	} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) error = nil, want an error", in)
		}
	}
	m, err := Parse("")
	if err != nil || len(m) != 0 {
		t.Errorf("Parse(\"\") = %v, %v, want empty map", m, err)
	}
	if m, err := Parse("sh=sh"); err != nil || !filepath.IsAbs(m["sh"]) {
		t.Errorf("Parse(sh=sh) = %v, %v, want an absolute path from PATH", m, err)
	}
}

// TestStage: every program lands in its own 0755 directory under its own
// name, readable and runnable by anyone; a program everyone may run
// already is hard-linked, a private one copied, a symbolic link resolved;
// the originals are untouched and a second Stage starts afresh.
func TestStage(t *testing.T) {
	src := t.TempDir()
	write := func(name string, mode os.FileMode, body string) string {
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	public := write("telo", 0o755, "#!/bin/sh\necho public\n")
	private := write("private", 0o700, "#!/bin/sh\necho private\n")
	link := filepath.Join(src, "sh")
	if err := os.Symlink("telo", link); err != nil {
		t.Fatal(err)
	}
	m := Map{"a": public, "a2": public, "b": private, "c": link}
	dir := filepath.Join(t.TempDir(), "images")
	if err := os.MkdirAll(filepath.Join(dir, "stale"), 0o700); err != nil {
		t.Fatal(err)
	}
	got, err := m.Stage(dir)
	if err != nil {
		t.Fatalf("Stage() = %v", err)
	}
	// Distinct programs in path order: private, sh, telo.
	want := Map{
		"a": filepath.Join(dir, "2", "telo"), "a2": filepath.Join(dir, "2", "telo"),
		"b": filepath.Join(dir, "0", "private"), "c": filepath.Join(dir, "1", "sh"),
	}
	if len(got) != len(want) {
		t.Fatalf("Stage() = %v, want %v", got, want)
	}
	for image, p := range want {
		if got[image] != p {
			t.Errorf("Stage()[%q] = %q, want %q", image, got[image], p)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "stale")); !os.IsNotExist(err) {
		t.Errorf("stale entry: err = %v, want it removed", err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "0"), filepath.Join(dir, "1"), filepath.Join(dir, "2")} {
		if fi, err := os.Stat(d); err != nil || fi.Mode() != os.ModeDir|0o755 {
			t.Errorf("%s: %v, %v, want a 0755 directory", d, fi.Mode(), err)
		}
	}
	same := func(a, b string) bool {
		fa, err1 := os.Stat(a)
		fb, err2 := os.Stat(b)
		return err1 == nil && err2 == nil && os.SameFile(fa, fb)
	}
	for image, body := range map[string]string{"a": "public", "b": "private", "c": "public"} {
		fi, err := os.Lstat(got[image])
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o755 {
			t.Errorf("staged %s: %v, %v, want a regular 0755 file", image, fi.Mode(), err)
		}
		if b, err := os.ReadFile(got[image]); err != nil || string(b) != "#!/bin/sh\necho "+body+"\n" {
			t.Errorf("staged %s = %q, %v", image, b, err)
		}
	}
	if !same(got["a"], public) || !same(got["c"], public) {
		t.Errorf("a program everyone may run was copied, want a hard link")
	}
	if same(got["b"], private) {
		t.Errorf("a private program was linked, want a copy")
	}
	if fi, err := os.Stat(private); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("original private program: %v, %v, want it untouched (0700)", fi.Mode(), err)
	}
	if _, err := m.Stage(dir); err != nil {
		t.Fatalf("second Stage() = %v", err)
	}
}
