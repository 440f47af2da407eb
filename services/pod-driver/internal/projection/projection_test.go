package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
)

type ledger struct {
	gens     map[string]int
	triggers map[string]string
}

func (l *ledger) OpenGeneration(app string) (int, string, error) {
	l.gens[app]++
	t := l.triggers[app]
	delete(l.triggers, app)
	return l.gens[app], t, nil
}

func frame(event string, payload string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"kind":"event","timestamp":"2026-01-01T00:00:00.000Z","event":%q,"payload":%s}`, event, payload))
}

func summary(evs []contract.Event) []string {
	var out []string
	for _, e := range evs {
		s := fmt.Sprintf("%s#%d %s", e.App, e.Generation, e.Phase)
		if e.Trigger != "" {
			s += " " + e.Trigger
		}
		if e.Code != nil {
			s += fmt.Sprintf(" code=%d", *e.Code)
		}
		if e.Reason != "" {
			s += " " + e.Reason
		}
		out = append(out, s)
	}
	return out
}

func TestProjection(t *testing.T) {
	type step struct {
		app, event, payload string
		ended               bool
		code                *int
	}
	tests := []struct {
		name     string
		triggers map[string]string
		steps    []step
		want     []string
	}{
		{"initial then watch reload", map[string]string{"web": "initial"}, []step{
			{app: "web", event: "Kernel.Starting", payload: "{}"},
			{app: "web", event: "Kernel.Started", payload: "{}"},
			{app: "web", event: "Kernel.Stopped", payload: `{"exitCode":0}`},
			{app: "web", event: "Kernel.Starting", payload: "{}"},
		}, []string{"web#1 started initial", "web#1 completed code=0", "web#2 started watch"}},
		{"load failure opens and fails", nil, []step{
			{app: "w", event: "Kernel.RunFailed", payload: `{"phase":"load","code":"ERR_MANIFEST_VALIDATION_FAILED","message":"bad"}`},
		}, []string{"w#1 started watch", "w#1 failed ERR_MANIFEST_VALIDATION_FAILED"}},
		{"reason falls back to message then default", nil, []step{
			{app: "w", event: "Kernel.RunFailed", payload: `{"phase":"start","message":"boom"}`},
			{app: "w", event: "Kernel.RunFailed", payload: `{"phase":"start","code":""}`},
		}, []string{"w#1 started watch", "w#1 failed boom", "w#2 started watch", "w#2 failed run failed"}},
		{"non-number exit code is 0", nil, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", event: "Kernel.Started", payload: "{}"},
			{app: "a", event: "Kernel.Stopped", payload: `{"exitCode":"x"}`},
		}, []string{"a#1 started watch", "a#1 completed code=0"}},
		{"19.13: workload end after completion adds nothing", nil, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", event: "Kernel.Stopped", payload: `{"exitCode":3}`},
			{app: "a", ended: true},
			{app: "a", event: "Kernel.Stopped", payload: `{"exitCode":3}`},
		}, []string{"a#1 started watch", "a#1 completed code=3"}},
		{"workload end closes open generation as failed", nil, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", ended: true},
		}, []string{"a#1 started watch", "a#1 failed workload ended"}},
		{"workload end with code only completes", nil, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", ended: true, code: contract.IntPtr(7)},
		}, []string{"a#1 started watch", "a#1 completed code=7"}},
		{"19.15: RunFailed before teardown is the one outcome", nil, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", event: "Kernel.RunFailed", payload: `{"phase":"start","code":"ERR_BOOT"}`},
			{app: "a", event: "Kernel.Stopping", payload: "{}"},
			{app: "a", event: "Kernel.Stopped", payload: `{"exitCode":1}`},
		}, []string{"a#1 started watch", "a#1 failed ERR_BOOT"}},
		{"19.15: the CLI's order, Stopped then RunFailed, is one failed outcome", nil, []step{
			{app: "a", event: "Kernel.Initialized", payload: "{}"},
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", event: "Kernel.Stopping", payload: "{}"},
			{app: "a", event: "Kernel.Stopped", payload: `{"exitCode":1}`},
			{app: "a", event: "Kernel.RunFailed", payload: `{"phase":"start","code":"ERR_BOOT","message":"boom"}`},
			{app: "a", event: "Kernel.Starting", payload: "{}"},
		}, []string{"a#1 started watch", "a#1 failed ERR_BOOT", "a#2 started watch"}},
		{"19.15: a load failure after a stop is its own generation", nil, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", event: "Kernel.Stopped", payload: `{"exitCode":0}`},
			{app: "a", event: "Kernel.RunFailed", payload: `{"phase":"load","code":"ERR_MANIFEST_VALIDATION_FAILED"}`},
		}, []string{"a#1 started watch", "a#1 completed code=0", "a#2 started watch", "a#2 failed ERR_MANIFEST_VALIDATION_FAILED"}},
		{"19.15: a started generation completes at once", nil, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", event: "Kernel.Started", payload: "{}"},
			{app: "a", event: "Kernel.Stopped", payload: `{"exitCode":0}`},
			{app: "a", event: "Kernel.RunFailed", payload: `{"phase":"start","code":"LATE"}`},
		}, []string{"a#1 started watch", "a#1 completed code=0", "a#2 started watch", "a#2 failed LATE"}},
		{"19.15: a held outcome is emitted by the next start", nil, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", event: "Kernel.Stopped", payload: `{"exitCode":0}`},
			{app: "a", event: "Kernel.Starting", payload: "{}"},
		}, []string{"a#1 started watch", "a#1 completed code=0", "a#2 started watch"}},
		{"double starting opens once; log frames ignored", nil, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "a", event: "Kernel.Starting", payload: "{}"},
		}, []string{"a#1 started watch"}},
		{"apps are independent", map[string]string{"a": "manual"}, []step{
			{app: "a", event: "Kernel.Starting", payload: "{}"},
			{app: "b", event: "Kernel.Starting", payload: "{}"},
			{app: "a", event: "Kernel.Started", payload: "{}"},
			{app: "a", event: "Kernel.Stopped", payload: `{"exitCode":0}`},
		}, []string{"a#1 started manual", "b#1 started watch", "a#1 completed code=0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &ledger{gens: map[string]int{}, triggers: map[string]string{}}
			for k, v := range tt.triggers {
				l.triggers[k] = v
			}
			var got []contract.Event
			clock := time.Unix(0, 0)
			p := New(l, func(e contract.Event) { got = append(got, e) }, func() time.Time { clock = clock.Add(time.Millisecond); return clock })
			for _, s := range tt.steps {
				if s.ended {
					p.WorkloadEnded(s.app, s.code, "")
					continue
				}
				if _, err := p.Feed(s.app, frame(s.event, s.payload)); err != nil {
					t.Fatal(err)
				}
			}
			if g, w := fmt.Sprint(summary(got)), fmt.Sprint(tt.want); g != w {
				t.Fatalf("events = %s, want %s", g, w)
			}
		})
	}
}

func TestFeedClassifiesFrames(t *testing.T) {
	p := New(&ledger{gens: map[string]int{}, triggers: map[string]string{}}, func(contract.Event) {}, nil)
	for _, tc := range []struct {
		raw  string
		want bool
	}{
		{`{"kind":"event","event":"X"}`, true},
		{`{"event":"X"}`, true},
		{`{"kind":"log","stream":"stdout","line":"hi"}`, false},
		{`{"kind":"record","record":{}}`, false},
		{`not json`, false},
	} {
		if got, _ := p.Feed("a", json.RawMessage(tc.raw)); got != tc.want {
			t.Errorf("Feed(%s) isEvent = %v, want %v", tc.raw, got, tc.want)
		}
	}
}

// A generation that stopped without starting and whose kernel never
// reports RunFailed (an older kernel, 19.40) still completes, once
// BootFailureWindow has passed.
func TestHeldOutcomeCompletesAfterWindow(t *testing.T) {
	var mu sync.Mutex
	var got []contract.Event
	p := New(&ledger{gens: map[string]int{}, triggers: map[string]string{}}, func(e contract.Event) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, e)
	}, nil)
	for _, ev := range []string{"Kernel.Starting", "Kernel.Stopping"} {
		if _, err := p.Feed("a", frame(ev, "{}")); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if _, err := p.Feed("a", frame("Kernel.Stopped", `{"exitCode":4}`)); err != nil {
		t.Fatal(err)
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	if !testkit.Poll(context.Background(), BootFailureWindow+5*time.Second, func() bool { return count() >= 2 }) {
		t.Fatalf("%d of 2 events within %v of Kernel.Stopped", count(), BootFailureWindow+5*time.Second)
	}
	if waited := time.Since(start); waited < BootFailureWindow {
		t.Errorf("outcome after %v, want it held for %v", waited, BootFailureWindow)
	}
	mu.Lock()
	defer mu.Unlock()
	if g, w := fmt.Sprint(summary(got)), "[a#1 started watch a#1 completed code=4]"; g != w {
		t.Fatalf("events = %s, want %s", g, w)
	}
}
