package kernelwire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
)

// DefaultRelayRetry is the longest pause between relay connection
// attempts (contract 10.4).
const DefaultRelayRetry = 500 * time.Millisecond

// relayFirstRetry is the first pause after a failed attempt; it doubles
// per consecutive failure up to Retry. A kernel's inspection server
// usually comes up tens of milliseconds after the runner starts looking
// for it, and a flat 500 ms pause put up to half a second between the
// kernel's first frame and the editor (19 item 34: not a fixed delay).
const relayFirstRetry = 20 * time.Millisecond

// DebugSink receives relayed frames. backend.Sink satisfies it.
type DebugSink interface {
	Debug(app string, frame json.RawMessage)
}

// RelayOptions configures Relay. Zero fields get defaults.
type RelayOptions struct {
	// Client performs the GET /events requests; nil uses a client without
	// keep-alive.
	Client *http.Client
	// Retry is the longest pause after a connection ends or fails
	// (DefaultRelayRetry when zero); pauses start at 20 ms and double.
	Retry time.Duration
	// Exited, when not nil, ends the relay once it is closed and the
	// current stream has ended, so a kernel's last frames still arrive.
	Exited <-chan struct{}
	// Logger receives disconnects at debug level; nil discards them.
	Logger *slog.Logger
	// After, when set, drops frames not stamped after it: a relay that
	// re-opens an inspection server someone else already relayed (a driver
	// adopting a pod) does not deliver the server's replayed history.
	After time.Time
}

var defaultClient = &http.Client{Transport: &http.Transport{
	DisableKeepAlives:     true,
	ResponseHeaderTimeout: 10 * time.Second,
}}

// Relay carries one kernel's debug wire to sink (contract 10.4): it reads
// GET url (http://<host>:<inspect port>/events), reconnecting after every
// error or end of stream, and delivers each frame once for the life of
// this call: frames a reconnect replays are dropped. A new inspection
// server (a restarted kernel) needs a new Relay call. Relay blocks until
// ctx ends or opts.Exited is closed and the current stream has ended.
func Relay(ctx context.Context, url, app string, sink DebugSink, opts RelayOptions) {
	if opts.Client == nil {
		opts.Client = defaultClient
	}
	if opts.Retry <= 0 {
		opts.Retry = DefaultRelayRetry
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var seen dedup
	wait := min(relayFirstRetry, opts.Retry)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-opts.Exited:
			return
		case <-t.C:
		}
		connected, err := stream(ctx, url, app, sink, opts, &seen)
		if ctx.Err() != nil {
			return
		}
		opts.Logger.Debug("debug relay disconnected", "app", app, "err", err)
		if connected {
			wait = min(relayFirstRetry, opts.Retry) // a restarted kernel: look again soon
		}
		t.Reset(wait)
		wait = min(2*wait, opts.Retry)
	}
}

// stream reads one /events connection to its end; connected reports that
// the server answered.
func stream(ctx context.Context, url, app string, sink DebugSink, opts RelayOptions, seen *dedup) (connected bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, fmt.Errorf("build events request: %w", err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := opts.Client.Do(req)
	if err != nil {
		return false, fmt.Errorf("get events: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // a read stream; nothing to flush
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return false, fmt.Errorf("get events: status %s", resp.Status)
	}
	filter := seen.begin()
	sse := newSSEReader(resp.Body)
	for {
		frame, ts, err := sse.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return true, errors.New("events stream ended")
			}
			return true, fmt.Errorf("read events: %w", err)
		}
		if !opts.After.IsZero() && !ts.After(opts.After) {
			continue
		}
		if filter.admit(frame, ts) {
			sink.Debug(app, frame)
		}
	}
}
