package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// tailPatience bounds how long a read waits for a bus that does not answer
// (a JetStream cluster electing a stream leader takes a few seconds).
const tailPatience = 20 * time.Second

// attemptTimeout bounds one attempt of a retried request.
const attemptTimeout = 2 * time.Second

// Transient reports whether err is the bus not answering for now (no
// responder, a timed-out request, JetStream temporarily unavailable) rather
// than an answer: such a request may be retried.
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected):
		return true
	case errors.As(err, &apiErr):
		return apiErr.Code == 503 // JetStream (or the stream) temporarily unavailable
	}
	return false
}

// Retry runs fn, each attempt bounded by attemptTimeout, until it succeeds,
// fails with an error that is not Transient, ctx ends or patience passes;
// it returns fn's last error.
func Retry(ctx context.Context, patience time.Duration, fn func(context.Context) error) error {
	deadline := time.Now().Add(patience)
	wait := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := fn(actx)
		cancel()
		if err == nil || !Transient(err) || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// ObjectTimeout bounds one object-store read or write when the caller set
// no deadline. nats.go bounds a whole object read or write by its 5 s
// default timeout otherwise: a large object on a loaded server (an 8 MiB
// checkpoint blob under the race detector) failed with "nats: timeout" and
// "timeout waiting for ack".
const ObjectTimeout = 2 * time.Minute

// ObjectContext is ctx, bounded by ObjectTimeout when it has no deadline.
func ObjectContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, ObjectTimeout)
}
