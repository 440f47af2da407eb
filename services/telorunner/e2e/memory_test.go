package e2e

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
)

// metric reads an unlabelled gauge or counter from the runner's /metrics.
func metric(t *testing.T, base, name string) string {
	t.Helper()
	resp := do(t, "GET", base+"/metrics", nil, nil)
	sc := bufio.NewScanner(bytes.NewReader(resp.Body))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			return f[1]
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return ""
}

// TestEndedSessionServedAfterRelease: once a run session has ended the
// driver holds nothing of it (runner_driver_sessions back to 0) and the
// edge holds no client of it; its GET, events and io still answer from
// JetStream per contract: the record with its terminal status, the event
// history ending on the terminal status (the stream then ends), and the
// output bytes, then a 1000 close (7.8).
func TestEndedSessionServedAfterRelease(t *testing.T) {
	r := startRunner(t, nil)
	const n = 100000
	c := r.create(t, runBody(manifest("ended", nil, map[string]any{"outputBytes": n, "exitAfterMs": 200}), nil, false))
	first := openSSE(t, r.URL+c.StreamURL, nil).drain(t, 30*time.Second)
	if len(first) == 0 || first[len(first)-1].Event != "status" || !strings.Contains(first[len(first)-1].Data, `"exited"`) {
		t.Fatalf("events = %s, want them to end on status exited", summarize(first))
	}
	testkit.Eventually(t, 15*time.Second, func() bool {
		return metric(t, r.URL, "runner_driver_sessions") == "0" &&
			metric(t, r.URL, "runner_edge_sse_clients") == "0" && metric(t, r.URL, "runner_edge_io_clients") == "0"
	}, "the driver releases the ended session (runner_driver_sessions 0) and the edge its clients")

	var rec struct {
		SessionID string `json:"sessionId"`
		Status    struct {
			Kind string `json:"kind"`
			Code *int   `json:"code"`
		} `json:"status"`
		ExitedAt string `json:"exitedAt"`
	}
	got := do(t, "GET", r.URL+"/v1/sessions/"+c.SessionID, nil, nil)
	if got.Status != http.StatusOK {
		t.Fatalf("GET ended session = %d %s, want 200", got.Status, got.Body)
	}
	got.json(t, &rec)
	if rec.SessionID != c.SessionID || rec.Status.Kind != "exited" || rec.Status.Code == nil || *rec.Status.Code != 0 || rec.ExitedAt == "" {
		t.Fatalf("GET ended session = %s, want exited code 0 with exitedAt", got.Body)
	}

	again := openSSE(t, r.URL+c.StreamURL, nil).drain(t, 10*time.Second)
	if summarize(again) != summarize(first) {
		t.Fatalf("events after the release = %s, want the same history %s", summarize(again), summarize(first))
	}

	io := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io", nil)
	code, _, frames := io.closeCode(t, 20*time.Second)
	if code != 1000 {
		t.Fatalf("io of the ended session closed %d, want 1000", code)
	}
	total, next := 0, uint32(1)
	for _, f := range frames {
		if f.Text != "" {
			continue
		}
		if f.Seq != next {
			t.Fatalf("io frame seq %d, want %d", f.Seq, next)
		}
		next++
		total += len(f.Payload)
	}
	if len(frames) == 0 || !strings.Contains(frames[0].Text, `"type":"seq"`) || total < n {
		t.Fatalf("io of the ended session: first frame %+v, %d output bytes; want the seq frame then >= %d bytes", frames[:min(1, len(frames))], total, n)
	}
}
