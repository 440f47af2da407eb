package server

import (
	"net/http"
	"strings"
	"testing"
)

// TestBodyLimit checks RUNNER_BODY_LIMIT_BYTES on every route with a body:
// a body of exactly the limit is read, one byte more is 413 (2.1).
func TestBodyLimit(t *testing.T) {
	const limit = 2048
	e := newEnv(t, map[string]string{
		"RUNNER_BODY_LIMIT_BYTES": "2048",
		"RUNNER_APPS":             `{"tool":{"image":"op/tool:1"}}`,
	})
	// pad grows a JSON object body to exactly n bytes through an ignored
	// field.
	pad := func(t *testing.T, b body, n int) string {
		t.Helper()
		b["pad"] = ""
		base := len(mustJSON(t, b))
		if base > n {
			t.Fatalf("base body is %d bytes, over %d", base, n)
		}
		b["pad"] = strings.Repeat("x", n-base)
		s := mustJSON(t, b)
		if len(s) != n {
			t.Fatalf("padded body is %d bytes, want %d", len(s), n)
		}
		return s
	}
	probe := func() body { return body{"config": body{"image": "x", "pullPolicy": "missing"}} }
	tests := []struct {
		name   string
		path   string
		body   func() body
		status int // at the limit
	}{
		{"create", "/v1/sessions", func() body { return validCreate() }, http.StatusCreated},
		{"app session", "/v1/apps/tool/sessions", func() body { return body{} }, http.StatusCreated},
		{"probe", "/v1/probe", probe, http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := e.do(t, http.MethodPost, tc.path, pad(t, tc.body(), limit), nil)
			if res.status != tc.status {
				t.Errorf("POST %s with %d bytes status = %d (body %s), want %d", tc.path, limit, res.status, res.body, tc.status)
			}
			res = e.do(t, http.MethodPost, tc.path, pad(t, tc.body(), limit+1), nil)
			if res.status != http.StatusRequestEntityTooLarge {
				t.Fatalf("POST %s with %d bytes status = %d, want 413", tc.path, limit+1, res.status)
			}
			if code, _ := res.envelope(t); code != "payload_too_large" {
				t.Errorf("error = %q, want payload_too_large", code)
			}
		})
	}
	// The refused creations took no slot: two were admitted.
	if n := e.admitted(t); n != 2 {
		t.Errorf("admitted sessions = %d, want 2", n)
	}
}
