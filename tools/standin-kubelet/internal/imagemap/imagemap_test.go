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
