package e2e

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestPprofOnlyWhenAsked: /debug/pprof is not served by default (404 on
// the index and on the heap profile, /metrics still answers) and is served
// with RUNNER_PPROF=true: the index, and a heap profile after a forced GC
// (gzipped protobuf) — what an operator runs `go tool pprof` on (issue 20).
func TestPprofOnlyWhenAsked(t *testing.T) {
	off := startRunner(t, nil)
	if resp := do(t, "GET", off.URL+"/metrics", nil, nil); resp.Status != http.StatusOK {
		t.Fatalf("GET /metrics = %d, want 200", resp.Status)
	}
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/heap?gc=1"} {
		if resp := do(t, "GET", off.URL+p, nil, nil); resp.Status != http.StatusNotFound {
			t.Fatalf("GET %s without RUNNER_PPROF = %d %q, want 404", p, resp.Status, resp.Body)
		}
	}
	off.stop()

	on := startRunner(t, map[string]string{"RUNNER_PPROF": "true"})
	idx := do(t, "GET", on.URL+"/debug/pprof/", nil, nil)
	if idx.Status != http.StatusOK || !strings.Contains(string(idx.Body), "heap") {
		t.Fatalf("GET /debug/pprof/ with RUNNER_PPROF=true = %d %.200q, want 200 listing heap", idx.Status, idx.Body)
	}
	heap := do(t, "GET", on.URL+"/debug/pprof/heap?gc=1", nil, nil)
	if heap.Status != http.StatusOK || !bytes.HasPrefix(heap.Body, []byte{0x1f, 0x8b}) {
		t.Fatalf("GET /debug/pprof/heap?gc=1 = %d (%d bytes, starts %x), want 200 and a gzipped profile", heap.Status, len(heap.Body), heap.Body[:min(4, len(heap.Body))])
	}
}
