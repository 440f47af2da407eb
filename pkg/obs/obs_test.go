package obs

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func lookup(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// opsGet starts a standalone service's ops listener with RUNNER_PPROF
// read from vars, as run.Main does, and GETs path from it.
func opsGet(t *testing.T, vars map[string]string, path string) (int, string) {
	t.Helper()
	on, err := PprofEnabled(lookup(vars))
	if err != nil {
		t.Fatalf("PprofEnabled(%v) = %v", vars, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, NewRegistry(), nil, on) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve() = %v", err)
		}
	}()
	resp, err := http.Get("http://" + ln.Addr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestOpsPprof: the ops listener serves /debug/pprof only with
// RUNNER_PPROF=true (1, yes); unset or false it answers 404 there while
// /metrics answers.
func TestOpsPprof(t *testing.T) {
	for _, vars := range []map[string]string{nil, {"RUNNER_PPROF": ""}, {"RUNNER_PPROF": "false"}, {"RUNNER_PPROF": "0"}} {
		if code, _ := opsGet(t, vars, "/debug/pprof/"); code != http.StatusNotFound {
			t.Errorf("GET /debug/pprof/ with %v = %d, want 404", vars, code)
		}
		if code, _ := opsGet(t, vars, "/debug/pprof/heap"); code != http.StatusNotFound {
			t.Errorf("GET /debug/pprof/heap with %v = %d, want 404", vars, code)
		}
		if code, body := opsGet(t, vars, "/metrics"); code != http.StatusOK || !strings.Contains(body, "go_memstats_heap_alloc_bytes") {
			t.Errorf("GET /metrics with %v = %d, want 200 with the Go memory gauges", vars, code)
		}
	}
	for _, v := range []string{"true", "1", "yes", " TRUE "} {
		vars := map[string]string{"RUNNER_PPROF": v}
		if code, body := opsGet(t, vars, "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "heap") {
			t.Errorf("GET /debug/pprof/ with %v = %d, want 200 listing heap", vars, code)
		}
		if code, body := opsGet(t, vars, "/debug/pprof/heap?gc=1&debug=1"); code != http.StatusOK || !strings.Contains(body, "heap profile") {
			t.Errorf("GET /debug/pprof/heap?gc=1&debug=1 with %v = %d %.80q, want 200 and a heap profile", vars, code, body)
		}
	}
}

// TestPprofEnabledRefusesOtherValues: a value that is not a boolean is an
// error naming the variable (the service exits 2), never a silent off.
func TestPprofEnabledRefusesOtherValues(t *testing.T) {
	for _, v := range []string{"on", "y", "enabled"} {
		on, err := PprofEnabled(lookup(map[string]string{"RUNNER_PPROF": v}))
		if err == nil || !strings.Contains(err.Error(), "RUNNER_PPROF") || on {
			t.Errorf("PprofEnabled(%q) = %v, %v; want an error naming RUNNER_PPROF", v, on, err)
		}
	}
}
