package devkernel

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstall(t *testing.T) {
	dir, cache := t.TempDir(), t.TempDir()
	entry := filepath.Join(dir, "telo.yaml")
	if err := os.WriteFile(entry, []byte("kind: Telo.Application\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TELO_CACHE_DIR", cache)
	var out, errb bytes.Buffer
	if code := Main(t.Context(), []string{"install", entry}, nil, &out, &errb); code != 0 {
		t.Fatalf("install exit %d: %s", code, errb.String())
	}
	got, err := os.ReadFile(filepath.Join(cache, InstallFile))
	if err != nil {
		t.Fatal(err)
	}
	want := "installed telo.yaml sha256:8dcc1b8bd5d8d5ba96ad6c34b31ae1b5c3f8e1ebbf0e3cfd1d69b58930d1b7c6\n"
	if !strings.HasPrefix(string(got), "installed telo.yaml sha256:") || len(got) != len(want) {
		t.Fatalf("cache file %q", got)
	}
	// Deterministic: a second install writes the same bytes.
	Main(t.Context(), []string{"install", dir}, nil, &out, &errb)
	again, _ := os.ReadFile(filepath.Join(cache, InstallFile))
	if !bytes.Equal(got, again) {
		t.Fatalf("second install %q, first %q", again, got)
	}
	// The failure marker: exit 1 with 25 lines on stderr.
	if err := os.WriteFile(entry, []byte(InstallFailMarker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := Main(t.Context(), []string{"install", entry}, nil, &out, &errb); code != 1 || strings.Count(errb.String(), "\n") != 25 {
		t.Fatalf("failing install exit %d, stderr %q", code, errb.String())
	}
	t.Setenv("TELO_CACHE_DIR", "")
	if code := Main(t.Context(), []string{"install", entry}, nil, &out, &errb); code != 2 {
		t.Fatalf("install without TELO_CACHE_DIR exit %d, want 2", code)
	}
}
