package devkernel

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/testkit"
)

func TestParsePeerWorkload(t *testing.T) {
	p, err := ParsePeerWorkload([]string{"HOME=/x", "PEERLESS=1"})
	if p != nil || err != nil {
		t.Fatalf("no PEER_* keys: %+v, %v; want nil, nil", p, err)
	}
	p, err = ParsePeerWorkload([]string{"PEER_GATE=stdin", "PEER_HOLD_MS=-1", "PEER_EVENT_INTERVAL_MS=0", "PEER_CHUNK= 4096 "})
	if err != nil {
		t.Fatal(err)
	}
	want := PeerWorkload{OutputBytes: 65536, Chunk: 4096, Events: 0, EventKind: "progress", GateStdin: true, HoldForever: true}
	if *p != want {
		t.Errorf("workload = %+v, want %+v", *p, want)
	}
	for _, bad := range []string{"PEER_CHUNK=0", "PEER_GATE=maybe", "PEER_OUTPUT_BYTES=-1", "PEER_EXIT_CODE=256", "PEER_EVENTS=x", "PEER_BURST=0"} {
		if _, err := ParsePeerWorkload([]string{bad}); err == nil || !strings.Contains(err.Error(), strings.Split(bad, "=")[0]) {
			t.Errorf("%s: error = %v, want one naming the key", bad, err)
		}
	}
}

// A gated peer workload writes nothing before the first stdin byte, then
// echoes it and writes its output in chunks, and exits with its code.
func TestPeerWorkloadGatedOutput(t *testing.T) {
	const n = 100_000
	p := startKernel(t, testEnv("PEER_OUTPUT_BYTES="+strconv.Itoa(n), "PEER_CHUNK=4096", "PEER_GATE=stdin", "PEER_EXIT_CODE=7"),
		writeManifest(t, manifest("peer", "")))
	banner := "devkernel peer generation 1 tty=false\n"
	p.waitStdout(t, banner)
	// Nothing more before the gate: watched for 200 ms, failing as soon as
	// anything else arrives.
	if testkit.Poll(context.Background(), 200*time.Millisecond, func() bool { return p.stdout.String() != banner }) {
		t.Fatalf("stdout before the gate = %q, want only the banner", p.stdout.String())
	}
	if _, err := p.stdin.Write([]byte("g")); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 7 {
		t.Fatalf("exit code = %d, want 7 (stderr %s)", code, p.stderr)
	}
	out, _ := strings.CutPrefix(p.stdout.String(), banner)
	if len(out) != n+1 || out[0] != 'g' {
		t.Fatalf("stdout after the banner = %d bytes starting %q, want the echoed gate byte and %d bytes", len(out), out[:min(len(out), 8)], n)
	}
}

// Peer progress events are debug frames carrying their send time; an
// inspected peer workload exits when done instead of holding open.
func TestPeerProgressFrames(t *testing.T) {
	inspect := freePort(t)
	before := time.Now().UnixNano()
	p := startKernel(t, testEnv("PEER_OUTPUT_BYTES=0", "PEER_EVENTS=5", "PEER_EVENT_INTERVAL_MS=1", "PEER_HOLD_MS=300"),
		"run", "--inspect", addr(inspect), writeManifest(t, manifest("events", "")))
	c := dialEvents(t, addr(inspect))
	frames := c.waitEvent(t, EventStopped, 1)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code = %d, want 0", code)
	}
	var sent []int64
	for _, f := range frames {
		if f.Event != EventPeerProgress {
			continue
		}
		msg, _ := f.Payload["message"].(string)
		ns, err := strconv.ParseInt(msg, 10, 64)
		if err != nil || ns < before || ns > time.Now().UnixNano() {
			t.Errorf("progress frame %s: message is not a send time in unix nanoseconds", f.Raw)
		}
		sent = append(sent, ns)
	}
	if len(sent) != 5 {
		t.Fatalf("progress frames = %d, want 5; events %v", len(sent), events(frames))
	}
	if i := indexOf(frames, EventPeerProgress, 1); i < indexOf(frames, EventStarted, 1) || indexOf(frames, EventStopping, 1) < i {
		t.Errorf("progress frames outside the generation: %v", events(frames))
	}
}
