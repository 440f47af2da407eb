package devkernel

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// EventPeerProgress is the debug frame of a peer workload's progress event:
// payload {"message": "<send time, unix nanoseconds>"}, what the peer load
// driver (../shared/peer, `peerload sse --inspect`) measures latency from.
const EventPeerProgress = "Peer.Progress"

// EventPeerReachability is the debug frame of a peer workload's
// reachability event: payload {"port": 8080+i%16, "state": "checking" |
// "reachable"}.
const EventPeerReachability = "Peer.Reachability"

// PeerWorkload is the workload of the reference peer's fake backend, shaped
// by PEER_* keys in the environment (the session's env): with any PEER_*
// key set, a started generation runs it instead of `x-devkernel`'s output
// and exit, so one load driver measures both runners. Keys and defaults are
// those of the peer's README.
type PeerWorkload struct {
	OutputBytes   int64         // PEER_OUTPUT_BYTES (65536)
	Chunk         int           // PEER_CHUNK (16384): bytes per write
	RateBps       int64         // PEER_RATE_BPS (0 = uncapped)
	Events        int           // PEER_EVENTS (0)
	EventKind     string        // PEER_EVENT_KIND: progress | reachability
	EventInterval time.Duration // PEER_EVENT_INTERVAL_MS (5)
	GateStdin     bool          // PEER_GATE=stdin: output and events wait for the first stdin byte
	StartDelay    time.Duration // PEER_START_DELAY_MS (0)
	Hold          time.Duration // PEER_HOLD_MS (0; -1 = until stopped)
	HoldForever   bool
	ExitCode      int // PEER_EXIT_CODE (0)
}

// ParsePeerWorkload reads the PEER_* keys from environ (KEY=VALUE
// entries); nil when none is set. PEER_BURST (a Node event-loop setting) is
// accepted and has no effect here: writes are never held back.
func ParsePeerWorkload(environ []string) (*PeerWorkload, error) {
	vals := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "PEER_") {
			vals[k] = strings.TrimSpace(v)
		}
	}
	if len(vals) == 0 {
		return nil, nil
	}
	var errs []string
	num := func(key string, def, lo, hi int64) int64 {
		v, ok := vals[key]
		if !ok || v == "" {
			return def
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < lo || n > hi {
			errs = append(errs, fmt.Sprintf("%s must be an integer in %d..%d, got %q", key, lo, hi, v))
			return def
		}
		return n
	}
	oneOf := func(key, def string, allowed ...string) string {
		v, ok := vals[key]
		if !ok || v == "" {
			return def
		}
		for _, a := range allowed {
			if v == a {
				return v
			}
		}
		errs = append(errs, fmt.Sprintf("%s must be one of %s, got %q", key, strings.Join(allowed, "|"), v))
		return def
	}
	p := &PeerWorkload{
		OutputBytes:   num("PEER_OUTPUT_BYTES", 65536, 0, 1<<53),
		Chunk:         int(num("PEER_CHUNK", 16384, 1, 4<<20)),
		RateBps:       num("PEER_RATE_BPS", 0, 0, 1<<53),
		Events:        int(num("PEER_EVENTS", 0, 0, 10_000_000)),
		EventKind:     oneOf("PEER_EVENT_KIND", "progress", "progress", "reachability"),
		EventInterval: time.Duration(num("PEER_EVENT_INTERVAL_MS", 5, 0, 60_000)) * time.Millisecond,
		GateStdin:     oneOf("PEER_GATE", "none", "none", "stdin") == "stdin",
		StartDelay:    time.Duration(num("PEER_START_DELAY_MS", 0, 0, 600_000)) * time.Millisecond,
		ExitCode:      int(num("PEER_EXIT_CODE", 0, 0, 255)),
	}
	num("PEER_BURST", 1, 1, 1024)
	if hold := num("PEER_HOLD_MS", 0, -1, 3_600_000); hold < 0 {
		p.HoldForever = true
	} else {
		p.Hold = time.Duration(hold) * time.Millisecond
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return p, nil
}

// peerStdin replaces the line echo for a peer workload: stdin is read raw
// (a terminal is switched out of canonical mode, its own echo and output
// processing, as the gate byte comes with no newline and the peer's
// workload writes bytes as they are: no \r before each \n), every byte is
// echoed to stdout as it is, and the first one opens the gate.
// Its caller has made the terminal raw first (rawTerminal), before the
// banner, so a gate byte sent once the banner is seen is never held for a
// newline.
func (k *kernel) peerStdin(stdin io.Reader) {
	buf := make([]byte, 4096)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			_, _ = k.stdout.Write(buf[:n]) // the echo comes before the output it lets out
			k.openGate()
		}
		if err != nil {
			return
		}
	}
}

// rawTerminal switches a terminal stdin out of canonical mode, echo and
// output processing; anything else is left alone.
func rawTerminal(stdin io.Reader) {
	f, ok := stdin.(fder)
	if !ok {
		return
	}
	if t, err := unix.IoctlGetTermios(int(f.Fd()), ioctlReadTermios); err == nil {
		t.Lflag &^= unix.ICANON | unix.ECHO
		t.Oflag &^= unix.OPOST
		t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
		_ = unix.IoctlSetTermios(int(f.Fd()), ioctlWriteTermios, t)
	}
}

func (k *kernel) openGate() { k.gateOnce.Do(func() { close(k.gate) }) }

// peerGeneration runs the peer workload of a started generation: after the
// gate, the output and the events at once, then the hold. It reports how
// the generation ended.
func (k *kernel) peerGeneration(ctx context.Context) genEnd {
	p := k.peer
	if p.GateStdin {
		select {
		case <-k.gate:
		case <-ctx.Done():
			return genEnd{kind: endSignal}
		case <-k.changes:
			return genEnd{kind: endChange}
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { k.peerOutput(ctx) })
	wg.Go(func() { k.peerEvents(ctx) })
	wg.Wait()
	if ctx.Err() != nil {
		return genEnd{kind: endSignal}
	}
	var hold <-chan time.Time
	switch {
	case p.HoldForever:
	case p.Hold > 0:
		t := time.NewTimer(p.Hold)
		defer t.Stop()
		hold = t.C
	default:
		return genEnd{kind: endExited, code: p.ExitCode}
	}
	select {
	case <-ctx.Done():
		return genEnd{kind: endSignal}
	case <-k.changes:
		return genEnd{kind: endChange}
	case <-hold:
		return genEnd{kind: endExited, code: p.ExitCode}
	}
}

// peerOutput writes OutputBytes of the pattern in Chunk-byte writes, at
// most RateBps bytes a second when capped.
func (k *kernel) peerOutput(ctx context.Context) {
	p := k.peer
	chunk := make([]byte, p.Chunk)
	for i := range chunk {
		chunk[i] = patternLine[i%len(patternLine)]
	}
	start := time.Now()
	var sent int64
	for sent < p.OutputBytes && ctx.Err() == nil {
		c := chunk
		if rest := p.OutputBytes - sent; int64(len(c)) > rest {
			c = c[:rest]
		}
		if _, err := k.stdout.Write(c); err != nil {
			k.log.Warn("write output", "err", err)
			return
		}
		sent += int64(len(c))
		if p.RateBps > 0 {
			due := start.Add(time.Duration(float64(sent) / float64(p.RateBps) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
		}
	}
}

// peerEvents emits Events debug frames, EventInterval apart.
func (k *kernel) peerEvents(ctx context.Context) {
	p := k.peer
	states := [2]string{"checking", "reachable"}
	for i := range p.Events {
		if ctx.Err() != nil {
			return
		}
		if p.EventKind == "reachability" {
			k.hub.Event(EventPeerReachability, map[string]any{"port": 8080 + i%16, "state": states[i%2]})
		} else {
			k.hub.Event(EventPeerProgress, map[string]string{"message": strconv.FormatInt(time.Now().UnixNano(), 10)})
		}
		if p.EventInterval > 0 && i < p.Events-1 {
			t := time.NewTimer(p.EventInterval)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
}
