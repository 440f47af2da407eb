package e2e

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// testClock is a clock the test moves.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// The reload budget refills (13.5): RUNNER_WATCH_RELOAD_LIMIT=3 per sliding
// 60 s window of admitted reloads. Over budget a reload answers 429
// reload_rate_limited with Retry-After; refused reloads are not recorded
// (hammering does not extend the penalty); each admitted reload leaves the
// window 60 s after it was admitted, and the next one is admitted then.
// The edge's budget clock is the test's, so no minute is waited.
func TestReloadBudgetRefills(t *testing.T) {
	vars := map[string]string{"RUNNER_WATCH_SESSIONS": "true", "RUNNER_WATCH_RELOAD_LIMIT": "3"}
	r := watchRunner(t, vars)
	t0 := time.Now()
	clock := &testClock{now: t0}
	b := startEdgeReplica(t, r, "edge-clock", vars, clock.Now)
	c := r.create(t, watchBody(map[string]string{"telo.yaml": manifest("budget", nil, nil)}, []app{{Name: "app", Entry: "telo.yaml"}}, ""))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	sse.untilAll(t, 60*time.Second, isStatus("running"), isRun("app", "started", 1))

	reload := func(at time.Duration, wantStatus int, wantRetry string) {
		t.Helper()
		clock.set(t0.Add(at))
		resp := do(t, "POST", b.URL+"/v1/sessions/"+c.SessionID+"/reload", nil, nil)
		switch wantStatus {
		case http.StatusAccepted:
			if resp.Status != http.StatusAccepted || string(resp.Body) != `{"reloaded":["app"]}` {
				t.Fatalf("reload at t0+%v = %d %s, want 202 {\"reloaded\":[\"app\"]}", at, resp.Status, resp.Body)
			}
		case http.StatusTooManyRequests:
			if resp.Status != http.StatusTooManyRequests || !strings.Contains(string(resp.Body), `"error":"reload_rate_limited"`) {
				t.Fatalf("reload at t0+%v = %d %s, want 429 reload_rate_limited", at, resp.Status, resp.Body)
			}
			if got := resp.Header.Get("Retry-After"); got != wantRetry {
				t.Fatalf("reload at t0+%v: Retry-After %q, want %q", at, got, wantRetry)
			}
		}
	}
	s := time.Second
	reload(0, http.StatusAccepted, "")
	reload(10*s, http.StatusAccepted, "")
	reload(20*s, http.StatusAccepted, "")
	// Exhausted: the oldest admitted (t0) leaves the window at t0+60 s.
	reload(20*s, http.StatusTooManyRequests, "41")
	reload(40*s, http.StatusTooManyRequests, "21")
	reload(59*s, http.StatusTooManyRequests, "2")
	// Refilled by one: t0's reload left the window; the refusals above
	// left no trace.
	reload(60*s, http.StatusAccepted, "")
	reload(60*s, http.StatusTooManyRequests, "11")
	reload(70*s, http.StatusAccepted, "")
	reload(80*s, http.StatusAccepted, "")
	reload(80*s, http.StatusTooManyRequests, "41")
	// A whole window later the full budget is back.
	reload(140*s+time.Millisecond, http.StatusAccepted, "")
	reload(140*s+time.Millisecond, http.StatusAccepted, "")
	reload(140*s+time.Millisecond, http.StatusAccepted, "")
	reload(140*s+time.Millisecond, http.StatusTooManyRequests, "61")
	// The admitted reloads reached the kernel: a manual generation.
	sse.until(t, 30*time.Second, func(e sseEvent) bool {
		return isRun("app", "started", 0)(e) && strings.Contains(e.Data, `"trigger":"manual"`)
	})
}
