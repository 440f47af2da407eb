package wsserver

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// With a clock far ahead every hash is cacheable; the cache must still
// notice a replaced file (new inode) with the same size and mtime, and a
// truncated one, and forget removed paths.
func TestHashCacheInvalidation(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the hash cache keys on Linux stat fields (dev, inode, ctime); GOOS=" + runtime.GOOS + " always rehashes, so there is nothing to invalidate")
	}
	dir := t.TempDir()
	full := filepath.Join(dir, "f")
	if err := os.WriteFile(full, []byte("aaaa"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	s.now = func() time.Time { return time.Now().Add(time.Hour) }

	hashOf := func() string {
		t.Helper()
		files, err := s.tree(t.Context())
		if err != nil || len(files) != 1 {
			t.Fatalf("tree() = %v, %v; want one file", files, err)
		}
		return files[0].Hash
	}
	first := hashOf()
	s.hashes.mu.Lock()
	cached := len(s.hashes.byPath)
	s.hashes.mu.Unlock()
	if cached != 1 {
		t.Fatalf("cache holds %d entries after a tree, want 1", cached)
	}
	if again := hashOf(); again != first {
		t.Fatalf("tree() hash = %s, want cached %s", again, first)
	}

	mtime := time.Now().Add(-time.Hour)
	if err := os.Chtimes(full, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	hashOf()
	if err := s.writeAtomic("f", []byte("bbbb")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(full, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	if got, want := hashOf(), sha256hex("bbbb"); got != want {
		t.Fatalf("tree() after replacement = %s, want %s", got, want)
	}
	if err := os.WriteFile(full, []byte("cc"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := hashOf(), sha256hex("cc"); got != want {
		t.Fatalf("tree() after truncation = %s, want %s", got, want)
	}

	if err := os.Remove(full); err != nil {
		t.Fatal(err)
	}
	if files, err := s.tree(t.Context()); err != nil || len(files) != 0 {
		t.Fatalf("tree() = %v, %v; want empty", files, err)
	}
	s.hashes.mu.Lock()
	defer s.hashes.mu.Unlock()
	if len(s.hashes.byPath) != 0 || len(s.hashes.byHash) != 0 {
		t.Fatalf("cache keeps %v %v after the file was removed", s.hashes.byPath, s.hashes.byHash)
	}
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// concurrentChange relies on matching os.Root's unexported escape error.
func TestEscapeErrorCaptured(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("..", filepath.Join(dir, "up")); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	_, err = s.root.Open("up/x")
	if err == nil || !s.concurrentChange(err) {
		t.Fatalf("concurrentChange(%v) = false, want the escape error recognized", err)
	}
	if s.concurrentChange(os.ErrPermission) {
		t.Fatal("concurrentChange(permission) = true, want false")
	}
}

// A touch that races with a real write must not put the old bytes back.
func TestTouchLeavesConcurrentWrite(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	data, fi, err := s.readRegular("f")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.writeAtomic("f", []byte("new")); err != nil { // The editor saves meanwhile.
		t.Fatal(err)
	}
	if err := s.touch("f", data, fi); err != nil {
		t.Fatalf("touch() = %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "f")); string(got) != "new" {
		t.Fatalf("file = %q after a racing touch, want the newer write kept", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("dir holds %v, want only f (no temporary file)", entries)
	}
}
