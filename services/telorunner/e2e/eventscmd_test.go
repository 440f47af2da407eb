package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

// eventLine is one output line of telorunner-events.
type eventLine struct {
	Session  string          `json:"session"`
	Seq      uint64          `json:"seq"`
	Type     string          `json:"type"`
	Terminal bool            `json:"terminal"`
	Event    json.RawMessage `json:"event"`
}

// telorunner-events, run against the all-in-one's embedded NATS with the
// subscriber seed, prints a session's events exactly as the SSE stream
// carries them (same ids, same objects, terminal last) and exits after the
// terminal status; --from-seq starts the replay there; --session all
// follows every session, including one created after it started.
func TestEventsCommand(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "telorunner-events")
	_, file, _, _ := runtime.Caller(0)
	build := exec.Command("go", "build", "-o", bin, "./cmd/telorunner-events")
	build.Dir = filepath.Join(filepath.Dir(file), "..")
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build telorunner-events: %v\n%s", err, out)
	}
	r := startRunner(t, nil)
	seed := bus.SeedFile(allinone.CredentialsDir(r.DataDir), bus.RoleSubscriber)
	args := func(more ...string) []string {
		return append([]string{"--nats", r.NATSURL, "--nkey", seed}, more...)
	}

	c := r.create(t, runBody(manifest("events-cmd", nil, map[string]any{"exitAfterMs": 300}), nil, true))
	sse := openSSE(t, r.URL+c.StreamURL, nil).drain(t, 60*time.Second)
	if len(sse) < 3 {
		t.Fatalf("SSE = %s, want a few events", summarize(sse))
	}

	// One session, from the start: exactly the SSE stream.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args("--session", c.SessionID)...).Output()
	if err != nil {
		t.Fatalf("telorunner-events --session %s: %v (output %s)", c.SessionID, err, out)
	}
	lines := parseLines(t, out)
	sameAsSSE(t, lines, sse, c.SessionID)

	// From a sequence.
	out, err = exec.CommandContext(ctx, bin, args("--session", c.SessionID, "--from-seq", "3")...).Output()
	if err != nil {
		t.Fatalf("telorunner-events --from-seq 3: %v", err)
	}
	sameAsSSE(t, parseLines(t, out), sse[2:], c.SessionID)

	// All sessions: the ended one replayed, then a new one live.
	all := exec.CommandContext(ctx, bin, args("--session", "all")...)
	stdout, err := all.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := all.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = all.Process.Kill(); _ = all.Wait() }()
	got := make(chan eventLine, 256)
	go func() {
		defer close(got)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l eventLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Errorf("line %q: %v", sc.Bytes(), err)
				return
			}
			got <- l
		}
	}()
	var first []eventLine
	for len(first) < len(sse) {
		select {
		case l, ok := <-got:
			if !ok {
				t.Fatalf("--session all ended after %v", first)
			}
			first = append(first, l)
		case <-ctx.Done():
			t.Fatalf("--session all printed %d lines, want the first session's %d", len(first), len(sse))
		}
	}
	sameAsSSE(t, first, sse, c.SessionID)
	c2 := r.create(t, runBody(manifest("events-cmd-2", nil, map[string]any{"exitAfterMs": 300}), nil, false))
	var second []eventLine
	for len(second) == 0 || !second[len(second)-1].Terminal {
		select {
		case l, ok := <-got:
			if !ok {
				t.Fatalf("--session all ended after %v", second)
			}
			if l.Session != c2.SessionID {
				t.Fatalf("line of session %s, want only %s's new events: %+v", l.Session, c2.SessionID, l)
			}
			second = append(second, l)
		case <-ctx.Done():
			t.Fatalf("--session all: no terminal event of the new session; got %+v", second)
		}
	}
	sameAsSSE(t, second, openSSE(t, r.URL+c2.StreamURL, nil).drain(t, 30*time.Second), c2.SessionID)
}

func parseLines(t *testing.T, out []byte) []eventLine {
	t.Helper()
	var ls []eventLine
	for _, b := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		var l eventLine
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatalf("output line %q: %v", b, err)
		}
		ls = append(ls, l)
	}
	return ls
}

// sameAsSSE checks lines carry exactly the SSE events: id = seq, event =
// type, data = the event object, and only the last one terminal.
func sameAsSSE(t *testing.T, lines []eventLine, sse []sseEvent, session string) {
	t.Helper()
	if len(lines) != len(sse) {
		t.Fatalf("%d lines, want the SSE stream's %d: %+v / %s", len(lines), len(sse), lines, summarize(sse))
	}
	for i, l := range lines {
		e := sse[i]
		var a, b any
		_ = json.Unmarshal(l.Event, &a)
		_ = json.Unmarshal([]byte(e.Data), &b)
		if l.Session != session || strconv.FormatUint(l.Seq, 10) != e.ID || l.Type != e.Event || !reflect.DeepEqual(a, b) {
			t.Fatalf("line %d = %+v (event %s), want session %s id %s %s %s", i, l, l.Event, session, e.ID, e.Event, e.Data)
		}
		if l.Terminal != (i == len(lines)-1) {
			t.Fatalf("line %d terminal = %t, want only the last (%d lines)", i, l.Terminal, len(lines))
		}
	}
}
