package devkernel

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
)

// testDebounce is the watcher's debounce in these tests: a write's steps
// (truncate, then write; write, then rename) must land within it, so it is
// long enough that a stall on a loaded 2-core machine cannot split one
// save into two changes.
const testDebounce = 500 * time.Millisecond

// startWatcher runs a fast-polling watcher on path; changes are counted,
// not coalesced. Cleanup stops it and waits.
func startWatcher(t *testing.T, path string) chan struct{} {
	t.Helper()
	changes := make(chan struct{}, 100)
	w := NewWatcher(path, 5*time.Millisecond, testDebounce)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx, changes) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return changes
}

func waitChange(t *testing.T, changes chan struct{}, what string) {
	t.Helper()
	select {
	case <-changes:
	case <-time.After(waitLong):
		t.Fatalf("no change reported after %s", what)
	}
}

func TestWatcher(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "telo.yaml")
	content := []byte("kind: Telo.Application\n")
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	changes := startWatcher(t, path)

	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	waitChange(t, changes, "rewriting identical bytes")

	tmp := filepath.Join(dir, ".telo.yaml.tmp")
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitChange(t, changes, "an atomic rename save")

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	waitChange(t, changes, "delete and recreate")
	// No extra change: watched for two debounce periods, failing as soon
	// as one is reported.
	if testkit.Poll(context.Background(), 2*testDebounce, func() bool { return len(changes) != 0 }) {
		t.Errorf("%d extra changes reported, want none", len(changes))
	}
}

func TestWatcherMissingFileAppears(t *testing.T) {
	path := filepath.Join(t.TempDir(), "telo.yaml")
	changes := startWatcher(t, path)
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitChange(t, changes, "the file appeared")
}
