// Package testutil holds what this module's tests share: polling with a
// deadline, a buffer safe for one writer and a polling reader, and a
// directory every user can reach. Only tests import it.
package testutil

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"
)

// Poll calls cond every interval until it returns true (true) or timeout
// passes (false).
func Poll(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// Eventually fails t unless cond holds within timeout (polled every 10 ms).
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	if !Poll(timeout, 10*time.Millisecond, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// WaitFile fails t unless path exists within timeout.
func WaitFile(t testing.TB, path string, timeout time.Duration) {
	t.Helper()
	Eventually(t, path, timeout, func() bool { _, err := os.Stat(path); return err == nil })
}

// SyncBuffer is a bytes.Buffer safe for one writer and a polling reader.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Ptr returns a pointer to v.
func Ptr[T any](v T) *T { return &v }

// ReachableDir is a fresh directory every user can search (t.TempDir's
// parent is 0700): it stands for container paths such as /workspace,
// which the containers' users must reach by path. Removed with t.
func ReachableDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "standin-reachable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
