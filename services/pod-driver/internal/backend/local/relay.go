package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
)

// relay carries one app process's debug wire to the sink (contract 10.4):
// it reads GET /events of the kernel's inspection server, reconnecting
// after every error or end of stream, and delivers each frame once.
type relay struct {
	app    string
	url    string
	client *http.Client
	retry  time.Duration
	sink   backend.Sink
	log    *slog.Logger
	seen   dedup
}

func newRelay(app string, port int, client *http.Client, retry time.Duration, sink backend.Sink, log *slog.Logger) *relay {
	return &relay{
		app:    app,
		url:    "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/events",
		client: client,
		retry:  retry,
		sink:   sink,
		log:    log,
	}
}

// run relays until ctx ends, or until exited is closed and the current
// stream has ended (so the kernel's last frames still arrive).
func (r *relay) run(ctx context.Context, exited <-chan struct{}) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-exited:
			return
		case <-t.C:
		}
		err := r.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		r.log.Debug("debug relay disconnected", "err", err)
		t.Reset(r.retry)
	}
}

// stream reads one /events connection to its end.
func (r *relay) stream(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return fmt.Errorf("build events request: %w", err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("get events: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // a read stream; nothing to flush
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("get events: status %s", resp.Status)
	}
	filter := r.seen.begin()
	sse := newSSEReader(resp.Body)
	for {
		frame, ts, err := sse.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("events stream ended")
			}
			return fmt.Errorf("read events: %w", err)
		}
		if filter.admit(frame, ts) {
			r.sink.Debug(r.app, frame)
		}
	}
}
