package e2e

import (
	"github.com/telorunner/telorunner/pkg/testkit"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hostileBody is a run session of the hostile kernel in mode (tty io).
func hostileBody(mode string, env map[string]string) map[string]any {
	body := runBody(manifest("hostile", nil, nil), nil, false)
	e := map[string]any{"HOSTILE_MODE": mode}
	for k, v := range env {
		e[k] = v
	}
	body["env"] = e
	return body
}

// TestSandboxOverHTTP drives hostile sessions through the all-in-one: one
// that attacks the runner's data dir and another session fails at every
// attempt and exits 0; the other session keeps running; one that outlives
// RUNNER_MAX_TTL_SECONDS ends failed with the time-limit message.
func TestSandboxOverHTTP(t *testing.T) {
	r := startRunner(t, map[string]string{"RUNNER_KERNEL_COMMAND": hostile, "RUNNER_MAX_TTL_SECONDS": "8"})
	// Beside the JetStream store: the sandbox shows an empty data dir but
	// for the path to the session's own directory.
	secret := filepath.Join(r.DataDir, "nats", "secret")
	if err := os.WriteFile(secret, []byte("runner secret"), 0o600); err != nil {
		t.Fatal(err)
	}

	other := r.create(t, hostileBody("sleep", nil))
	otherSSE := openSSE(t, r.URL+other.StreamURL, nil)
	defer otherSSE.Close()
	otherSSE.until(t, 30*time.Second, isStatus("running"))
	otherFile := filepath.Join(r.DataDir, "sessions", other.SessionID, "home", "secret-b")
	testkit.Eventually(t, 10*time.Second, func() bool {
		return os.WriteFile(otherFile, []byte("b-secret"), 0o644) == nil
	}, "the other session's file %s never became writable", otherFile)

	c := r.create(t, hostileBody("probe", map[string]string{"HOSTILE_SECRET": secret, "HOSTILE_OTHER_FILE": otherFile}))
	sse := openSSE(t, r.URL+c.StreamURL, nil)
	defer sse.Close()
	seen := sse.until(t, 30*time.Second, func(e sseEvent) bool { return isStatus("exited")(e) || isStatus("failed")(e) })
	if last := seen[len(seen)-1]; !strings.Contains(last.Data, `"kind":"exited"`) || !strings.Contains(last.Data, `"code":0`) {
		t.Fatalf("probe session ended %s, want exited with code 0", last.Data)
	}
	io := openIO(t, wsURL(r.URL)+"/v1/sessions/"+c.SessionID+"/io?lastSeq=0", nil)
	_, stdout := io.readUntil(t, 20*time.Second, "HOSTILE DONE")
	checks := 0
	for _, l := range strings.Split(stdout, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "CHECK ") {
			checks++
			if !strings.Contains(l, " blocked ") {
				t.Errorf("attack succeeded through the all-in-one: %s", l)
			}
		}
		if strings.HasPrefix(l, "CONTROL ") && !strings.HasSuffix(l, " ok") {
			t.Errorf("sandbox too tight: %s", l)
		}
	}
	if checks < 10 {
		t.Errorf("probe output has %d CHECK lines, want every attack reported:\n%s", checks, stdout)
	}
	if got, err := os.ReadFile(otherFile); err != nil || string(got) != "b-secret" {
		t.Errorf("other session's file = %q, %v; want untouched", got, err)
	}
	if got, err := os.ReadFile(secret); err != nil || string(got) != "runner secret" {
		t.Errorf("runner's secret = %q, %v; want untouched", got, err)
	}

	// The other session (started first) reaches its 8 s run-time ceiling.
	ended := otherSSE.until(t, 30*time.Second, func(e sseEvent) bool { return isStatus("failed")(e) || isStatus("exited")(e) })
	if last := ended[len(ended)-1]; !strings.Contains(last.Data, `"kind":"failed"`) || !strings.Contains(last.Data, "session reached its time limit") {
		t.Fatalf("sleeping session ended %s, want failed \"session reached its time limit\"", last.Data)
	}
}
